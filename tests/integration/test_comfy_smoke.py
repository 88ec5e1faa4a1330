"""Smoke tests: the tiny ComfyUI models sample, and the host facts the ToMA patches rely on hold.

Everything here runs real ComfyUI code (``comfy.sample.sample``) on CPU and skips with a reason
when ComfyUI is not importable (see ``comfy_env.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402  (tiny_models imports only torch at load)

log = logging.getLogger(__name__)

CHANGED = 1e-3
"""Smallest relative L2 difference counted as 'the output changed'."""


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 difference of ``a`` from ``b``."""
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def identity_double(args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A Flux double-block replacement that skips the block."""
    return {"img": args["img"], "txt": args["txt"]}


def identity_single(args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A Flux single-block replacement that skips the block."""
    return {"img": args["img"]}


def passthrough(args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A Flux block replacement that runs the real block."""
    return extra["original_block"](args)


def test_sampling_is_finite_nonzero_and_seeded(any_tiny_model: tuple[Any, tuple[int, ...]], tiny: Any) -> None:
    """Each tiny model samples to a finite, non-zero latent that depends only on the seed."""
    model, shape = any_tiny_model
    out = tiny.sample(model, shape, seed=1)
    assert out.shape == shape
    assert torch.isfinite(out).all()
    assert out.abs().max() > 0 and out.std() > 0
    assert torch.equal(out, tiny.sample(model, shape, seed=1))
    assert rel_diff(tiny.sample(model, shape, seed=2), out) > CHANGED


@pytest.mark.parametrize("kind, index, replacement", [
    ("double_block", 0, identity_double),
    ("double_block", 1, identity_double),
    ("single_block", 0, identity_single),
    ("single_block", 1, identity_single),
])
def test_flux_output_depends_on_each_block(tiny_flux: Any, tiny: Any, kind: str, index: int, replacement: Any) -> None:
    """Skipping one Flux block changes the output; running it through the replace API does not;
    the unpatched model is unaffected afterwards."""
    baseline = tiny.sample(tiny_flux, FLUX_LATENT)
    skipped = tiny_flux.clone()
    skipped.set_model_patch_replace(replacement, "dit", kind, index)
    assert rel_diff(tiny.sample(skipped, FLUX_LATENT), baseline) > CHANGED
    same = tiny_flux.clone()
    same.set_model_patch_replace(passthrough, "dit", kind, index)
    assert torch.equal(tiny.sample(same, FLUX_LATENT), baseline)
    assert torch.equal(tiny.sample(tiny_flux, FLUX_LATENT), baseline)


@pytest.mark.parametrize("family", ["sdxl", "sd15"])
def test_unet_output_depends_on_transformer_blocks(request: pytest.FixtureRequest, tiny: Any, family: str) -> None:
    """Skipping a UNet BasicTransformerBlock (object patch on its forward) changes the output;
    a pass-through object patch does not; the unpatched model is unaffected afterwards."""
    model = request.getfixturevalue(f"tiny_{family}")
    path = tiny.transformer_block_paths(model)[0]
    block = model.get_model_object(path)
    baseline = tiny.sample(model, UNET_LATENT)

    skipped = model.clone()
    skipped.add_object_patch(f"{path}.forward", lambda x, context=None, transformer_options={}: x)
    assert rel_diff(tiny.sample(skipped, UNET_LATENT), baseline) > CHANGED

    def forward(x: torch.Tensor, context: Any = None, transformer_options: dict = {}) -> torch.Tensor:
        return type(block).forward(block, x, context=context, transformer_options=transformer_options)

    same = model.clone()
    same.add_object_patch(f"{path}.forward", forward)
    assert torch.equal(tiny.sample(same, UNET_LATENT), baseline)
    assert torch.equal(tiny.sample(model, UNET_LATENT), baseline)


@pytest.mark.parametrize("family, module_path, shape", [
    ("flux", "single_blocks.0", FLUX_LATENT),
    ("sdxl", "middle_block.1.transformer_blocks.0", UNET_LATENT),
])
def test_zeroing_block_weights_changes_output(tiny: Any, family: str, module_path: str, shape: tuple[int, ...]) -> None:
    """Zeroing one transformer block's weights (a fresh model, not the shared fixture) changes the output."""
    model = getattr(tiny, f"build_{family}")(seed=0)
    baseline = tiny.sample(model, shape)
    tiny.zero_weights(model.model.diffusion_model.get_submodule(module_path))
    assert rel_diff(tiny.sample(model, shape), baseline) > CHANGED


def record_block_args(model: Any, kind: str, index: int, calls: list[dict[str, Any]]) -> Any:
    """A clone of ``model`` whose Flux block ``(kind, index)`` logs its args into ``calls``."""

    def recorder(args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        before = args["img"].clone()
        out = extra["original_block"](args)
        opts = args["transformer_options"]
        calls.append({
            "keys": set(args),
            "img": tuple(args["img"].shape),
            "txt": tuple(args["txt"].shape) if "txt" in args else None,
            "pe": tuple(args["pe"].shape),
            "attn_mask": args["attn_mask"],
            "sigmas": opts["sigmas"].clone(),
            "sample_sigmas": opts["sample_sigmas"].clone(),
            "input_mutated": not torch.equal(args["img"], before),
            "returned_input": out["img"] is args["img"],
        })
        return out

    patched = model.clone()
    patched.set_model_patch_replace(recorder, "dit", kind, index)
    return patched


def test_flux_block_args_match_design(tiny_flux: Any, tiny: Any) -> None:
    """Flux block-replace args: shapes, pe layout [txt; img], sigmas, and the in-place blocks (single
    blocks always; double blocks' img on ComfyUI 0.33)."""
    text_len, n_img, steps = 40, (FLUX_LATENT[2] // 2) * (FLUX_LATENT[3] // 2), 3
    cond = [tiny.make_conditioning(tiny_flux, s, text_len=text_len) for s in (1, 2)]
    calls: dict[str, list[dict[str, Any]]] = {"double_block": [], "single_block": []}
    model = tiny_flux
    for kind in calls:
        model = record_block_args(model, kind, 0, calls[kind])
    tiny.sample(model, FLUX_LATENT, steps=steps, positive=cond[0], negative=cond[1])

    hidden, heads = 64, 4
    double, single = calls["double_block"], calls["single_block"]
    assert len(double) == len(single) >= steps
    for d, s in zip(double, single):
        batch = d["img"][0]
        assert d["keys"] == {"img", "txt", "vec", "pe", "attn_mask", "transformer_options"}
        assert d["img"] == (batch, n_img, hidden) and d["txt"] == (batch, text_len, hidden)
        assert d["pe"] == (batch, 1, text_len + n_img, hidden // heads // 2, 2, 2)
        assert d["attn_mask"] is None
        # ComfyUI 0.3.64's DoubleStreamBlock builds a new img (`img = img + ...`), 0.33's adds to it in
        # place (`img += ...`) and returns it: either way a block that writes its input returns it.
        assert d["input_mutated"] == d["returned_input"]
        assert s["keys"] == {"img", "vec", "pe", "attn_mask", "transformer_options"}
        assert s["img"] == (batch, text_len + n_img, hidden)
        assert s["input_mutated"] and s["returned_input"]  # SingleStreamBlock does `x += ...`
        # sigmas is per latent (B_latent,), not per model batch (cond and uncond share one call here)
        assert d["sigmas"].shape == (FLUX_LATENT[0],) and batch == 2 * FLUX_LATENT[0]
        assert len(d["sample_sigmas"]) == steps + 1


def test_flux_kontext_reference_tokens_follow_image_tokens(tiny_flux: Any, tiny: Any) -> None:
    """Kontext reference latents append their tokens after the image tokens and change the output."""
    ref = torch.randn((1, 16, 8, 6), generator=torch.Generator().manual_seed(7))
    n_img, n_ref = (FLUX_LATENT[2] // 2) * (FLUX_LATENT[3] // 2), 4 * 3
    pos = tiny.make_conditioning(tiny_flux, 1, text_len=32, reference_latents=[ref])
    neg = tiny.make_conditioning(tiny_flux, 2, text_len=32, reference_latents=[ref])
    calls: list[dict[str, Any]] = []
    out = tiny.sample(record_block_args(tiny_flux, "double_block", 0, calls), FLUX_LATENT, positive=pos, negative=neg)
    assert out.shape == FLUX_LATENT
    assert all(c["img"][1] == n_img + n_ref and c["pe"][2] == 32 + n_img + n_ref for c in calls)
    plain = [tiny.make_conditioning(tiny_flux, s, text_len=32) for s in (1, 2)]
    assert rel_diff(tiny.sample(tiny_flux, FLUX_LATENT, positive=plain[0], negative=plain[1]), out) > CHANGED


def test_unet_transformer_options_give_grid_and_block(tiny_sdxl: Any, tiny: Any) -> None:
    """Each SDXL BasicTransformerBlock sees activations_shape [B, C, h, w], block and block_index."""
    seen: set[tuple[Any, ...]] = set()
    model = tiny_sdxl.clone()
    for path in tiny.transformer_block_paths(tiny_sdxl):
        block = tiny_sdxl.get_model_object(path)

        def forward(x: torch.Tensor, context: Any = None, transformer_options: dict = {}, _block: Any = block) -> torch.Tensor:
            b, c, h, w = transformer_options["activations_shape"]
            assert x.shape == (b, h * w, c)
            seen.add((transformer_options["block"], transformer_options["block_index"], h, w))
            return type(_block).forward(_block, x, context=context, transformer_options=transformer_options)

        model.add_object_patch(f"{path}.forward", forward)
    tiny.sample(model, UNET_LATENT, steps=1)
    h, w = UNET_LATENT[2:]
    expected = {(("input", i), j, h // 2, w // 2) for i in (4, 5) for j in (0,)}
    expected |= {(("input", i), j, h // 4, w // 4) for i in (7, 8) for j in (0, 1)}
    expected |= {(("middle", 0), j, h // 4, w // 4) for j in (0, 1)}
    expected |= {(("output", i), j, h // 4, w // 4) for i in (0, 1, 2) for j in (0, 1)}
    expected |= {(("output", i), 0, h // 2, w // 2) for i in (3, 4, 5)}
    assert seen == expected
