"""ToMA on HiDream-I1 in real ComfyUI: a tiny random-weight `HiDreamImageTransformer2DModel` sampled
through `comfy.sample.sample`. Traps (comfy/ldm/hidream/model.py): no replace key
(object patches of `double_stream_blocks.{i}` / `single_stream_blocks.{i}` called with keywords),
the image first in every sequence and in rope, single blocks return [image; text], a different
Llama layer per block, a MoE feed-forward, the E1 edit condition beside the image."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402

LATENT = (1, 16, 16, 16)
"""An 8 x 8 token grid."""
TEXT = 12
TEXT_ALL = 3 * TEXT
"""Every block attends to T5 + Llama (last layer) + Llama (its own layer) tokens."""


@pytest.fixture(scope="module")
def hidream(tiny: Any) -> Any:
    return tiny_dits.build_hidream(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("hidream", 1, TEXT), tiny_dits.conditioning("hidream", 2, TEXT)


def test_ratio_zero_is_bit_identical(hidream: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, hidream, LATENT, *conds)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_every_block_runs_on_merged_tokens(hidream: Any, tiny: Any, toma: Any, conds: tuple, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hidream, LATENT, *conds, scope=scope)
    assert plain == [64 + TEXT_ALL] * 4 and merged == [32 + TEXT_ALL] * 4
    assert rel(out, base) > 1e-3
    assert fc.summary(caplog).block_runs_merged == 4


def test_listed_blocks_and_reapplying(hidream: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    twice = patch(toma, patch(toma, hidream, blocks="all"), blocks="double:1,single:0")
    assert sorted(twice.object_patches) == ["diffusion_model.double_stream_blocks.1.forward", "diffusion_model.single_stream_blocks.0.forward"]
    recorded, lengths = fc.lengths_of(twice)
    fc.sample(tiny, recorded, LATENT, *conds, steps=1)
    assert lengths == [64 + TEXT_ALL, 32 + TEXT_ALL, 32 + TEXT_ALL, 64 + TEXT_ALL]


def test_edit_condition_runs_unmerged(hidream: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """E1 edit: the condition image is concatenated along the width; the calls run unmerged."""
    caplog.set_level("INFO")
    image = torch.randn(LATENT, generator=torch.Generator().manual_seed(5))
    pos = tiny_dits.conditioning("hidream", 1, TEXT, concat_latent_image=image)
    neg = tiny_dits.conditioning("hidream", 2, TEXT, concat_latent_image=image)
    base = fc.sample(tiny, hidream, LATENT, pos, neg)
    assert torch.equal(fc.sample(tiny, patch(toma, hidream, blocks="all"), LATENT, pos, neg), base)
    assert fc.summary(caplog).unmerged_calls.get("E1 edit condition (image_cond beside the image) is not merged") == 2


def test_unpatched_model_unchanged(hidream: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, hidream, LATENT, *conds)


def test_per_sample_plans_under_cfg(hidream: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, hidream, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 17, 23), (1, 16, 2, 30), (1, 16, 10, 26)])
def test_odd_sizes(hidream: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[2] // 2) * -(-shape[3] // 2)
    fc.check_odd_size(tiny, toma, hidream, shape, *conds, full_length=TEXT_ALL + n)


def test_refuses_attention_scope(hidream: Any, toma: Any) -> None:
    with pytest.raises(ValueError, match="HiDream merges whole blocks"):
        patch(toma, hidream, scope="attention")


@pytest.mark.parametrize("blocks", ["all", "single:0", "single:1"])
def test_text_rows_pass_through_exactly(hidream: Any, tiny: Any, toma: Any, conds: tuple, blocks: str) -> None:
    """Which rows merged: the T5 + Llama text rows (after the image in every block's attention,
    HiDreamAttnProcessor_flashattn: [image; text]) reach the first merged double / single block's
    attention exactly as unpatched, their rope rows their own; the image rows lose N - D."""
    def kept(plain: int, merged: int) -> list[tuple[int, int, int]]:
        return [(plain - TEXT_ALL, merged - TEXT_ALL, TEXT_ALL)]

    fc.check_passthrough_rows(tiny, toma, hidream, LATENT, *conds, kept=kept, merged_tokens=32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, hidream, LATENT, *conds, kept=kept, merged_tokens=32, blocks=blocks)
