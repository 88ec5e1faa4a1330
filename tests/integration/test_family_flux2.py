"""ToMA on Flux.2 (dev, Klein) and LongCat-Image in real ComfyUI: tiny random-weight
`comfy.supported_models.Flux2` and `LongCatImage` sampled through `comfy.sample.sample`. Both are
`comfy.ldm.flux.model.Flux` and merge through the Flux adapter (nodes/families/flux.py).

Flux.2's traps: global modulation (the blocks get a tuple of comfy.ldm.flux.layers.ModulationOut,
not a vector), 128 latent channels at patch 1, the prompt left-padded to 512 text tokens
(comfy.model_base.Flux2.extra_conds), text position ids on rope axis 3, reference images
(multi-reference editing) appended after the image tokens at rope index 10, 20, ..., and with the
reference method "index_timestep_zero" a timestep-zero modulation of the reference rows handed to
the blocks as spans. LongCat-Image: text position ids on axes 1 and 2 and image rope positions
shifted past the text (comfy.model_base.LongCatImage._apply_model).

Both classes are new in ComfyUI 0.33: on 0.3.64 every test here skips saying so."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402

LATENT = (1, 128, 8, 8)
"""An 8 x 8 token grid (patch 1): N = 64, D = 32 at ratio 0.5 with tile 4."""
TEXT = 512
"""Text rows of every Flux.2 sequence: comfy.model_base.Flux2 left-pads the prompt (12 tokens here) to 512."""
PROMPT = 12
REFERENCES = ((4, 6), (6, 4))
"""Two reference latents (h, w) of multi-reference editing: R = 48 reference tokens after the image."""
REFS = sum(h * w for h, w in REFERENCES)
METHODS = [None, "index", "index_timestep_zero"]
"""No reference image; the reference methods of comfy.ldm.flux.model.Flux Flux.2 uses."""

LONGCAT_LATENT = (1, 16, 16, 16)
"""An 8 x 8 token grid (patch 2)."""

KLEIN = {
    "4B": {"hidden_size": 3072, "num_heads": 24, "depth": 5, "depth_single_blocks": 20, "context_in_dim": 7680},
    "9B": {"hidden_size": 4096, "num_heads": 32, "depth": 8, "depth_single_blocks": 24, "context_in_dim": 12288},
}
"""Flux.2 Klein's overrides of Flux.2-dev's detected config (bench/speed/realsize_setup.py): width,
heads of 128, double and single blocks, Qwen3 text features (3 layers of 2560 / 4096); no guidance embedding."""


@pytest.fixture(scope="module")
def flux2(tiny: Any) -> Any:
    return fc.require(tiny_dits.build_flux2(seed=0), "Flux2")


@pytest.fixture(scope="module")
def klein(tiny: Any) -> Any:
    """A tiny Flux.2 Klein: Flux.2 without the guidance embedding."""
    return fc.require(tiny_dits.build_flux2(seed=1, guidance_embed=False), "Flux2")


@pytest.fixture(scope="module")
def longcat(tiny: Any) -> Any:
    return fc.require(tiny_dits.build_longcat(seed=0), "LongCatImage")


def flux2_conditioning(method: str | None) -> tuple[list, list]:
    """(positive, negative) of the tiny Flux.2; with a method, the positive carries the two
    reference latents (ReferenceLatent nodes) and that reference_latents_method."""
    pos = tiny_dits.conditioning("flux2", 1, PROMPT)
    if method is not None:
        gen = torch.Generator().manual_seed(3)
        refs = [torch.randn((1, 128, h, w), generator=gen) for h, w in REFERENCES]
        pos[0][1].update(reference_latents=refs, reference_latents_method=method)
    return pos, tiny_dits.conditioning("flux2", 2, PROMPT)


def text_and_references(text: int, refs: int) -> Any:
    """check_passthrough_rows' kept(): the `text` rows first, the `refs` reference rows last."""

    def kept(plain_length: int, merged_length: int) -> list[tuple[int, int, int]]:
        return [(0, 0, text)] + ([(plain_length - refs, merged_length - refs, refs)] if refs else [])

    return kept


def test_flux2_is_the_flux_class(flux2: Any) -> None:
    import comfy.ldm.flux.model

    dm = flux2.get_model_object("diffusion_model")
    assert type(dm) is comfy.ldm.flux.model.Flux and dm.params.global_modulation and dm.patch_size == 1


@pytest.mark.parametrize("method", METHODS)
def test_ratio_zero_is_bit_identical(flux2: Any, tiny: Any, toma: Any, method: str | None) -> None:
    fc.check_ratio_zero(tiny, toma, flux2, LATENT, *flux2_conditioning(method))


@pytest.mark.parametrize("blocks", ["all", "single:0-1"])
@pytest.mark.parametrize("method", METHODS)
def test_text_and_reference_rows_pass_through(flux2: Any, tiny: Any, toma: Any, method: str | None, blocks: str) -> None:
    """The first merged double / single block's attention gets the 512 text rows (padding
    included, with their axis-3 rope rows) and the 48 reference rows (their rope index and, with
    index_timestep_zero, their timestep-zero modulation) exactly as unpatched, and N - D = 32
    image rows fewer."""
    kept = text_and_references(TEXT, 0 if method is None else REFS)
    fc.check_passthrough_rows(tiny, toma, flux2, LATENT, *flux2_conditioning(method), kept, 32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, flux2, LATENT, *flux2_conditioning(method), kept, 32, blocks=blocks)


@pytest.mark.parametrize("scope", fc.SCOPES)
@pytest.mark.parametrize("method", METHODS)
def test_every_block_runs_on_merged_tokens(flux2: Any, tiny: Any, toma: Any, method: str | None, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    """cfg 1, 1 step: 4 attention calls, each D + T (+ R) long, and the run line names the 4 blocks
    (both double, both single) and counts 4 merged block runs."""
    caplog.set_level("INFO")
    pos, neg = flux2_conditioning(method)
    refs = 0 if method is None else REFS
    plain, merged, base, out = fc.merged_lengths(tiny, toma, flux2, LATENT, pos, neg, cfg=1.0, scope=scope)
    assert plain == [TEXT + 64 + refs] * 4 and merged == [TEXT + 32 + refs] * 4
    assert rel(out, base) > 1e-3
    run = fc.summary(caplog)
    assert (run.blocks_selected, run.blocks, run.block_runs_merged) == (4, "double:0-1,single:0-1", 4), run
    assert run.unmerged_calls == run.unmerged_blocks == {} and run.tokens.get((8, 8)) == (64, 32), run


def test_listed_blocks_alone_merge(flux2: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, _, _ = fc.merged_lengths(tiny, toma, flux2, LATENT, *flux2_conditioning("index"), cfg=1.0, blocks="double:1,single:0")
    full, short = TEXT + 64 + REFS, TEXT + 32 + REFS
    assert merged == [full, short, short, full]
    run = fc.summary(caplog)
    assert (run.blocks_selected, run.blocks, run.block_runs_merged) == (2, "double:1,single:0", 2), run


@pytest.mark.parametrize("blocks, message", [
    ("double:0-2", "double range 0-2 is outside this model's double blocks 0-1"),
    ("single:1-4", "single range 1-4 is outside this model's single blocks 0-1"),
])
def test_blocks_out_of_range_are_refused(flux2: Any, toma: Any, blocks: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        patch(toma, flux2, blocks=blocks)


@pytest.mark.parametrize("method", METHODS)
def test_klein_ratio_zero_and_rows(klein: Any, tiny: Any, toma: Any, method: str | None) -> None:
    """Klein (no guidance embedding): ratio 0 bit-identical, text and reference rows pass through."""
    pos, neg = flux2_conditioning(method)
    fc.check_ratio_zero(tiny, toma, klein, LATENT, pos, neg)
    kept = text_and_references(TEXT, 0 if method is None else REFS)
    fc.check_passthrough_rows(tiny, toma, klein, LATENT, pos, neg, kept, 32)
    fc.check_keys_values_rows(tiny, toma, klein, LATENT, pos, neg, kept, 32)


@pytest.mark.parametrize("size", sorted(KLEIN))
def test_klein_blocks_on_the_meta_device(tiny: Any, toma: Any, size: str) -> None:
    """Flux.2 Klein at full size (no weights: the meta device): the Flux adapter reads its block
    counts (4B: 5 double + 20 single; 9B: 8 + 24) and refuses one past each."""
    import comfy.model_patcher
    import comfy.supported_models

    from bench.speed import realsize_setup

    fc.require(getattr(comfy.supported_models, "Flux2", None), "Flux2")
    config = tiny.tree_config(realsize_setup.family("flux2").unet_config | KLEIN[size] | {"guidance_embed": False})
    model_config = comfy.supported_models.Flux2(dict(config))
    model_config.unet_config.update(config)
    cpu = torch.device("cpu")
    patcher = comfy.model_patcher.ModelPatcher(model_config.get_model({}, device=torch.device("meta")), load_device=cpu, offload_device=cpu)
    double, single = KLEIN[size]["depth"], KLEIN[size]["depth_single_blocks"]
    patch(toma, patcher, blocks=f"double:{double - 1},single:{single - 1}")
    with pytest.raises(ValueError, match=f"this model's double blocks 0-{double - 1}"):
        patch(toma, patcher, blocks=f"double:{double}")
    with pytest.raises(ValueError, match=f"this model's single blocks 0-{single - 1}"):
        patch(toma, patcher, blocks=f"single:{single}")


def test_longcat_ratio_zero_is_bit_identical(longcat: Any, tiny: Any, toma: Any) -> None:
    fc.check_ratio_zero(tiny, toma, longcat, LONGCAT_LATENT, tiny_dits.conditioning("flux", 1, PROMPT), tiny_dits.conditioning("flux", 2, PROMPT))


@pytest.mark.parametrize("blocks", ["all", "single:0-1"])
def test_longcat_text_rows_pass_through(longcat: Any, tiny: Any, toma: Any, blocks: str) -> None:
    """LongCat-Image's text rows (their rope ids on axes 1 and 2) reach the first merged attention
    as unpatched; its image rows, shifted past the text in rope, lose N - D = 32."""
    pos, neg = tiny_dits.conditioning("flux", 1, PROMPT), tiny_dits.conditioning("flux", 2, PROMPT)
    fc.check_passthrough_rows(tiny, toma, longcat, LONGCAT_LATENT, pos, neg, text_and_references(PROMPT, 0), 32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, longcat, LONGCAT_LATENT, pos, neg, text_and_references(PROMPT, 0), 32, blocks=blocks)
