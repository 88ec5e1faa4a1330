"""ToMA on SD3 / SD3.5 (MMDiT) in real ComfyUI: a tiny random-weight `OpenAISignatureMMDITWrapper`
sampled through `comfy.sample.sample`. Traps (comfy/ldm/modules/diffusionmodules/mmdit.py): no
rope, the last block returns no text, an image-only self-attention in SD3.5-Medium blocks, the
grid from the APPLY_MODEL wrapper (MMDiT has no DIFFUSION_MODEL executor)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from bench.harness import tiny_dits  # noqa: E402

LATENT = (1, 16, 16, 16)
"""An 8 x 8 token grid."""
TEXT = 12


@pytest.fixture(scope="module")
def sd3(tiny: Any) -> Any:
    return tiny_dits.build_sd3(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("sd3", 1, TEXT), tiny_dits.conditioning("sd3", 2, TEXT)


def test_ratio_zero_is_bit_identical(sd3: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, sd3, LATENT, *conds)


def test_every_block_runs_on_merged_tokens(sd3: Any, tiny: Any, toma: Any, conds: tuple, caplog: pytest.LogCaptureFixture) -> None:
    """3 joint blocks: joint attention T + N -> T + D; block 0's image-only attention N -> D. The
    last (pre-only) block merges too, so its None text stream went through."""
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, sd3, LATENT, *conds)
    assert plain == [TEXT + 64, 64, TEXT + 64, TEXT + 64]  # one batched cond+uncond call
    assert merged == [TEXT + 32, 32, TEXT + 32, TEXT + 32]
    assert fc.rel(out, base) > 1e-3
    line = fc.summary(caplog)
    assert "3 block runs merged" in line and "64->32 tokens (8x8)" in line


def test_unpatched_model_unchanged(sd3: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, sd3, LATENT, *conds)


def test_per_sample_plans_under_cfg(sd3: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, sd3, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 17, 23), (1, 16, 2, 30), (1, 16, 10, 26)])
def test_odd_sizes(sd3: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[2] // 2) * -(-shape[3] // 2)
    fc.check_odd_size(tiny, toma, sd3, shape, *conds, full_length=TEXT + n)


def test_refuses_what_it_cannot_honour(sd3: Any, toma: Any) -> None:
    with pytest.raises(ValueError, match="scope='attention' is available for Flux-family and UNet models only; SD3"):
        fc.patch(toma, sd3, scope="attention")
    with pytest.raises(ValueError, match="proportional_attention=True"):
        fc.patch(toma, sd3, proportional_attention=True)
    with pytest.raises(ValueError, match="double range 0-5 is outside 0-2"):
        fc.patch(toma, sd3, blocks="double:0-5")
