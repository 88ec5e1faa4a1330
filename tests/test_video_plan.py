"""Video merge plans: frame segments, spatio-temporal tiles, pass-through spans."""

from __future__ import annotations

import pytest
import torch

from toma_core.video import Segment, SegmentPlan, frame_runs, make_video_plan

H, W = 6, 10


def features(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames * H * W, 16, generator=generator)


def frame_of_token(frames: int) -> torch.Tensor:
    return torch.arange(frames).repeat_interleave(H * W).float()


def test_frame_runs_cut_after_frame_zero_and_where_any_sample_changes():
    assert frame_runs([[5.0] * 6]) == [(0, 1), (1, 5)]
    assert frame_runs([[5.0] * 6], separate_first=False) == [(0, 6)]
    values = [[0.0, 7.0, 7.0, 7.0, 7.0], [0.0, 7.0, 7.0, 3.0, 3.0]]
    assert frame_runs(values) == [(0, 1), (1, 2), (3, 2)]
    assert frame_runs([[1.0]]) == [(0, 1)]
    with pytest.raises(ValueError, match="per-frame values"):
        frame_runs([[1.0, 2.0], [1.0]])


@pytest.mark.parametrize("tile_frames", [1, 2, 3])
def test_no_merged_token_mixes_frame_zero_with_later_frames(tile_frames):
    frames = 7
    plan = make_video_plan(features(2, frames), [Segment(1), Segment(frames - 1, tile_frames=tile_frames)], H, W, 0.5, 4)
    first = (frame_of_token(frames) == 0).float().view(1, -1, 1).expand(2, -1, 1)
    merged = plan.merge(first)
    assert torch.all((merged - merged.round()).abs() < 1e-5)
    assert plan.num_kept < plan.num_tokens


def test_spatial_segments_stay_frame_major_with_equal_counts():
    frames = 5
    plan = make_video_plan(features(3, frames), [Segment(1), Segment(frames - 1)], H, W, 0.5, 4)
    frame_of = plan.frame_of_kept(H * W)
    assert plan.frame_counts is not None and len(plan.frame_counts) == frames
    for sample in frame_of:
        assert torch.all(sample[1:] >= sample[:-1])
        assert torch.bincount(sample, minlength=frames).tolist() == plan.frame_counts
    merged_frame = plan.merge(frame_of_token(frames).view(1, -1, 1).expand(3, -1, 1)).squeeze(-1)
    assert torch.allclose(merged_frame, frame_of.float(), atol=1e-5)


def test_temporal_tiles_report_no_frame_counts_and_merge_across_frames():
    frames = 5
    x = features(1, frames)
    x = x.view(1, frames, H * W, -1)[:, :1].expand(1, frames, H * W, -1).reshape(1, -1, x.shape[-1])
    plan = make_video_plan(x, [Segment(1), Segment(frames - 1, tile_frames=4)], H, W, 0.75, 4)
    assert plan.frame_counts is None
    merged_frame = plan.merge(frame_of_token(frames).view(1, -1, 1)).squeeze(-1)
    # identical frames: destinations pull tokens of several frames together
    assert torch.any((merged_frame - merged_frame.round()).abs() > 0.1)


def test_pass_through_segments_are_untouched():
    frames = 4
    x = features(2, frames + 2)
    plan = make_video_plan(x, [Segment(1, merge=False), Segment(frames, tile_frames=2), Segment(1, merge=False)], H, W, 0.5, 4)
    n = H * W
    merged = plan.merge(x)
    d = plan.num_kept
    assert torch.equal(merged[:, :n], x[:, :n]) and torch.equal(merged[:, d - n:], x[:, -n:])
    assert torch.equal(plan.dst_index[:, :n], torch.arange(n).expand(2, -1))
    changed = merged + 1.0
    out = plan.unmerge_residual(x, merged, changed)
    assert torch.allclose(out, x + 1.0, atol=1e-5)
    assert torch.equal(out[:, :n], x[:, :n] + 1.0)


def test_take_gathers_destination_rows_for_batch_one_tables():
    frames = 3
    plan = make_video_plan(features(2, frames, seed=1), [Segment(1), Segment(frames - 1, tile_frames=2)], H, W, 0.5, 3)
    table = torch.randn(1, frames * H * W, 1, 4, 2, 2)
    taken = plan.take(table, 1)
    assert taken.shape == (2, plan.num_kept, 1, 4, 2, 2)
    for b in range(2):
        assert torch.equal(taken[b], table[0, plan.dst_index[b]])
    per_sample = torch.randn(2, frames * H * W, 3)
    assert torch.equal(plan.take(per_sample, 1)[1], per_sample[1, plan.dst_index[1]])


def test_plans_are_per_sample():
    frames = 3
    x = torch.cat([features(1, frames, seed=2), features(1, frames, seed=3)])
    plan = make_video_plan(x, [Segment(1), Segment(frames - 1, tile_frames=2)], H, W, 0.5, 4)
    alone = make_video_plan(x[1:], [Segment(1), Segment(frames - 1, tile_frames=2)], H, W, 0.5, 4)
    assert not torch.equal(plan.dst_index[0], plan.dst_index[1])
    assert torch.equal(plan.dst_index[1], alone.dst_index[0])


def test_ratio_zero_keeps_everything_and_returns_inputs():
    frames = 3
    x = features(2, frames)
    plan = make_video_plan(x, [Segment(1), Segment(frames - 1, tile_frames=2)], H, W, 0.0, 4)
    assert isinstance(plan, SegmentPlan) and not plan.merges
    assert torch.equal(plan.merge(x), x)
    assert plan.frame_counts == [H * W] * frames


def test_bad_feature_length_is_refused():
    with pytest.raises(ValueError, match="does not match the segments"):
        make_video_plan(features(1, 2), [Segment(3)], H, W, 0.5, 4)


def test_make_plan_refuses_bad_frame_counts():
    from toma_core import make_plan

    with pytest.raises(ValueError, match="frames=0"):
        make_plan(features(1, 1), H, W, 0.5, 4, frames=0)
    with pytest.raises(ValueError, match="tile_frames=0"):
        make_plan(features(1, 2), H, W, 0.5, 4, frames=2, tile_frames=0)


def test_unmerge_mode_reaches_every_merged_segment():
    frames = 3
    x = features(1, frames)
    segments = [Segment(1), Segment(frames - 1, tile_frames=2)]
    delta = make_video_plan(x, segments, H, W, 0.5, 4)
    output = make_video_plan(x, segments, H, W, 0.5, 4, unmerge="output")
    merged = output.merge(x)
    # "output" replaces each token by its destinations' output: no token keeps its own detail
    assert torch.allclose(output.unmerge_residual(x, merged, merged), output.unmerge(merged))
    assert not torch.allclose(delta.unmerge_residual(x, merged, merged), output.unmerge(merged))


@pytest.mark.parametrize("batch", [1, 2])
def test_video_plan_traces_as_one_graph(batch):
    """Plan, merge and unmerge trace under torch.compile without a graph break (the parts write into
    one tensor, with out= only where their slice is contiguous: a batch above 1 copies) and match eager."""
    segments = [Segment(1), Segment(4, tile_frames=2), Segment(2, merge=False)]

    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        plan = make_video_plan(x, segments, H, W, 0.5, 4)
        merged = plan.merge(x)
        return merged, plan.unmerge_residual(x, merged, 2 * merged)

    torch._dynamo.reset()
    x = features(batch, 7)
    for eager, compiled in zip(run(x), torch.compile(run, backend="eager", fullgraph=True)(x)):
        assert torch.equal(eager, compiled)
