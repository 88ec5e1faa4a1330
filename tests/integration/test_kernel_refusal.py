"""A kernel that refuses ToMA's merged call (another pack's override that raises, as KJNodes' calls
sage with no try/except) never fails the prompt: the block's attention is retried in a form at the
head size the model handed it, else the block runs unmerged; one warning per process, the run
line names the kernel and form, or the unmerged reason (nodes/machinery/keys_values.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import RUNTIME_LOGGER, run_records  # noqa: E402

from harness.pack import pack_module  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402
from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402

KV = {"scope": "keys_values", "tile_size": 4}
KEYS_VALUES_LOGGER = "comfyui_toma_pack.nodes.machinery.keys_values"


def with_override(model: Any, refuses: Any, hands_on: bool) -> Any:
    """A clone whose override runs ComfyUI's function unless refuses(q, k, heads, kwargs), where it
    raises as a kernel does; hands_on: it says it hands its calls on (so ToMA reads ComfyUI's own
    CPU kernel and offers it the log-mass channel's wider head)."""

    def override(func, q, k, v, heads, *args, **kwargs):
        if refuses(q, k, heads, kwargs):
            raise ValueError(f"Unsupported head_dim: {q.shape[-1]}")
        return func(q, k, v, heads, *args, **kwargs)

    override.hands_on = hands_on
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    return clone


def head(q: Any, heads: int, kwargs: dict) -> int:
    return q.shape[-1] if kwargs.get("skip_reshape") else q.shape[-1] // heads


@pytest.fixture()
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pack_module("nodes.machinery.keys_values"), "_REFUSALS", set())


@pytest.mark.parametrize("name", ["tiny_flux", "tiny_sdxl"])
def test_a_wider_head_refused_runs_at_the_models_head(
    name: str, tiny: Any, toma: Any, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, fresh_warnings: None,
) -> None:
    """An override that says it hands on to ComfyUI's CPU attention (the channel's kernel) but raises
    above the model's head size, as sage 2 does above 128: every block still merges, in the form at
    the model's head (plain beside Flux's text keys, equal_mass over the UNet's image keys), with
    one warning naming the refusal."""
    model = request.getfixturevalue(name)
    native = 16
    chosen = with_override(model, lambda q, k, heads, kw: head(q, heads, kw) > native, hands_on=True)
    caplog.set_level(logging.INFO)
    out = tiny.sample(toma.patch(chosen, **KV), FLUX_LATENT if name == "tiny_flux" else UNET_LATENT, steps=2, cfg=1.0)
    run = run_records(caplog)[-1]
    assert torch.isfinite(out).all() and run.block_runs_merged > 0 and not run.unmerged_blocks, run
    form = "plain" if name == "tiny_flux" else "equal_mass"
    assert run.attention and all(what.endswith(f" as {form}") for what in run.attention), run
    warned = [r.getMessage() for r in caplog.records if r.name == KEYS_VALUES_LOGGER and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "Unsupported head_dim" in warned[0] and form in warned[0], warned
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_refused_merged_call_runs_the_block_unmerged(tiny: Any, toma: Any, tiny_flux: Any, caplog: pytest.LogCaptureFixture, fresh_warnings: None) -> None:
    """An unknown override that raises on any call with fewer keys than queries (it refuses merged
    keys at every head size): each block runs again unmerged, the prompt finishes with the output
    of the model without ToMA, and the run line counts the blocks under the refusal's reason."""
    keys_values = pack_module("nodes.machinery.keys_values")
    def refuses(q: Any, k: Any, heads: int, kwargs: dict) -> bool:
        axis = 2 if kwargs.get("skip_reshape") else 1
        return k.shape[axis] < q.shape[axis]

    chosen = with_override(tiny_flux, refuses, hands_on=False)
    plain = tiny.sample(chosen, FLUX_LATENT, steps=2, cfg=1.0)
    caplog.set_level(logging.INFO)
    out = tiny.sample(toma.patch(chosen, **KV), FLUX_LATENT, steps=2, cfg=1.0)
    run = run_records(caplog)[-1]
    assert run.block_runs_merged == 0 and run.unmerged_blocks.get(keys_values.REFUSED.reason, 0) > 0, run
    assert rel(out, plain) < 1e-6
    warned = [r.getMessage() for r in caplog.records if r.name == KEYS_VALUES_LOGGER and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "unmerged" in warned[0], warned
