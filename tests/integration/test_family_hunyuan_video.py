"""ToMA on HunyuanVideo in real ComfyUI: a tiny random-weight `HunyuanVideo` sampled through
`comfy.sample.sample`. Traps (comfy/ldm/hunyuan_video/model.py): the text comes after the image in
every sequence and rope table on one ComfyUI tree (0.3.64) and before it on another (0.33), the
key is `attention_mask` (a (1, 1, L) key mask, only at batch 1), both block kinds write into their
inputs in place, reference-latent tokens sit just before the video tokens, the "v2 (replace)"
image-to-video guidance modulates tokens [0, h*w) of each sequence apart, and HunyuanVideo 1.5
adds byT5 and vision tokens to the text.

Which rows are text and reference is found by behaviour, not assumed: at the first block's
attention (unpatched) the rows whose q, k or v change with the prompt are the text rows, those
that change with the reference latent the reference rows (`rows_that_depend`)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch, record_attention, runs_for  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402
from harness.pack import pack_module  # noqa: E402

LATENT = (1, 16, 3, 16, 16)
"""3 frames of an 8 x 8 token grid: N = 192, D = 96 at ratio 0.5 with tile 4."""
TEXT = 12
REFINER = [TEXT, TEXT]
"""Key lengths of the two text token-refiner blocks (never merged)."""


def other_prompt(cond: list, seed: int) -> list:
    """`cond` with another prompt: context, byT5 and vision tokens redrawn; pooled vector, guidance
    and the rest kept."""
    gen = torch.Generator().manual_seed(seed)
    context, extras = cond[0][0], dict(cond[0][1])
    if "conditioning_byt5small" in extras:
        extras["conditioning_byt5small"] = torch.randn(extras["conditioning_byt5small"].shape, generator=gen)
    if "clip_vision_output" in extras:
        state = extras["clip_vision_output"].last_hidden_state
        extras["clip_vision_output"] = types.SimpleNamespace(last_hidden_state=torch.randn(state.shape, generator=gen))
    return [[torch.randn(context.shape, generator=gen), extras]]


def rows_that_depend(tiny: Any, model: Any, latent: tuple[int, ...], first: list, second: list, neg: list) -> list[int]:
    """Rows of the first block's attention (after the text refiner's) whose q, k or v differ between
    conditionings `first` and `second` (unpatched, 1 step, cfg 1): the tokens carrying what differs."""
    a = fc.attention_inputs(tiny, model, latent, first, neg)[len(REFINER)]
    b = fc.attention_inputs(tiny, model, latent, second, neg)[len(REFINER)]
    differ = torch.zeros(a[0].shape[1], dtype=torch.bool)
    for x, y in zip(a, b):
        differ |= (x != y).flatten(2).any(-1).any(0)
    return differ.nonzero().flatten().tolist()


def kept_spans(passthrough: list[int]) -> Callable[[int, int], list[tuple[int, int, int]]]:
    """check_passthrough_rows' `kept` for these pass-through rows of the unpatched sequence: their
    contiguous spans, moved back by the removed rows when they come after the (one, contiguous) video span."""
    rows = sorted(passthrough)
    spans = [[rows[0], 1]]
    for row in rows[1:]:
        if row == spans[-1][0] + spans[-1][1]:
            spans[-1][1] += 1
        else:
            spans.append([row, 1])

    def kept(plain: int, merged: int) -> list[tuple[int, int, int]]:
        video = sorted(set(range(plain)) - set(rows))
        assert video == list(range(video[0], video[-1] + 1))
        return [(start, start if start < video[0] else start - (plain - merged), count) for start, count in spans]

    return kept


def text_rows(tiny: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list, count: int) -> list[int]:
    """The `count` text rows of the first block's attention: one span, at the start or the end."""
    rows = rows_that_depend(tiny, model, latent, pos, other_prompt(pos, 9), neg)
    assert len(rows) == count and rows == list(range(rows[0], rows[0] + count))
    return rows


def without_double_blocks(model: Any) -> Any:
    """A clone whose double blocks return their inputs: the first single block's text rows then
    depend on the prompt only, its video rows on the latent only."""
    clone = model.clone()
    for i in range(2):
        clone.set_model_patch_replace(lambda args, extra: {"img": args["img"], "txt": args["txt"]}, "dit", "double_block", i)
    return clone


@pytest.fixture(scope="module")
def hunyuan(tiny: Any) -> Any:
    return tiny_dits.build_hunyuan(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("hunyuan_video", 1, TEXT), tiny_dits.conditioning("hunyuan_video", 2, TEXT)


def test_ratio_zero_is_bit_identical(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, *conds)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_every_block_runs_on_merged_tokens(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, *conds, scope=scope)
    assert plain == REFINER + [192 + TEXT] * 4 and merged == REFINER + [96 + TEXT] * 4
    assert rel(out, base) > 1e-3
    run = fc.summary(caplog)
    assert run.block_runs_merged == 4 and run.tokens.get((8, 8)) == (192, 96)


def test_text_rows_reach_the_double_blocks_unchanged(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """The first merged attention (double block 0) gets every text row exactly as unpatched (its
    rope row included), wherever the tree puts the text, and N - D = 96 video rows fewer."""
    rows = text_rows(tiny, hunyuan, LATENT, *conds, TEXT)
    fc.check_passthrough_rows(tiny, toma, hunyuan, LATENT, *conds, kept_spans(rows), 96)
    fc.check_keys_values_rows(tiny, toma, hunyuan, LATENT, *conds, kept_spans(rows), 96)


def test_text_rows_reach_the_single_blocks_unchanged(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """The same for the single blocks' one sequence (double blocks skipped, so the first single
    block's text rows are found by the prompt)."""
    model = without_double_blocks(hunyuan)
    rows = text_rows(tiny, model, LATENT, *conds, TEXT)
    fc.check_passthrough_rows(tiny, toma, model, LATENT, *conds, kept_spans(rows), 96, blocks="single:0-1")
    fc.check_keys_values_rows(tiny, toma, model, LATENT, *conds, kept_spans(rows), 96, blocks="single:0-1")


@pytest.mark.parametrize("blocks", ["double:0-1", "single:0-1"])
def test_unplaceable_sequence_runs_unmerged(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, blocks: str, caplog: pytest.LogCaptureFixture) -> None:
    """A block handed a rope table rotated by half the text (the text's rows split between both
    ends, a layout no HunyuanVideo builds) runs unmerged with the reason, bit-identical to the same
    rotation without ToMA, instead of merging whatever rows lie where the video was."""
    caplog.set_level("INFO")
    kind = blocks.split(":")[0]

    def rotated(inner: Callable[[dict, dict], dict]) -> Callable[[dict, dict], dict]:
        return lambda args, extra: inner(dict(args, pe=args["pe"].roll(TEXT // 2, 2)), extra)

    def with_rotation(model: Any) -> Any:
        clone = model.clone()
        dit = clone.model_options["transformer_options"].get("patches_replace", {}).get("dit", {})
        for i in range(2):
            inner = dit.get((f"{kind}_block", i), lambda args, extra: extra["original_block"](args))
            clone.set_model_patch_replace(rotated(inner), "dit", f"{kind}_block", i)
        return clone

    base = fc.sample(tiny, with_rotation(hunyuan), LATENT, *conds, steps=1)
    out = fc.sample(tiny, with_rotation(patch(toma, hunyuan, blocks=blocks)), LATENT, *conds, steps=1)
    assert torch.equal(out, base)
    run = fc.summary(caplog)
    assert run.block_runs_merged == 0 and runs_for(run.unmerged_blocks, "neither before nor after the image tokens") > 0


def test_frame_zero_merges_alone_and_later_frames_in_pairs(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's segments: frame 0 alone, frames 1-2 in 2 x 4 x 4 tiles (toma_core.video.make_video_plan).
    Merging one-hot frame indicators shows it: a merged token of frame 0 holds frame 0 only, and
    some merged token of the later segment mixes frames 1 and 2."""
    joint = toma.runtime
    plans: list[Any] = []
    original = joint.make_video_plan
    monkeypatch.setattr(joint, "make_video_plan", lambda *a, **k: plans.append((a[1], original(*a, **k))) or plans[-1][1])
    fc.sample(tiny, patch(toma, hunyuan, blocks="all", tile_frames=2), LATENT, *conds, steps=1)
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
    merged = fc.sample(tiny, patch(toma, hunyuan, ratio=0.25, blocks="single:0-1"), LATENT, *conds, steps=1)
    nothing = fc.sample(tiny, skipped, LATENT, *conds, steps=1)
    assert rel(merged, base) < 0.5 * rel(nothing, base)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_text_mask_columns_follow_the_merge(hunyuan: Any, tiny: Any, toma: Any, scope: str) -> None:
    """A padded prompt (9 of 12 tokens) at cfg 1 (ComfyUI builds the mask at batch 1 only): every
    merged attention gets a mask of D + T keys whose text columns are the unpatched ones (the
    padding stays masked), and ratio 0 stays exact; in both scopes."""
    mask = torch.ones((1, TEXT), dtype=torch.long)
    mask[:, 9:] = 0
    pos = tiny_dits.conditioning("hunyuan_video", 1, TEXT, attention_mask=mask)
    neg = tiny_dits.conditioning("hunyuan_video", 2, TEXT)
    base = fc.sample(tiny, hunyuan, LATENT, pos, neg, cfg=1.0)
    assert torch.equal(fc.sample(tiny, patch(toma, hunyuan, ratio=0.0, blocks="all", scope=scope), LATENT, pos, neg, cfg=1.0), base)
    plain, plain_masks = record_attention(hunyuan, lambda b, q, k, m: m)
    recorded, masks = record_attention(patch(toma, hunyuan, blocks="all", scope=scope), lambda b, q, k, m: m)
    fc.sample(tiny, plain, LATENT, pos, neg, cfg=1.0, steps=1)
    out = fc.sample(tiny, recorded, LATENT, pos, neg, cfg=1.0, steps=1)
    assert [m.shape[-1] for m in masks[len(REFINER):]] == [96 + TEXT] * 4
    kept = kept_spans(text_rows(tiny, hunyuan, LATENT, pos, neg, TEXT))(192 + TEXT, 96 + TEXT)
    for before, after in zip(plain_masks[len(REFINER):], masks[len(REFINER):]):
        for p_start, m_start, count in kept:
            assert torch.equal(after[..., m_start:m_start + count], before[..., p_start:p_start + count])
            assert bool((after[..., m_start + 9:m_start + count] < 0).all())
    assert rel(out, base) > 1e-3


@pytest.mark.parametrize("blocks", ["double:0-1", "single:0-1"])
def test_reference_latent_tokens_pass_through(hunyuan: Any, tiny: Any, toma: Any, blocks: str) -> None:
    """The "custom" image-to-video reference (one 8 x 8-token frame) sits before the video: R = 64
    tokens stay, and they and the text reach the first merged attention as unpatched.
    At cfg 1: ComfyUI 0.3.64's reference ids fail at batch 2 (an in-place write to an expanded tensor)."""
    ref = torch.randn((1, 16, 1, 16, 16), generator=torch.Generator().manual_seed(4))
    pos = tiny_dits.conditioning("hunyuan_video", 1, TEXT, ref_latent=ref)
    neg = tiny_dits.conditioning("hunyuan_video", 2, TEXT)
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0, blocks=blocks)
    double, full, short = blocks.startswith("double"), 64 + 192 + TEXT, 64 + 96 + TEXT
    assert plain == REFINER + [full] * 4
    assert merged == REFINER + ([short] * 2 + [full] * 2 if double else [full] * 2 + [short] * 2)
    assert rel(out, base) > 1e-3
    model = hunyuan if double else without_double_blocks(hunyuan)
    other = [[pos[0][0], dict(pos[0][1], ref_latent=torch.randn(ref.shape, generator=torch.Generator().manual_seed(5)))]]
    refs = rows_that_depend(tiny, model, LATENT, pos, other, neg)
    assert len(refs) == 64
    rows = text_rows(tiny, model, LATENT, pos, neg, TEXT)
    fc.check_passthrough_rows(tiny, toma, model, LATENT, pos, neg, kept_spans(refs + rows), 96, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, model, LATENT, pos, neg, kept_spans(refs + rows), 96, blocks=blocks)


GUIDED = 64
"""A prompt as long as frame 0 (8 x 8 tokens): the single blocks' modulation boundary (h * w) is then
frame 0's end with the text after the video, and the video's start with the text before it."""


def test_token_replace_guidance_merges_frame_zero_apart(hunyuan: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """"v2 (replace)" image-to-video: tokens [0, h*w) of each sequence have their own modulation
    (modulation_dims); at cfg 1 (ComfyUI's apply_mod fails at batch 2) every block merges, ratio 0
    stays exact, and the single blocks' text rows keep their modulation (they reach the first
    merged attention as unpatched)."""
    caplog.set_level("INFO")
    pos = tiny_dits.conditioning("hunyuan_video", 1, GUIDED, guiding_frame_index=0)
    neg = tiny_dits.conditioning("hunyuan_video", 2, GUIDED, guiding_frame_index=0)
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    assert merged == [GUIDED] * 2 + [96 + GUIDED] * 4
    assert rel(out, base) > 1e-3
    run = fc.summary(caplog)
    assert run.block_runs_merged == 4 and run.unmerged_calls == run.unmerged_blocks == {}
    model = without_double_blocks(hunyuan)
    rows = text_rows(tiny, model, LATENT, pos, neg, GUIDED)
    fc.check_passthrough_rows(tiny, toma, model, LATENT, pos, neg, kept_spans(rows), 96, blocks="single:0-1")
    fc.check_keys_values_rows(tiny, toma, model, LATENT, pos, neg, kept_spans(rows), 96, blocks="single:0-1")


def test_token_replace_boundary_inside_frame_zero(hunyuan: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """With a 12-token prompt the single blocks' boundary (64) lies inside frame 0 when the text
    comes first (a merged frame-0 token would mix two modulations): those blocks run unmerged with
    the reason. With the text last it is frame 0's end and they merge. The double blocks'
    boundary (over img) is frame 0's end either way."""
    caplog.set_level("INFO")
    pos = tiny_dits.conditioning("hunyuan_video", 1, TEXT, guiding_frame_index=0)
    neg = tiny_dits.conditioning("hunyuan_video", 2, TEXT, guiding_frame_index=0)
    text_first = text_rows(tiny, without_double_blocks(hunyuan), LATENT, pos, neg, TEXT)[0] == 0
    fc.check_ratio_zero(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan, LATENT, pos, neg, cfg=1.0)
    single = 192 + TEXT if text_first else 96 + TEXT
    assert merged == REFINER + [96 + TEXT] * 2 + [single] * 2
    run = fc.summary(caplog)
    if text_first:
        assert run.block_runs_merged == 2 and runs_for(run.unmerged_blocks, "modulation boundary 64 inside a merged frame segment") > 0
    else:
        assert run.block_runs_merged == 4 and run.unmerged_calls == run.unmerged_blocks == {}


def test_modulation_spans_follow_the_merge(toma: Any) -> None:
    """Boundaries at segment ends move to the merged counts; one inside a segment is refused."""
    hunyuan_video = pack_module("nodes.families.hunyuan_video")
    video = pack_module("toma_core.video")
    segments = [video.Segment(1), video.Segment(2, tile_frames=2)]
    plan = video.make_video_plan(torch.randn(1, 3 * 64, 8), segments, 8, 8, 0.5, 4)
    d0, d = plan.parts[0].num_kept, plan.num_kept
    assert hunyuan_video.merged_dims([(0, 64, 0), (64, None, 1)], plan, 0) == [(0, d0, 0), (d0, None, 1)]
    assert hunyuan_video.merged_dims([(0, 10, 0), (10, 3 * 64 + 15, 1)], plan, 10) == [(0, 10, 0), (10, d + 15, 1)]
    assert "inside a merged frame segment" in hunyuan_video.merged_dims([(0, 32, 0)], plan, 0).reason


def test_hunyuan_image_2_1(tiny: Any, toma: Any) -> None:
    """HunyuanImage 2.1: the same class on a 4-D latent with a 1 x 1 patch (8 x 8 latent = 64 tokens);
    the text rows reach the first merged attention as unpatched."""
    model = tiny_dits.build_hunyuan_image()
    gen = torch.Generator().manual_seed(1)
    pos, neg = ([[torch.randn(1, TEXT, 32, generator=gen), {"guidance": 3.5}]] for _ in range(2))
    fc.check_ratio_zero(tiny, toma, model, (1, 64, 8, 8), pos, neg)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, model, (1, 64, 8, 8), pos, neg)
    assert plain == REFINER + [64 + TEXT] * 4 and merged == REFINER + [32 + TEXT] * 4
    assert rel(out, base) > 1e-3
    rows = text_rows(tiny, model, (1, 64, 8, 8), pos, neg, TEXT)
    fc.check_passthrough_rows(tiny, toma, model, (1, 64, 8, 8), pos, neg, kept_spans(rows), 32)
    fc.check_keys_values_rows(tiny, toma, model, (1, 64, 8, 8), pos, neg, kept_spans(rows), 32)
    fc.check_clone_untouched(tiny, toma, model, (1, 64, 8, 8), pos, neg)


@pytest.fixture(scope="module")
def hunyuan15(tiny: Any) -> Any:
    model = tiny_dits.build_hunyuan15()
    if model is None:
        pytest.skip("ComfyUI 0.3.64 has no comfy.supported_models.HunyuanVideo15")
    return model


LATENT15 = (1, 32, 3, 16, 16)
"""HunyuanVideo 1.5's 32 latent channels, 3 frames of 8 x 8 tokens."""
TEXT15 = TEXT + 4 + 5
"""Text tokens of HunyuanVideo 1.5's blocks: 5 vision (vision_in), 4 byT5 glyph and the 12 prompt tokens."""


def conditioning15(seed: int) -> list:
    gen = torch.Generator().manual_seed(seed + 100)
    vision = types.SimpleNamespace(last_hidden_state=torch.randn((1, 5, 16), generator=gen))
    return tiny_dits.conditioning("hunyuan_video", seed, TEXT, conditioning_byt5small=torch.randn((1, 4, 1472), generator=gen), clip_vision_output=vision)


@pytest.mark.parametrize("blocks", ["double:0-1", "single:0-1"])
def test_hunyuan_video_1_5(hunyuan15: Any, tiny: Any, toma: Any, blocks: str) -> None:
    """HunyuanVideo 1.5 (the same class with vision and byT5 tokens in the text): ratio 0 exact, the
    video merges, and all 21 text rows reach the first merged attention as unpatched."""
    pos, neg = conditioning15(1), conditioning15(2)
    fc.check_ratio_zero(tiny, toma, hunyuan15, LATENT15, pos, neg)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, hunyuan15, LATENT15, pos, neg, blocks=blocks)
    double, full, short = blocks.startswith("double"), 192 + TEXT15, 96 + TEXT15
    assert plain == REFINER + [full] * 4
    assert merged == REFINER + ([short] * 2 + [full] * 2 if double else [full] * 2 + [short] * 2)
    assert rel(out, base) > 1e-3
    model = hunyuan15 if double else without_double_blocks(hunyuan15)
    rows = text_rows(tiny, model, LATENT15, pos, neg, TEXT15)
    fc.check_passthrough_rows(tiny, toma, model, LATENT15, pos, neg, kept_spans(rows), 96, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, model, LATENT15, pos, neg, kept_spans(rows), 96, blocks=blocks)


@pytest.mark.parametrize("kind", ["i2v", "sr"])
def test_hunyuan_video_1_5_image_to_video_and_super_resolution(tiny: Any, toma: Any, kind: str) -> None:
    """HunyuanVideo 1.5 image-to-video (the input image's latent concatenated on the channels,
    comfy.model_base.HunyuanVideo15.concat_cond) and its super-resolution model (the low-resolution
    latent on the channels, HunyuanVideo15_SR_Distilled): the same token layout as text-to-video, so
    ratio 0 is exact and the 21 text rows reach the first merged attention as unpatched."""
    model = tiny_dits.build_hunyuan15(seed=3, sr=kind == "sr")
    if model is None:
        pytest.skip("ComfyUI 0.3.64 has no comfy.supported_models.HunyuanVideo15 / HunyuanVideo15_SR_Distilled")
    gen = torch.Generator().manual_seed(7)
    extras: dict[str, Any] = {"concat_latent_image": torch.randn((1, 66, 3, 16, 16), generator=gen)}
    if kind == "i2v":  # as comfy_extras' HunyuanVideo15ImageToVideo: the image in frame 0, a mask keeping it
        image = torch.zeros((1, 32, 3, 16, 16))
        image[:, :, :1] = torch.randn((1, 32, 1, 16, 16), generator=gen)
        mask = torch.ones((1, 1, 3, 16, 16))
        mask[:, :, :1] = 0.0
        extras = {"concat_latent_image": image, "concat_mask": mask}
    pos, neg = conditioning15(1), conditioning15(2)
    for cond in (pos, neg):
        cond[0][1].update(extras)
    fc.check_ratio_zero(tiny, toma, model, LATENT15, pos, neg)
    rows = text_rows(tiny, model, LATENT15, pos, neg, TEXT15)
    fc.check_passthrough_rows(tiny, toma, model, LATENT15, pos, neg, kept_spans(rows), 96, blocks="double:0-1")
    fc.check_keys_values_rows(tiny, toma, model, LATENT15, pos, neg, kept_spans(rows), 96, blocks="double:0-1")


def test_unpatched_model_unchanged(hunyuan: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, hunyuan, LATENT, *conds)


def test_per_sample_plans_under_cfg(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, hunyuan, LATENT, *conds, monkeypatch, (toma.runtime, "make_video_plan"))


@pytest.mark.parametrize("shape", [(1, 16, 2, 18, 22), (1, 16, 1, 2, 30), (1, 16, 3, 10, 14)])
def test_odd_token_grids(hunyuan: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    """Odd token grids (9 x 11, 1 x 15, 5 x 7); ComfyUI's HunyuanVideo itself needs even latent sides."""
    n = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    fc.check_odd_size(tiny, toma, hunyuan, shape, *conds, full_length=TEXT + n)
