"""ToMA on Lumina-Image 2.0 (NextDiT) in real ComfyUI: a tiny random-weight model sampled through
`comfy.sample.sample`. Traps (comfy/ldm/lumina/model.py): no replace key
(object patches of `layers.{i}.forward`), caption tokens first with a length that differs between
cond and uncond (separate calls), an optional (B, L) key mask, refiner layers left exact."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from bench.harness import tiny_dits  # noqa: E402
from bench.harness.pack import pack_module  # noqa: E402

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


def test_every_layer_runs_on_merged_tokens(lumina: Any, tiny: Any, toma: Any, conds: tuple, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, lumina, LATENT, *conds)
    assert plain == REFINER + [TEXT + 64] * 3
    assert merged == REFINER + [TEXT + 32] * 3
    assert fc.rel(out, base) > 1e-3
    assert "3 block runs merged" in fc.summary(caplog)


def test_caption_lengths_differ_between_cond_and_uncond(lumina: Any, tiny: Any, toma: Any) -> None:
    """Positive 12 caption tokens, negative 9 (padded mask): two calls, each merged at its own offset."""
    pos = tiny_dits.conditioning("lumina2", 1, TEXT)
    mask = torch.ones((1, TEXT), dtype=torch.long)
    mask[:, 9:] = 0
    neg = tiny_dits.conditioning("lumina2", 2, TEXT, attention_mask=mask)
    fc.check_ratio_zero(tiny, toma, lumina, LATENT, pos, neg)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, lumina, LATENT, pos, neg)
    assert sorted(set(plain)) == sorted(REFINER + [9 + 64, TEXT + 64])  # the refiner sees the padded caption
    assert sorted(set(merged)) == sorted(REFINER + [9 + 32, TEXT + 32])
    assert fc.rel(out, base) > 1e-3


def test_batch_with_different_caption_lengths_runs_unmerged(toma: Any) -> None:
    adapter = pack_module("nodes.families.lumina2").Lumina2Adapter("lumina2", "all", 3, 2, refs_key=None)
    x = torch.zeros((2, 16, 16, 16))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert adapter.call_geometry(x, None, {"attention_mask": mask}).reason == "caption lengths differ within the batch"
    assert adapter.call_geometry(x, None, {"attention_mask": mask[:1].expand(2, 3)}).reason is None


def test_unpatched_model_unchanged(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, lumina, LATENT, *conds)


def test_per_sample_plans_under_cfg(lumina: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, lumina, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 17, 23), (1, 16, 2, 30), (1, 16, 10, 26)])
def test_odd_sizes(lumina: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[2] // 2) * -(-shape[3] // 2)
    fc.check_odd_size(tiny, toma, lumina, shape, *conds, full_length=TEXT + n)


def test_reapplying_replaces_and_selects_layers(lumina: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    twice = fc.patch(toma, fc.patch(toma, lumina, blocks="all"), blocks="layers:1")
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
    twice = fc.patch(toma, fc.patch(toma, patched, blocks="all"), blocks="all")
    assert getattr(twice.object_patches["diffusion_model.layers.1.forward"], "toma_foreign") is foreign
    fc.sample(tiny, twice, LATENT, *conds, steps=1)
    assert seen[1:] == [TEXT + 32]
    zero = fc.patch(toma, patched, ratio=0.0, blocks="all")
    assert torch.equal(fc.sample(tiny, zero, LATENT, *conds, steps=1), base)
