"""ToMA for UNet models: SDXL, SD1.x, SD2.x and their fine-tunes.

ComfyUI has no patch point around a whole `BasicTransformerBlock` (attn1 + attn2 + FF), so scope
"block" object-patches the `forward` of each selected block through the ModelPatcher
(`add_object_patch`: applied when the model loads, restored when another clone loads; other
clones stay bit-identical). For a merged call the replacement does (ToMA paper, §3.3):

    x = block input (B, N, C), N = h * w from transformer_options["activations_shape"]
    x_m = plan.merge(x)                                   (B, D, C)
    y_m = BasicTransformerBlock.forward(block, x_m, ...)  the class's own forward, so other
                                                          packs' attn1/attn2 patches still run
    y = plan.unmerge_residual(x, x_m, y_m)                (B, N, C) = x + U(y_m - x_m)

UNet blocks carry no positional embedding, so merged tokens need nothing else. The plan of a
resolution level is built by the first merged block at that level in a forward and reused by
every later block at the same h x w (the per-call plan cache of runtime.CallContext; one plan
per level per selection epoch). Destinations are per sample (cond and uncond differ).

Scope "keys_values" patches the same forwards but runs the block on its own N tokens: only attn1's
keys and values are merged with the level's plan (machinery/keys_values.py; attn1 is the block's
first attention call, its self-attention over the N tokens), nothing is unmerged.

Scope "attention" (unet_attention.py) merges only inside the attention calls; the FF and norms
stay at N tokens, so the speed-up is small where the FF dominates (SDXL's 1/4 level). Where the
blocks are: unet_sites.py.

All per-step decisions are made eagerly by wrappers.apply_model_wrapper; the hooks read the
CallContext and only add tensor work (so torch.compile sees no per-step Python state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..contract import CallGeometry, Unmerged
from ..machinery.geometry import text_length
from ..machinery.hooks import TOMA_MARK, install_forward_patches
from ..machinery.keys_values import Keys, run_with_merged_keys
from ..machinery.runner import run_hook
from ..machinery.scope import refuse_proportional_attention
from ..run.runtime import CallContext
from ..settings import KEYS_VALUES, ToMASettings
from .unet_attention import (
    REPLACE_KEY,
    install_attention_patches,
    remove_own_attention_patches,
)
from .unet_blocks import UNetBlockSpec, parse_unet_blocks
from .unet_sites import (
    PLAN_SLOT,
    TransformerSite,
    describe_blocks,
    find_sites,
    level_plan,
    level_veto,
)

__all__ = ["REPLACE_KEY", "TOMA_MARK", "apply", "find_sites", "make_block_forward"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UNetAdapter:
    """The runtime's view of a patched UNet (a contract.FamilyAdapter)."""

    family: str
    blocks: str
    num_blocks: int

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Latent grid H x W of x (B, C, H, W) and T of context (B, T, C_txt). Each transformer
        level has its own smaller grid, read per block from activations_shape."""
        text_len = text_length(context)
        if x.ndim != 4:
            return CallGeometry(1, 1, text_len, 0, f"latent of shape {tuple(x.shape)} is not (B, C, H, W)")
        return CallGeometry(int(x.shape[-2]), int(x.shape[-1]), text_len)


def apply(model, settings: ToMASettings) -> UNetAdapter:
    """Install ToMA's hooks on `model` (a ModelPatcher clone of a UNet model); return the adapter.

    Raises ValueError for a bad `blocks` string, a video UNet, or a selection with no block.
    Earlier ToMA patches (either scope) are replaced, restoring what they wrapped.
    """
    refuse_proportional_attention(settings, "UNet")
    unet = model.get_model_object("diffusion_model")
    spec = parse_unet_blocks(settings.blocks)
    sites = find_sites(unet)
    selected = [s for s in sites if spec.selects(s.block, s.downsample)]
    if not selected:
        raise ValueError(
            f"blocks={settings.blocks!r} selects none of this UNet's transformer blocks; it has "
            f"{describe_blocks(sites)}"
        )
    by_path = {s.path: s for s in sites}
    whole = {s.path for s in selected} if settings.scope in ("block", KEYS_VALUES) else set()
    keys_values = settings.scope == KEYS_VALUES
    install_forward_patches(
        model, {s.path: s.path in whole for s in sites}, lambda path, foreign: make_block_forward(by_path[path], foreign, keys_values),
    )
    remove_own_attention_patches(model)
    if settings.scope == "attention":
        install_attention_patches(model, frozenset(s.block for s in selected))
    log.debug("ToMA UNet: %d of %d transformer blocks selected (%s)", len(selected), len(sites), spec.describe())
    return UNetAdapter("unet", _describe_selection(spec, selected), len(selected))


def _describe_selection(spec: UNetBlockSpec, selected: list[TransformerSite]) -> str:
    levels = sorted({s.downsample for s in selected})
    return f"{spec.describe()}: in {len({s.block for s in selected})} UNet blocks at 1/{',1/'.join(map(str, levels))}"


def make_block_forward(site: TransformerSite, foreign: Callable | None = None, keys_values: bool = False) -> Callable:
    """Scope "block": the object patch for one block's `forward`, (x (B, N, C), context,
    transformer_options) -> (B, N, C), running the whole BasicTransformerBlock on merged tokens;
    with `keys_values`, the block on its own tokens with attn1's keys and values merged.

    foreign: another pack's object patch already on this key; it runs on the merged tokens in
    place of the class's forward.
    """
    block = site.module

    def run(x: torch.Tensor, context: Any, options: dict) -> torch.Tensor:
        if foreign is not None:
            return foreign(x, context=context, transformer_options=options)
        return type(block).forward(block, x, context=context, transformer_options=options)

    def toma_forward(x: torch.Tensor, context: Any = None, transformer_options: dict = {}) -> torch.Tensor:  # noqa: B006 (ComfyUI's signature)
        def merged(ctx: CallContext) -> torch.Tensor | Unmerged:
            veto = level_veto(ctx, x, transformer_options, transformer_options.get("patches_replace"))
            if veto is not None:
                return veto
            plan = level_plan(ctx, x, transformer_options)
            if keys_values:
                keys = Keys(0, x.shape[1], balance=True)
                out = run_with_merged_keys(
                    lambda options: run(x, context, options), transformer_options, plan, keys, ctx.settings.key_mass, ctx.note_attention, ctx.kernel,
                )
            else:
                x_m = plan.merge(x)
                out = plan.unmerge_residual(x, x_m, run(x_m, context, transformer_options))
            if not isinstance(out, Unmerged):  # kept for the next call's plan (CallContext.note_output)
                ctx.note_output(PLAN_SLOT, *(int(n) for n in transformer_options["activations_shape"][-2:]), out)
            return out

        return run_hook({"transformer_options": transformer_options}, None, lambda: run(x, context, transformer_options), merged)

    return toma_forward
