"""Settings checks of the family adapters: what they refuse, with the reason and the fix."""

from __future__ import annotations

from ..settings import KEYS_VALUES, ToMASettings


def require_block_scope(settings: ToMASettings, family: str) -> None:
    """ValueError unless `settings` asks for what every DiT adapter but Flux honours: scope "block"
    or "keys_values" (machinery/keys_values.py) and no proportional attention (their attention takes
    no bias through the block arguments)."""
    if settings.scope not in ("block", KEYS_VALUES):
        raise ValueError(
            f"scope={settings.scope!r} is available for Flux-family and UNet models only; {family} merges "
            f"whole blocks (scope 'block') or its self-attention's keys and values (scope '{KEYS_VALUES}')"
        )
    refuse_proportional_attention(settings, family)


def refuse_proportional_attention(settings: ToMASettings, family: str) -> None:
    """ValueError when `settings` asks for proportional attention, which only the Flux family's
    attention takes (an additive mask through its block arguments)."""
    if settings.proportional_attention:
        raise ValueError(
            f"proportional_attention=True is available for Flux-family models only ({family} blocks "
            "take no attention bias); turn it off"
        )
