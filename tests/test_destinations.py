"""Destination rules and the selection-frequency penalty (toma_core/destinations.py,
nodes/run/destinations.py) without ComfyUI: penalty 0 is today's plan bit for bit, a penalty moves
destinations off tokens chosen before, padding stays last, and a run's stored block outputs are
used by the next plan of the same key and batch composition only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.pack import pack_module

core = pack_module("toma_core")
video = pack_module("toma_core.video")
stats_mod = pack_module("nodes.run.stats")
report_mod = pack_module("nodes.run.report")
settings_mod = pack_module("nodes.settings")

from test_nodes_runtime import call, make_state  # noqa: E402


def features(seed: int, batch: int = 2, tokens: int = 120, width: int = 8) -> torch.Tensor:
    return torch.randn(batch, tokens, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("budget", core.BUDGETS)
@pytest.mark.parametrize("temperature", [0.0, 1e-3])
def test_penalty_zero_is_todays_plan_bit_for_bit(budget: str, temperature: float) -> None:
    """10 x 12 tokens at tile 4: padded tiles too. Any frequency at penalty 0 changes nothing."""
    x = features(0)
    options = {"budget": budget, "temperature": temperature}
    today = core.make_plan(x, 10, 12, 0.5, 4, **options)
    zero = core.make_plan(x, 10, 12, 0.5, 4, frequency=torch.rand(2, 120), penalty=0.0, **options)
    assert torch.equal(today.dst_index, zero.dst_index) and torch.equal(today.assign, zero.assign)
    segments = [video.Segment(1, True, 1), video.Segment(2, True, 2)]
    frames = features(1, tokens=3 * 40)
    clip = video.make_video_plan(frames, segments, 5, 8, 0.5, 4, **options)
    clip_zero = video.make_video_plan(frames, segments, 5, 8, 0.5, 4, frequency=torch.ones(2, 120), penalty=0.0, **options)
    assert torch.equal(clip.dst_index, clip_zero.dst_index)


@pytest.mark.parametrize("seed", range(4))
def test_penalty_moves_the_pick_off_a_token_chosen_before(seed: int) -> None:
    """A token chosen by every earlier plan keeps the pick only while its gain leads the runner-up's
    by more than the penalty's share; the gain reported is the true marginal gain of the pick."""
    unit = F.normalize(torch.randn(9, 5, generator=torch.Generator().manual_seed(seed)), dim=-1)
    sim = unit @ unit.T
    shifted = sim - sim.min()
    gains = shifted.sum(-1)  # first pick: each candidate's coverage of the tile
    best, runner = gains.topk(2).values
    favourite = int(gains.argmax())
    margin = float((best - runner) / best)
    chosen_before = torch.zeros(9)
    chosen_before[favourite] = 1.0
    assert core.facility_location(sim, 1, penalty=chosen_before * margin / 2).item() == favourite
    moved, moved_gain = core.greedy_with_gains(sim, 1, penalty=chosen_before * min(1.0, 2 * margin))
    assert moved.item() != favourite
    assert moved_gain.item() == pytest.approx(float(gains[moved.item()]), rel=1e-5)


def test_counts_and_penalty_spread_destinations_over_plans() -> None:
    """The second plan of a run, at full penalty, avoids every token the first one chose (a tile keeps
    half its tokens, so the other half is there to take)."""
    x = features(2, tokens=16 * 16)
    first = core.make_plan(x, 16, 16, 0.5, 4)
    counts = core.count_destinations(None, first.dst_index, 256)
    assert counts.sum(1).tolist() == [first.num_kept] * 2 and set(counts.unique().tolist()) == {0.0, 1.0}
    second = core.make_plan(x, 16, 16, 0.5, 4, frequency=counts, penalty=1.0)
    assert not (counts.gather(1, second.dst_index) > 0).any()
    twice = core.count_destinations(counts, second.dst_index, 256)
    assert torch.equal(twice, torch.ones(2, 256)) and torch.equal(counts.sum(1), torch.full((2,), 128.0))


@pytest.mark.parametrize("budget", core.BUDGETS)
def test_padding_stays_last_under_the_heaviest_penalty(budget: str) -> None:
    """Every real token chosen before, penalty 1: the picks are still real tokens and D per sample."""
    x = features(3, tokens=10 * 12)
    today = core.make_plan(x, 10, 12, 0.5, 4, budget=budget)
    plan = core.make_plan(x, 10, 12, 0.5, 4, budget=budget, frequency=torch.ones(2, 120), penalty=1.0)
    assert plan.num_kept == today.num_kept
    for row in plan.dst_index:
        assert len(set(row.tolist())) == plan.num_kept and 0 <= int(row.min()) and int(row.max()) < 120
    assert torch.allclose(plan.cluster_sizes().sum(1), torch.full((2,), 120.0))


def test_bad_rules_and_frequencies_are_refused() -> None:
    with pytest.raises(ValueError, match="destinations='nearest'"):
        settings_mod.ToMASettings(destinations="nearest")
    with pytest.raises(ValueError, match=r"destination_penalty=1\.5 is outside \[0, 1\]"):
        settings_mod.ToMASettings(destination_penalty=1.5)
    with pytest.raises(ValueError, match="frequency shape"):
        core.make_plan(features(4), 10, 12, 0.5, 4, frequency=torch.ones(2, 7), penalty=0.5)


def test_facility_rule_keeps_no_memory() -> None:
    """The default rule stores no output and counts nothing: its plans are make_plan's own."""
    state = make_state()
    ctx = call(state, 10.0)
    x = features(5, tokens=64)
    plan = ctx.plan("s", 8, 8, lambda: x)
    ctx.note_output("s", 8, 8, features(6, tokens=64))
    assert torch.equal(plan.dst_index, core.make_plan(x, 8, 8, 0.5, 4).dst_index)
    assert not state.memory.outputs and not state.memory.counts and state.stats.plans_from_outputs is None
    record = report_mod.parse_run_line(stats_mod.format_report(state.config, state.stats, 0))
    assert record.plans_from_outputs is None


def test_output_similarity_plans_from_the_last_calls_first_block_output() -> None:
    state = make_state(destinations="output_similarity")
    x, out, later = features(7, tokens=64), features(8, tokens=64), features(9, tokens=64)
    first = call(state, 10.0)
    first_plan = first.plan("s", 8, 8, lambda: x)  # nothing stored yet: the block's input
    assert torch.equal(first_plan.dst_index, core.make_plan(x, 8, 8, 0.5, 4).dst_index)
    first.note_output("s", 8, 8, out)
    first.note_output("s", 8, 8, later)  # a later block of the same call: not the planning block
    state.keep_plans(first)
    second = call(state, 7.5)
    plan = second.plan("s", 8, 8, lambda: x)
    expected = core.make_plan(F.layer_norm(out, (8,)), 8, 8, 0.5, 4)
    assert torch.equal(plan.dst_index, expected.dst_index) and torch.equal(plan.assign, expected.assign)
    state.keep_plans(second)
    other = call(state, 5.0, batch=1, cond=(0,))  # another batch composition: its own memory
    assert torch.equal(other.plan("s", 8, 8, lambda: x[:1]).dst_index, core.make_plan(x[:1], 8, 8, 0.5, 4).dst_index)
    line = stats_mod.format_report(state.config, state.stats, 0)
    assert ", 1 from block outputs" in line and report_mod.parse_run_line(line).plans_from_outputs == 1
    assert not state.fresh().memory.outputs  # the next run starts empty


def test_a_stored_output_of_another_shape_is_not_used() -> None:
    state = make_state(destinations="output_similarity")
    first = call(state, 10.0)
    first.note_output("s", 8, 8, features(10, batch=2, tokens=32))  # not (B, 64): a cut span
    x = features(11, tokens=64)
    second = call(state, 7.5)
    assert torch.equal(second.plan("s", 8, 8, lambda: x).dst_index, core.make_plan(x, 8, 8, 0.5, 4).dst_index)
    assert state.stats.plans_from_outputs == 0


def test_penalty_counts_per_key_across_calls() -> None:
    state = make_state(destination_penalty=1.0)
    x = features(12, tokens=256)
    plans = []
    for sigma in (10.0, 7.5):
        ctx = call(state, sigma, hw=(16, 16))
        plans.append(ctx.plan("s", 16, 16, lambda: x))
        state.keep_plans(ctx)
    assert torch.equal(plans[0].dst_index, core.make_plan(x, 16, 16, 0.5, 4).dst_index)
    counts, built = state.memory.counts[(("s", 16, 16), 2, call(state, 5.0, hw=(16, 16)).composition)]
    assert built == 2 and torch.equal(counts, torch.ones(2, 256))  # the second plan took the other half


def test_video_segments_keep_their_own_outputs() -> None:
    """A frame-segment plan (Wan, HunyuanVideo) stores and finds its output under its segments."""
    segments = (video.Segment(1, True, 1), video.Segment(2, True, 2))
    state = make_state(destinations="output_similarity", destination_penalty=0.3)
    x, out = features(13, tokens=3 * 64), features(14, tokens=3 * 64)
    first = call(state, 10.0)
    first.plan("s", 8, 8, lambda: x, segments)
    first.note_output("s", 8, 8, out[:, :64], None)  # an image grid's output: another key
    first.note_output("s", 8, 8, out, segments)
    state.keep_plans(first)
    plan = call(state, 7.5).plan("s", 8, 8, lambda: x, segments)
    counted = core.count_destinations(None, video.make_video_plan(x, list(segments), 8, 8, 0.5, 4).dst_index, 192)
    expected = video.make_video_plan(F.layer_norm(out, (8,)), list(segments), 8, 8, 0.5, 4, frequency=counted, penalty=0.3)
    assert torch.equal(plan.dst_index, expected.dst_index) and state.stats.plans_from_outputs == 1
