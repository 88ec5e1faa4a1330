"""ToMA on HunyuanVideo in real ComfyUI: a tiny random-weight `HunyuanVideo` sampled through
`comfy.sample.sample`. Traps (comfy/ldm/hunyuan_video/model.py): the image comes
first in every sequence and rope table, the key is `attention_mask` (a (1, 1, L) key mask, only at
batch 1 in ComfyUI 0.3.64), both block kinds write into their inputs in place, reference-latent
tokens are prepended, and the "v2 (replace)" image-to-video guidance modulates frame 0 apart."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from bench.harness import tiny_dits  # noqa: E402

LATENT = (1, 16, 3, 16, 16)
"""3 frames of an 8 x 8 token grid: N = 192, D = 96 at ratio 0.5 with tile 4."""
TEXT = 12
REFINER = [TEXT, TEXT]
"""Key lengths of the two text token-refiner blocks (never merged)."""


@pytest.fixture(scope="module")
def hunyuan(tiny: Any) -> Any:
    return tiny_dits.build_hunyuan(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("hunyuan_video", 1, TEXT), tiny_dits.conditioning("hunyuan_video", 2, TEXT)


def test_ratio_zero_is_bit_identical(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, *conds)


def test_every_block_runs_on_merged_tokens(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, *conds)
    assert plain == REFINER + [192 + TEXT] * 4 and merged == REFINER + [96 + TEXT] * 4
    assert fc.rel(out, base) > 1e-3
    line = fc.summary(caplog)
    assert "4 block runs merged" in line and "192->96 tokens (8x8)" in line


def test_frame_zero_merges_alone_and_later_frames_in_pairs(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's segments: frame 0 alone, frames 1-2 in 2 x 4 x 4 tiles (toma_core.video.make_video_plan).
    Merging one-hot frame indicators shows it: a merged token of frame 0 holds frame 0 only, and
    some merged token of the later segment mixes frames 1 and 2."""
    joint = fc.pack_module("nodes.machinery.dit_runner")
    plans: list[Any] = []
    original = joint.make_video_plan
    monkeypatch.setattr(joint, "make_video_plan", lambda *a, **k: plans.append((a[1], original(*a, **k))) or plans[-1][1])
    fc.sample(tiny, fc.patch(toma, hunyuan, blocks="all", tile_frames=2), LATENT, *conds, steps=1)
    segments, plan = plans[0]
    assert [(s.frames, s.merge, s.tile_frames) for s in segments] == [(1, True, 1), (2, True, 2)]
    frame = torch.arange(3).repeat_interleave(64)
    onehot = torch.nn.functional.one_hot(frame, 3).float().expand(plan.batch, -1, -1)
    merged = plan.merge(onehot)
    first = merged[:, :32]
    assert torch.equal(first[..., 1:], torch.zeros_like(first[..., 1:]))
    later = merged[:, 32:]
    assert bool(((later[..., 1] > 0) & (later[..., 2] > 0)).any()) and torch.equal(later[..., 0], torch.zeros_like(later[..., 0]))


def test_in_place_single_blocks_keep_their_change(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """Single blocks add to their input in place: a delta taken against the tensor passed in would
    be zero, as if the blocks did nothing. Merging them (ratio 0.25) stays far closer to the
    unpatched model than skipping them does."""
    skipped = hunyuan.clone()
    for i in range(2):
        skipped.set_model_patch_replace(lambda args, extra: {"img": args["img"]}, "dit", "single_block", i)
    base = fc.sample(tiny, hunyuan, LATENT, *conds, steps=1)
    merged = fc.sample(tiny, fc.patch(toma, hunyuan, ratio=0.25, blocks="single:0-1"), LATENT, *conds, steps=1)
    nothing = fc.sample(tiny, skipped, LATENT, *conds, steps=1)
    assert fc.rel(merged, base) < 0.5 * fc.rel(nothing, base)


def test_text_mask_columns_follow_the_merge(hunyuan: Any, tiny: Any, toma: Any) -> None:
    """A padded prompt (9 of 12 tokens) at cfg 1 (ComfyUI builds the mask at batch 1 only): every
    merged attention gets a mask of D + T keys, and ratio 0 stays exact."""
    mask = torch.ones((1, TEXT), dtype=torch.long)
    mask[:, 9:] = 0
    pos = tiny_dits.conditioning("hunyuan_video", 1, TEXT, attention_mask=mask)
    neg = tiny_dits.conditioning("hunyuan_video", 2, TEXT)
    base = fc.sample(tiny, hunyuan, LATENT, pos, neg, cfg=1.0)
    assert torch.equal(fc.sample(tiny, fc.patch(toma, hunyuan, ratio=0.0, blocks="all"), LATENT, pos, neg, cfg=1.0), base)
    recorded, calls = fc.record_attention(fc.patch(toma, hunyuan, blocks="all"), lambda b, q, k, m: (k, None if m is None else m.shape[-1]))
    out = fc.sample(tiny, recorded, LATENT, pos, neg, cfg=1.0, steps=1)
    assert calls[len(REFINER):] == [(96 + TEXT, 96 + TEXT)] * 4
    assert fc.rel(out, base) > 1e-3


def test_reference_latent_tokens_pass_through(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """The "custom" image-to-video reference (one 8 x 8-token frame) is prepended: R = 64 tokens stay.
    At cfg 1: ComfyUI 0.3.64's reference ids fail at batch 2 (an in-place write to an expanded tensor)."""
    ref = torch.randn((1, 16, 1, 16, 16), generator=torch.Generator().manual_seed(4))
    pos = tiny_dits.conditioning("hunyuan_video", 1, TEXT, ref_latent=ref)
    neg = tiny_dits.conditioning("hunyuan_video", 2, TEXT)
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    assert plain == REFINER + [64 + 192 + TEXT] * 4 and merged == REFINER + [64 + 96 + TEXT] * 4
    assert fc.rel(out, base) > 1e-3


def test_token_replace_guidance_merges_frame_zero_apart(hunyuan: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """"v2 (replace)" image-to-video: frame 0 has its own modulation (modulation_dims); at cfg 1
    (ComfyUI's apply_mod fails at batch 2) every block merges and ratio 0 stays exact."""
    caplog.set_level("INFO")
    pos = tiny_dits.conditioning("hunyuan_video", 1, TEXT, guiding_frame_index=0)
    neg = tiny_dits.conditioning("hunyuan_video", 2, TEXT, guiding_frame_index=0)
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    assert merged == REFINER + [96 + TEXT] * 4
    assert fc.rel(out, base) > 1e-3
    line = fc.summary(caplog)
    assert "4 block runs merged" in line and "unmerged: none" in line


def test_modulation_spans_follow_the_merge(toma: Any) -> None:
    """Boundaries at segment ends move to the merged counts; one inside a segment is refused."""
    hunyuan_video = fc.pack_module("nodes.families.hunyuan_video")
    video = fc.pack_module("toma_core.video")
    segments = [video.Segment(1), video.Segment(2, tile_frames=2)]
    plan = video.make_video_plan(torch.randn(1, 3 * 64, 8), segments, 8, 8, 0.5, 4)
    d0, d = plan.parts[0].num_kept, plan.num_kept
    assert hunyuan_video.merged_dims([(0, 64, 0), (64, None, 1)], plan, 0) == [(0, d0, 0), (d0, None, 1)]
    assert hunyuan_video.merged_dims([(0, 10, 0), (10, 3 * 64 + 15, 1)], plan, 10) == [(0, 10, 0), (10, d + 15, 1)]
    assert "inside a merged frame segment" in hunyuan_video.merged_dims([(0, 32, 0)], plan, 0).reason


def test_hunyuan_image_2_1(tiny: Any, toma: Any) -> None:
    """HunyuanImage 2.1: the same class on a 4-D latent with a 1 x 1 patch (8 x 8 latent = 64 tokens)."""
    model = tiny_dits.build_hunyuan_image()
    gen = torch.Generator().manual_seed(1)
    pos, neg = ([[torch.randn(1, TEXT, 32, generator=gen), {"guidance": 3.5}]] for _ in range(2))
    fc.check_ratio_zero(tiny, toma, model, (1, 64, 8, 8), pos, neg)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, model, (1, 64, 8, 8), pos, neg)
    assert plain == REFINER + [64 + TEXT] * 4 and merged == REFINER + [32 + TEXT] * 4
    assert fc.rel(out, base) > 1e-3
    fc.check_clone_untouched(tiny, toma, model, (1, 64, 8, 8), pos, neg)


def test_unpatched_model_unchanged(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, hunyuan, LATENT, *conds)


def test_per_sample_plans_under_cfg(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, hunyuan, LATENT, *conds, monkeypatch, (fc.pack_module("nodes.machinery.dit_runner"), "make_video_plan"))


@pytest.mark.parametrize("shape", [(1, 16, 2, 18, 22), (1, 16, 1, 2, 30), (1, 16, 3, 10, 14)])
def test_odd_token_grids(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    """Odd token grids (9 x 11, 1 x 15, 5 x 7); ComfyUI's HunyuanVideo itself needs even latent sides."""
    n = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    fc.check_odd_size(tiny, toma, hunyuan, shape, *conds, full_length=TEXT + n)
