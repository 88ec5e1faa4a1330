"""ToMA on Lumina-Image 2.0 and Z-Image (NextDiT) in real ComfyUI: tiny random-weight models
sampled through `comfy.sample.sample`. Traps (comfy/ldm/lumina/model.py): no replace key (object
patches of `layers.{i}.forward`), the keyword timestep_zero_index the layers get on ComfyUI 0.33,
caption tokens first with a length that differs between cond and uncond (separate calls), an
optional (B, L) key mask, Z-Image's pad tokens after the caption and after the image (the image is
not the last N tokens), Z-Image omni's reference prefix and per-range modulation, refiner layers
left exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402
from harness.pack import pack_module  # noqa: E402

LATENT = (1, 16, 16, 16)
"""An 8 x 8 token grid."""
TEXT = 12
REFINER = [TEXT, 64]
"""Key lengths of the context refiner (caption only) and the noise refiner (image only), never merged."""


@pytest.fixture(scope="module")
def lumina(tiny: Any) -> Any:
    return tiny_dits.build_lumina(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("lumina2", 1, TEXT), tiny_dits.conditioning("lumina2", 2, TEXT)


def test_ratio_zero_is_bit_identical(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, lumina, LATENT, *conds)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_every_layer_runs_on_merged_tokens(lumina: Any, tiny: Any, toma: Any, conds: tuple, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, lumina, LATENT, *conds, scope=scope)
    assert plain == REFINER + [TEXT + 64] * 3
    assert merged == REFINER + [TEXT + 32] * 3
    assert rel(out, base) > 1e-3
    assert fc.summary(caplog).block_runs_merged == 3


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_caption_lengths_differ_between_cond_and_uncond(lumina: Any, tiny: Any, toma: Any, scope: str) -> None:
    """Positive 12 caption tokens, negative 9 (padded mask): two calls, each merged at its own
    offset (the negative's padded caption tokens dropped, as on ComfyUI 0.3.64, or kept, as on 0.33);
    in both scopes (keys_values: the key mask's columns merged)."""
    pos = tiny_dits.conditioning("lumina2", 1, TEXT)
    mask = torch.ones((1, TEXT), dtype=torch.long)
    mask[:, 9:] = 0
    neg = tiny_dits.conditioning("lumina2", 2, TEXT, attention_mask=mask)
    fc.check_ratio_zero(tiny, toma, lumina, LATENT, pos, neg, scopes=(scope,))
    plain, merged, base, out = fc.merged_lengths(tiny, toma, lumina, LATENT, pos, neg, scope=scope)
    layers = set(plain) - set(REFINER)  # the refiner sees the padded caption
    assert layers in ({9 + 64, TEXT + 64}, {TEXT + 64})
    assert set(merged) == set(REFINER) | {length - 32 for length in layers}
    assert rel(out, base) > 1e-3


def test_caption_rows_pass_through_and_image_rows_merge(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_passthrough_rows(tiny, toma, lumina, LATENT, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=32)
    fc.check_keys_values_rows(tiny, toma, lumina, LATENT, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=32)


def layer_masks(tiny: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list) -> list[Any]:
    """The x_mask every call hands layers.0 of the unpatched model (1 step, cfg 1)."""
    layer, masks = model.model.diffusion_model.layers[0], []

    def recording(x, x_mask, *args, **kwargs):
        masks.append(x_mask)
        return type(layer).forward(layer, x, x_mask, *args, **kwargs)

    recorded = model.clone()
    recorded.add_object_patch("diffusion_model.layers.0.forward", recording)
    fc.sample(tiny, recorded, latent, pos, neg, steps=1, cfg=1.0)
    return masks


def test_batch_of_different_caption_lengths_merges_where_the_layout_is_shared(lumina: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """One positive of two captions, 12 and 9 tokens (a padded mask), over two latents: NextDiT
    keeps the caption padding (NextDiT.embed_cap), the layers get no per-sample key mask, one
    layout holds for the batch and every layer merges. (Where a tree drops caption padding per
    sample, image_span runs such a batch unmerged: test_image_span_reads_the_layout_the_layer_gets.)"""
    from comfy.ldm.lumina.model import NextDiT

    if not hasattr(NextDiT, "embed_cap"):
        pytest.skip("ComfyUI 0.3.64 has no comfy.ldm.lumina.model.NextDiT.embed_cap (one caption layout per batch); its context refiner cannot attend a batch of different caption masks")
    gen = torch.Generator().manual_seed(4)
    mask = torch.ones((2, TEXT), dtype=torch.long)
    mask[1, 9:] = 0
    pos = [[torch.randn((2, TEXT, 32), generator=gen), {"attention_mask": mask}]]
    latent = (2, *LATENT[1:])
    assert layer_masks(tiny, lumina, latent, pos, pos) == [None]
    caplog.set_level("INFO")
    fc.sample(tiny, patch(toma, lumina, blocks="all"), latent, pos, pos, steps=1, cfg=1.0)
    run = fc.summary(caplog)
    assert run.block_runs_merged == 3 and run.unmerged_calls == run.unmerged_blocks == {}


def test_unpatched_model_unchanged(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, lumina, LATENT, *conds)


def test_per_sample_plans_under_cfg(lumina: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, lumina, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 17, 23), (1, 16, 2, 30), (1, 16, 10, 26)])
def test_odd_sizes(lumina: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[2] // 2) * -(-shape[3] // 2)
    fc.check_odd_size(tiny, toma, lumina, shape, *conds, full_length=TEXT + n)


def test_reapplying_replaces_and_selects_layers(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    twice = patch(toma, patch(toma, lumina, blocks="all"), blocks="layers:1")
    assert sorted(twice.object_patches) == ["diffusion_model.layers.1.forward"]
    merged, lengths = fc.lengths_of(twice)
    fc.sample(tiny, merged, LATENT, *conds, steps=1)
    assert lengths == REFINER + [TEXT + 64, TEXT + 32, TEXT + 64]


def test_another_packs_layer_patch_runs_on_merged_tokens(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """A foreign object patch on layers.1 stays in the chain (re-applying ToMA keeps it) and runs
    on the merged sequence; at ratio 0 the output is the foreign-patched model's, bit for bit."""
    layer = lumina.model.diffusion_model.layers[1]
    seen: list[int] = []

    def foreign(x, *args, **kwargs):
        seen.append(x.shape[1])
        return type(layer).forward(layer, x, *args, **kwargs)

    patched = lumina.clone()
    patched.add_object_patch("diffusion_model.layers.1.forward", foreign)
    base = fc.sample(tiny, patched, LATENT, *conds, steps=1)
    assert seen == [TEXT + 64]
    twice = patch(toma, patch(toma, patched, blocks="all"), blocks="all")
    assert getattr(twice.object_patches["diffusion_model.layers.1.forward"], "toma_foreign") is foreign
    fc.sample(tiny, twice, LATENT, *conds, steps=1)
    assert seen[1:] == [TEXT + 32]
    zero = patch(toma, patched, ratio=0.0, blocks="all")
    assert torch.equal(fc.sample(tiny, zero, LATENT, *conds, steps=1), base)


ZLATENT = (1, 16, 24, 24)
"""A 12 x 12 grid: 144 image tokens, padded to 160 (16 image pads); the 12 caption tokens padded to 32."""
PAD = 32
"""The tiny Z-Image's pad_tokens_multiple (the real one's, comfy.model_detection)."""


def padded(count: int) -> int:
    return -(-count // PAD) * PAD


def zimage_rows(prefix: int, image_pads: int) -> Callable[[int, int], list[tuple[int, int, int]]]:
    """check_passthrough_rows spans: the prefix (caption, caption pads, omni references) first, the
    image pads last."""
    return lambda plain, merged: [(0, 0, prefix), (plain - image_pads, merged - image_pads, image_pads)]


def require_zimage(model: Any) -> Any:
    if model is None:
        pytest.skip("this ComfyUI has no comfy.supported_models.ZImage (Z-Image came after ComfyUI 0.3.64)")
    return model


@pytest.fixture(scope="module")
def zimage(tiny: Any) -> Any:
    return require_zimage(tiny_dits.build_zimage(seed=0))


@pytest.fixture(scope="module")
def zimage_omni(tiny: Any) -> Any:
    """A tiny Z-Image omni: a SigLIP embedder, so reference latents bring SigLIP pad tokens too."""
    return require_zimage(tiny_dits.build_zimage(seed=1, siglip_feat_dim=24))


def test_zimage_is_a_lumina2_model_patched_by_the_lumina2_adapter(zimage: Any, toma: Any) -> None:
    import comfy.model_base

    assert type(zimage.model) is comfy.model_base.Lumina2
    assert zimage.model.diffusion_model.pad_tokens_multiple == PAD
    assert sorted(patch(toma, zimage, blocks="all").object_patches) == [f"diffusion_model.layers.{i}.forward" for i in range(3)]


@pytest.mark.parametrize("shape", [ZLATENT, (1, 16, 16, 16), (1, 16, 17, 23), (1, 16, 2, 30)])
def test_zimage_ratio_zero_is_bit_identical(zimage: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    """Grids of 144, 64 (a multiple of the pad: no image pads), 9 x 12 and 1 x 15 tokens."""
    fc.check_ratio_zero(tiny, toma, zimage, shape, *conds)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_zimage_layers_run_on_merged_tokens(zimage: Any, tiny: Any, toma: Any, conds: tuple, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, zimage, ZLATENT, *conds, scope=scope)
    refiners = [padded(TEXT), padded(144)]
    assert plain == refiners + [padded(TEXT) + padded(144)] * 3
    assert merged == refiners + [padded(TEXT) + 72 + 16] * 3
    assert rel(out, base) > 1e-3
    assert fc.summary(caplog).block_runs_merged == 3


def test_zimage_caption_and_pad_rows_pass_through(zimage: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """Caption, caption pads and image pads reach the first merged attention as unpatched; the 144
    image tokens become 72."""
    fc.check_passthrough_rows(tiny, toma, zimage, ZLATENT, *conds, kept=zimage_rows(padded(TEXT), 16), merged_tokens=72)
    fc.check_keys_values_rows(tiny, toma, zimage, ZLATENT, *conds, kept=zimage_rows(padded(TEXT), 16), merged_tokens=72)


@pytest.mark.parametrize("shape", [(1, 16, 17, 23), (1, 16, 10, 26)])
def test_zimage_odd_sizes(zimage: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[2] // 2) * -(-shape[3] // 2)
    fc.check_odd_size(tiny, toma, zimage, shape, *conds, full_length=padded(TEXT) + padded(n))


def test_zimage_per_sample_plans_under_cfg(zimage: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, zimage, ZLATENT, *conds, monkeypatch)


def omni_conds() -> tuple[list, list]:
    """A positive with one 16 x 16 reference latent (64 tokens, no pads), a plain negative."""
    ref = torch.randn((1, 16, 16, 16), generator=torch.Generator().manual_seed(5))
    return tiny_dits.conditioning("lumina2", 1, TEXT, reference_latents=[ref]), tiny_dits.conditioning("lumina2", 2, TEXT)


OMNI_PREFIX = 2 * PAD + 2 * PAD + 64
"""Before the image: the reference's caption (pads only) and the caption, the SigLIP pads of both,
the reference image."""


def test_zimage_omni_merges_only_the_image(zimage_omni: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Z-Image omni: the reference prefix runs at timestep 0, the caption and image at the real one
    (timestep_zero_index ranges, moved to the merged sequence). Ratio 0 is exact; the prefix and
    the image pads reach the first merged attention as unpatched; every layer merges."""
    pos, neg = omni_conds()
    fc.check_ratio_zero(tiny, toma, zimage_omni, ZLATENT, pos, neg)
    fc.check_passthrough_rows(tiny, toma, zimage_omni, ZLATENT, pos, neg, kept=zimage_rows(OMNI_PREFIX, 16), merged_tokens=72)
    fc.check_keys_values_rows(tiny, toma, zimage_omni, ZLATENT, pos, neg, kept=zimage_rows(OMNI_PREFIX, 16), merged_tokens=72)
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, zimage_omni, ZLATENT, pos, neg)
    assert OMNI_PREFIX + padded(144) in plain and OMNI_PREFIX + 72 + 16 in merged
    assert rel(out, base) > 1e-3
    run = fc.summary(caplog)
    assert run.block_runs_merged == 6 and run.unmerged_calls == run.unmerged_blocks == {}


@pytest.fixture(scope="module")
def zimage_pixel(tiny: Any) -> Any:
    model = tiny_dits.build_zimage_pixel(seed=2)
    if model is None:
        pytest.skip("this ComfyUI has no comfy.supported_models.ZImagePixelSpace (pixel-space Z-Image came after ComfyUI 0.3.64)")
    return model


def test_zimage_pixel_space_merges_only_the_image(zimage_pixel: Any, tiny: Any, toma: Any, conds: tuple, caplog: pytest.LogCaptureFixture) -> None:
    """NextDiTPixelSpace (a NextDiT: the Lumina2 adapter) on a 48 x 48 RGB image in 4 x 4 patches
    (the 12 x 12 grid of ZLATENT): exact at ratio 0, caption and pad rows pass through, every layer merges."""
    latent = (1, 3, 48, 48)
    fc.check_ratio_zero(tiny, toma, zimage_pixel, latent, *conds)
    fc.check_passthrough_rows(tiny, toma, zimage_pixel, latent, *conds, kept=zimage_rows(padded(TEXT), 16), merged_tokens=72)
    fc.check_keys_values_rows(tiny, toma, zimage_pixel, latent, *conds, kept=zimage_rows(padded(TEXT), 16), merged_tokens=72)
    caplog.set_level("INFO")
    fc.merged_lengths(tiny, toma, zimage_pixel, latent, *conds)
    assert fc.summary(caplog).block_runs_merged == 3


def lumina2_module(toma: Any) -> Any:
    return pack_module("nodes.families.lumina2")


def test_image_span_reads_the_layout_the_layer_gets(toma: Any) -> None:
    """[caption 32; image 144; pads 16] with the pads at rope position 0 and the image range of
    timestep_zero_index: found at 32; a changed layout (pads elsewhere, another range, an unknown
    keyword, a per-sample mask) runs unmerged with its reason."""
    lumina2 = lumina2_module(toma)
    length, n = 192, 144
    x = torch.zeros((2, length, 8))
    rope = torch.randn((1, length, 1, 4, 2, 2))
    rope[:, -16:] = torch.eye(2)
    span = lumina2.image_span(x, None, rope, {"timestep_zero_index": [(32, length), (0, 32)]}, n, PAD)
    assert span.start == 32 and span.length == length
    assert lumina2.image_span(x, None, rope, {}, 160, None).start == 32  # no pads: the last N tokens
    shifted = torch.roll(rope, 16, dims=1)
    for reason, got in [
        ("rope rows", lumina2.image_span(x, None, shifted, {}, n, PAD)),
        ("timestep_zero_index range", lumina2.image_span(x, None, rope, {"timestep_zero_index": [(48, length)]}, n, PAD)),
        ("keyword(s) extra", lumina2.image_span(x, None, rope, {"extra": 1}, n, PAD)),
    ]:
        assert got.layout and reason in got.reason
    mask = torch.zeros((2, length))
    mask[1, 20:32] = -1e9
    assert lumina2.image_span(x, mask, rope, {}, n, PAD) is lumina2.CAPTIONS_DIFFER
    assert lumina2.image_span(x, torch.zeros((2, length)), rope, {}, n, PAD).start == 32


def test_timestep_zero_ranges_move_with_the_image(toma: Any) -> None:
    """Image tokens [100, 244) kept as 72: a range ending after them shifts by 72, one before them
    stays, one ending inside them cannot move."""
    move = lumina2_module(toma).move_spans
    assert move([(100, 260), (32, 64)], 100, 144, 72) == {"timestep_zero_index": [(100, 188), (32, 64)]}
    assert move([(0, 100), (244, 260)], 100, 144, 72) == {"timestep_zero_index": [(0, 100), (172, 188)]}
    assert move([(120, 260)], 100, 144, 72).layout
