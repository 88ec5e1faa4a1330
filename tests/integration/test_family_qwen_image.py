"""ToMA on Qwen-Image and Qwen-Image-Edit in real ComfyUI: a tiny random-weight
`QwenImageTransformer2DModel` sampled through `comfy.sample.sample`. Traps
(comfy/ldm/qwen_image/model.py): the 5-D latent, pe with batch B and text rows first,
Edit reference tokens after the image (unmerged), cond and uncond as separate calls of different
lengths when only the positive has a reference."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from bench.harness import tiny_dits  # noqa: E402

LATENT = (1, 16, 1, 16, 16)
"""An 8 x 8 token grid (Qwen-Image latents are 5-D with one frame)."""
TEXT = 12


@pytest.fixture(scope="module")
def qwen(tiny: Any) -> Any:
    return tiny_dits.build_qwen(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("qwen", 1, TEXT), tiny_dits.conditioning("qwen", 2, TEXT)


def test_ratio_zero_is_bit_identical(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, qwen, LATENT, *conds)


def test_every_block_runs_on_merged_tokens(qwen: Any, tiny: Any, toma: Any, conds: tuple, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, qwen, LATENT, *conds)
    assert plain == [TEXT + 64] * 3 and merged == [TEXT + 32] * 3
    assert fc.rel(out, base) > 1e-3
    assert "3 block runs merged" in fc.summary(caplog)


def test_unpatched_model_unchanged(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, qwen, LATENT, *conds)


def test_per_sample_plans_under_cfg(qwen: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, qwen, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 1, 17, 23), (1, 16, 1, 2, 30), (1, 16, 1, 10, 26)])
def test_odd_sizes(qwen: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[3] // 2) * -(-shape[4] // 2)
    fc.check_odd_size(tiny, toma, qwen, shape, *conds, full_length=TEXT + n)


def test_edit_reference_tokens_pass_through(qwen: Any, tiny: Any, toma: Any) -> None:
    """The positive carries a 10 x 12 reference latent (5 x 6 = 30 tokens after the image): the cond
    call runs alone on T + D + 30 tokens, the uncond on T + D; ratio 0 stays exact."""
    ref = torch.randn((1, 16, 1, 10, 12), generator=torch.Generator().manual_seed(3))
    pos = tiny_dits.conditioning("qwen", 1, TEXT, reference_latents=[ref])
    neg = tiny_dits.conditioning("qwen", 2, TEXT)
    fc.check_ratio_zero(tiny, toma, qwen, LATENT, pos, neg)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, qwen, LATENT, pos, neg)
    assert sorted(set(plain)) == [TEXT + 64, TEXT + 64 + 30]
    assert sorted(set(merged)) == [TEXT + 32, TEXT + 32 + 30]
    assert fc.rel(out, base) > 1e-3


def test_merged_tokens_take_their_destinations_rope_rows(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """Block 1 sees pe rows [text; destinations' rows]: text rows unchanged, every image row one
    of the unmerged call's image rows."""

    def spying(model: Any, seen: list) -> Any:
        block = model.model.diffusion_model.transformer_blocks[1]

        def forward(**kwargs: Any) -> Any:
            seen.append((kwargs["image_rotary_emb"], kwargs["hidden_states"].shape[1]))
            return type(block).forward(block, **kwargs)

        spied = model.clone()
        spied.add_object_patch("diffusion_model.transformer_blocks.1.forward", forward)
        return spied

    merged: list = []
    full: list = []
    fc.sample(tiny, fc.patch(toma, spying(qwen, merged), blocks="double:1", tile_size=4), LATENT, *conds, steps=1)
    fc.sample(tiny, spying(qwen, full), LATENT, *conds, steps=1)
    (pe, tokens), (pe_full, _) = merged[0], full[0]
    assert tokens == 32 and pe.shape[1] == TEXT + 32 and pe_full.shape[1] == TEXT + 64
    assert torch.equal(pe[:, :TEXT], pe_full[:, :TEXT])
    rows = {tuple(r.flatten().tolist()) for r in pe_full[0, TEXT:]}
    assert all(tuple(r.flatten().tolist()) in rows for r in pe[0, TEXT:])
    assert len({tuple(r.flatten().tolist()) for r in pe[0, TEXT:]}) > 1
