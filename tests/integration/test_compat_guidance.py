"""ToMA with ComfyUI's guidance and model-patch nodes, LoRA weight patches and Redux-style text
tokens, on tiny random-weight Flux and SDXL on CPU.

Nodes are called as they exist in ComfyUI 0.3.64: V3 nodes through ``execute``, V1 nodes through
their ``FUNCTION``. Each test checks both that the combination runs and that both patches still
act (outputs differ from each patch alone, token counts measured).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import (  # noqa: E402
    CLIP_TEXT,
    FLUX_TEXT,
    RUNTIME_LOGGER,
    Toma,
    record_attention,
    run_records,
)

from harness.metrics import relative_error as rel  # noqa: E402
from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402


@pytest.fixture()
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    return caplog


def both_orders(toma: Toma, model: Any, other: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(other node -> ToMA, ToMA -> other node)."""
    return toma.patch(other(model), **kwargs), other(toma.patch(model, **kwargs))


# --- Skip Layer Guidance (Flux) -------------------------------------------------------------


def slg_dit(model: Any) -> Any:
    from comfy_extras.nodes_slg import SkipLayerGuidanceDiT

    return SkipLayerGuidanceDiT.execute(model, 3.0, 0.0, 1.0, double_layers="1", single_layers="0").result[0]


def slg_simple(model: Any) -> Any:
    from comfy_extras.nodes_slg import SkipLayerGuidanceDiTSimple

    return SkipLayerGuidanceDiTSimple.execute(model, 0.0, 1.0, double_layers="1", single_layers="0").result[0]


def slg_sd3(model: Any) -> Any:
    from comfy_extras.nodes_sd3 import SkipLayerGuidanceSD3

    return SkipLayerGuidanceSD3.execute(model, "1", 3.0, 0.0, 1.0).result[0]


@pytest.mark.parametrize(
    "slg, extra_pass",
    [
        # SLG DiT: per step one cond+uncond call (B=2, 4 blocks) and one SLG cond pass (B=1)
        # without double 1 and single 0.
        (slg_dit, {(2, 4), (1, 2)}),
        # Simple: cond alone (B=1, 4 blocks) and uncond with the layers skipped (B=1, 2 blocks).
        (slg_simple, {(1, 4), (1, 2)}),
        # SD3 style: double layers only, extra cond pass (B=1) without double 1.
        (slg_sd3, {(2, 4), (1, 3)}),
    ],
    ids=["SkipLayerGuidanceDiT", "SkipLayerGuidanceDiTSimple", "SkipLayerGuidanceSD3"],
)
def test_skip_layer_guidance(slg: Any, extra_pass: set, tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """Skipped layers are not run (so not merged) in the SLG pass; every other block is merged at
    each batch composition; both orders are bit-identical; SLG and ToMA both act."""
    first, last = both_orders(toma, tiny_flux, slg)
    recorded, calls = record_attention(first)
    out = tiny.sample(recorded, FLUX_LATENT, steps=2)
    assert {length for _, length, _ in calls} == {FLUX_TEXT + 32}  # every attention ran merged
    per_call: dict[int, int] = {}
    for batch, _, _ in calls:
        per_call[batch] = per_call.get(batch, 0) + 1
    if extra_pass == {(1, 4), (1, 2)}:
        assert per_call == {1: 2 * (4 + 2)}
    else:
        assert {(b, n // 2) for b, n in per_call.items()} == extra_pass  # 2 steps
    run = run_records(logs)[-1]
    assert run.block_runs_merged == len(calls) and run.unmerged_calls == run.unmerged_blocks == {}
    assert run.plans_built == 4  # a plan per batch composition and step: never reused across them
    assert torch.equal(tiny.sample(last, FLUX_LATENT, steps=2), out)
    assert rel(out, tiny.sample(toma.patch(tiny_flux), FLUX_LATENT, steps=2)) > 1e-3
    assert rel(out, tiny.sample(slg(tiny_flux), FLUX_LATENT, steps=2)) > 1e-3


# --- PAG and SAG (SDXL) ---------------------------------------------------------------------


def pag(model: Any) -> Any:
    from comfy_extras.nodes_pag import PerturbedAttentionGuidance

    return PerturbedAttentionGuidance.execute(model, 3.0).result[0]


def sag(model: Any) -> Any:
    from comfy_extras.nodes_sag import SelfAttentionGuidance

    return SelfAttentionGuidance.execute(model, 0.5, 2.0).result[0]


def test_pag(tiny_sdxl: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """PAG's pass replaces the middle block's attn1: both middle blocks run on all tokens in that
    pass (counted), everything else merges; both orders bit-identical; both act."""
    first, last = both_orders(toma, tiny_sdxl, pag)
    recorded, calls = record_attention(first)
    out = tiny.sample(recorded, UNET_LATENT, steps=2)
    run = run_records(logs)[-1]
    assert run.unmerged_blocks.get("attn1/attn2 replace patch present", 0) == 2 * 2  # 2 steps x 2 depths
    assert run.block_runs_merged == 2 * 17 + 2 * 15  # cfg pass: all 17; PAG pass: all but middle
    assert (1, 16, CLIP_TEXT) in calls  # PAG pass: middle attn2 on all 16 tokens of the 4x4 level
    assert torch.equal(tiny.sample(last, UNET_LATENT, steps=2), out)
    assert rel(out, tiny.sample(toma.patch(tiny_sdxl), UNET_LATENT, steps=2)) > 1e-3
    assert rel(out, tiny.sample(pag(tiny_sdxl), UNET_LATENT, steps=2)) > 1e-3


@pytest.mark.parametrize("shape", [(1, 4, 16, 16), (1, 4, 18, 26), (1, 4, 22, 30), (1, 4, 10, 14), (1, 4, 14, 38)])
def test_sag_any_token_count(shape: tuple[int, ...], tiny_sdxl: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """SAG factors its attention map's token count into a grid: ToMA leaves the block it records
    (middle, depth 0) unmerged, so SAG sees the real h*w tokens at every latent size."""
    import comfy_extras.nodes_sag as nodes_sag

    maps: list[int] = []
    original = nodes_sag.create_blur_map

    def recording(x0: torch.Tensor, attn: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        maps.append(attn.shape[-1])
        return original(x0, attn, *args, **kwargs)

    monkeypatch.setattr(nodes_sag, "create_blur_map", recording)
    h, w = shape[2], shape[3]
    middle = (-(-(-(-h // 2)) // 2)) * (-(-(-(-w // 2)) // 2))  # two stride-2 downsamples, rounding up
    first, last = both_orders(toma, tiny_sdxl, sag)
    out = tiny.sample(first, shape, steps=2)
    assert maps and set(maps) == {middle}
    run = run_records(logs)[-1]
    assert run.unmerged_blocks.get("attn1/attn2 replace patch present", 0) > 0 and run.block_runs_merged > 0
    assert torch.isfinite(out).all()
    assert torch.equal(tiny.sample(last, shape, steps=2), out)
    assert rel(out, tiny.sample(toma.patch(tiny_sdxl), shape, steps=2)) > 1e-4


# --- FreeU (SDXL) ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["FreeU", "FreeU_V2"])
def test_freeu(version: str, tiny_sdxl: Any, tiny: Any, toma: Toma) -> None:
    """FreeU scales skip/backbone features by channel count (output_block_patch): order-free."""
    import comfy_extras.nodes_freelunch as freelunch

    node = getattr(freelunch, version)()

    def freeu(model: Any) -> Any:
        return getattr(node, node.FUNCTION)(model, 1.3, 1.4, 0.9, 0.2)[0]

    first, last = both_orders(toma, tiny_sdxl, freeu)
    out = tiny.sample(first, UNET_LATENT, steps=2)
    assert torch.equal(tiny.sample(last, UNET_LATENT, steps=2), out)
    assert rel(out, tiny.sample(toma.patch(tiny_sdxl), UNET_LATENT, steps=2)) > 1e-3
    assert rel(out, tiny.sample(freeu(tiny_sdxl), UNET_LATENT, steps=2)) > 1e-3


# --- PerpNeg (three conds per step) -----------------------------------------------------------


@pytest.mark.parametrize("family", ["flux", "sdxl"])
def test_perpneg_guider(family: str, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture, request: pytest.FixtureRequest) -> None:
    """PerpNegGuider batches positive, negative and empty conds (B=3): merged at that composition."""
    import comfy.samplers
    from comfy_extras.nodes_perpneg import PerpNegGuider

    model = request.getfixturevalue(f"tiny_{family}")
    latent = FLUX_LATENT if family == "flux" else UNET_LATENT
    pos, neg, empty = (tiny.make_conditioning(model, seed) for seed in (1234, 1235, 1236))

    def run(m: Any) -> torch.Tensor:
        guider = PerpNegGuider.execute(m, pos, neg, empty, 3.0, 1.0).result[0]
        sigmas = comfy.samplers.calculate_sigmas(m.get_model_object("model_sampling"), "simple", 2)
        noise = torch.randn(latent, generator=torch.Generator().manual_seed(0))
        sampler = comfy.samplers.sampler_object("euler")
        return guider.sample(noise, torch.zeros(latent), sampler, sigmas, seed=0, disable_pbar=True)

    recorded, calls = record_attention(toma.patch(model))
    out = run(recorded)
    record = run_records(logs)[-1]
    assert {batch for batch, _, _ in calls} == {3}
    assert (record.steps_merged, record.total_steps, record.calls_merged, record.total_calls) == (2, 2, 2, 2)
    assert record.unmerged_calls == record.unmerged_blocks == {} and record.block_runs_merged > 0
    assert rel(out, run(model)) > 1e-3


# --- LoRA weight patches ----------------------------------------------------------------------


LORA_KEYS = {
    "flux": ["diffusion_model.double_blocks.0.img_attn.qkv", "diffusion_model.single_blocks.1.linear1"],
    "sdxl": ["diffusion_model.input_blocks.7.1.transformer_blocks.0.attn1.to_q", "diffusion_model.output_blocks.1.1.transformer_blocks.1.ff.net.2"],
}
"""Layers the test LoRA patches (ComfyUI's generic LoRA key format: `<layer>.lora_up.weight`)."""


def make_lora(model: Any, family: str) -> dict[str, torch.Tensor]:
    """A random rank-4 LoRA state dict for LORA_KEYS[family]."""
    gen = torch.Generator().manual_seed(3)
    state = model.model.state_dict()
    lora = {}
    for layer in LORA_KEYS[family]:
        out_features, in_features = state[f"{layer}.weight"].shape[:2]
        lora[f"{layer}.lora_up.weight"] = torch.randn(out_features, 4, generator=gen)
        lora[f"{layer}.lora_down.weight"] = torch.randn(4, in_features, generator=gen) * 0.2
    return lora


@pytest.mark.parametrize("family", ["flux", "sdxl"])
def test_lora_both_orders_bit_identical(family: str, tiny: Any, toma: Toma, request: pytest.FixtureRequest) -> None:
    """A LoRA loaded the way LoraLoader loads it (comfy.sd.load_lora_for_models: weight patches on
    a clone), before or after ToMA: bit-identical results, the LoRA acts, the base is untouched."""
    import comfy.sd

    model = request.getfixturevalue(f"tiny_{family}")
    latent = FLUX_LATENT if family == "flux" else UNET_LATENT
    state = make_lora(model, family)

    def lora(m: Any) -> Any:
        patched, _ = comfy.sd.load_lora_for_models(m, None, state, 1.0, 0.0)
        assert len(patched.patches) == len(LORA_KEYS[family])
        return patched

    baseline = tiny.sample(model, latent, steps=2)
    first = tiny.sample(toma.patch(lora(model)), latent, steps=2)
    last = tiny.sample(lora(toma.patch(model)), latent, steps=2)
    assert torch.equal(first, last)
    assert rel(first, tiny.sample(toma.patch(model), latent, steps=2)) > 1e-3
    assert rel(first, tiny.sample(lora(model), latent, steps=2)) > 1e-3
    assert torch.equal(tiny.sample(model, latent, steps=2), baseline)


# --- Redux-style extra text tokens ------------------------------------------------------------


class StyleModelStandIn:
    """Stands in for a Redux STYLE_MODEL: `get_cond` returns fixed random image-derived tokens."""

    def __init__(self, tokens: int, dim: int) -> None:
        self.tokens = torch.randn((1, tokens, dim), generator=torch.Generator().manual_seed(21))

    def get_cond(self, clip_vision_output: Any) -> torch.Tensor:
        return self.tokens.clone()


@pytest.mark.parametrize("strength_type", ["multiply", "attn_bias"])
def test_redux_style_tokens(strength_type: str, tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """ComfyUI's StyleModelApply appends 16 tokens to the text; with attn_bias it also builds an
    attention mask. ToMA reads T from the block args and merges the mask with the tokens."""
    import nodes as comfy_nodes

    redux = StyleModelStandIn(16, 64)
    apply = comfy_nodes.StyleModelApply()
    plain_pos, neg = tiny.make_conditioning(tiny_flux, 1234), tiny.make_conditioning(tiny_flux, 1235)

    def sample(model: Any, strength: float, cfg: float = 2.0) -> tuple[torch.Tensor, list]:
        (pos,) = getattr(apply, apply.FUNCTION)(plain_pos, redux, None, strength, strength_type)
        assert ("attention_mask" in pos[0][1]) == (strength_type == "attn_bias")
        recorded, calls = record_attention(model)
        return tiny.sample(recorded, FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=cfg), calls

    out, calls = sample(toma.patch(tiny_flux), 0.5)
    run = run_records(logs)[-1]
    assert {length for _, length, _ in calls} == {FLUX_TEXT + 16 + 32, FLUX_TEXT + 32}  # cond with Redux, uncond
    assert run.unmerged_calls == run.unmerged_blocks == {} and run.block_runs_merged == len(calls)
    without_redux = tiny.sample(toma.patch(tiny_flux), FLUX_LATENT, positive=plain_pos, negative=neg, steps=2)
    assert rel(out, without_redux) > 1e-3
    assert rel(out, sample(tiny_flux, 0.5)[0]) > 1e-3
    if strength_type == "attn_bias":
        # strength 1e-6 -> bias log(1e-6): the Redux tokens are all but hidden, so the result must
        # be (nearly) the one without them, which holds only if the mask's image rows and columns
        # were merged together with the image tokens. (Strength 0, a -inf bias, gives NaN in
        # ComfyUI itself: measured without ToMA.) cfg 1: one B=1 call per step in both runs, and
        # one plan for both steps (every=2), built at step 0 from the first block's input, which
        # does not depend on the text: the hidden Redux tokens' ~1e-6 effect on later steps cannot
        # flip a near-tie of the random model's merge selection.
        hidden, _ = sample(toma.patch(tiny_flux, every=2), 1e-6, cfg=1.0)
        reference = tiny.sample(toma.patch(tiny_flux, every=2), FLUX_LATENT, positive=plain_pos, negative=neg, steps=2, cfg=1.0)
        assert rel(hidden, reference) < 1e-4
        assert rel(sample(toma.patch(tiny_flux, every=2), 0.5, cfg=1.0)[0], reference) > 1e-3
