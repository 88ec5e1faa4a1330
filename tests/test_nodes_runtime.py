"""Runtime state and the Flux token helpers without ComfyUI: schedule decisions per call, plan
cache keys, fresh holders on deepcopy, the report line, pe/mask row merging."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from harness.pack import pack_module

contract = pack_module("nodes.contract")
runtime = pack_module("nodes.run.runtime")
current = pack_module("nodes.run.current")
config_mod = pack_module("nodes.run.config")
report_mod = pack_module("nodes.run.report")
stats_mod = pack_module("nodes.run.stats")
wrappers = pack_module("nodes.run.wrappers")
settings_mod = pack_module("nodes.settings")
runner = pack_module("nodes.machinery.runner")
flux = pack_module("nodes.families.flux")
core = pack_module("toma_core")


@dataclass(frozen=True)
class FakeAdapter:
    family: str = "fake"
    blocks: str = "all"
    num_blocks: int = 2

    def call_geometry(self, x, context, kwargs):
        return contract.CallGeometry(x.shape[-2], x.shape[-1], None if context is None else context.shape[1])


def make_state(**kwargs) -> "runtime.RunState":
    config = config_mod.ToMAConfig(settings_mod.ToMASettings(**kwargs), FakeAdapter())
    state = runtime.RunState(config)
    state.begin_run(lambda p: 10.0 * (1 - p), torch.tensor([10.0, 7.5, 5.0, 2.5, 0.0]))
    return state


def options(sigma: float, cond=(0, 1)):
    return {"sigmas": torch.tensor([sigma]), "sample_sigmas": torch.tensor([10.0, 7.5, 5.0, 2.5, 0.0]),
            "cond_or_uncond": list(cond), "uuids": ["a", "b"][: len(cond)]}


def call(state, sigma, batch=2, hw=(8, 8), cond=(0, 1), device="cpu"):
    x = torch.zeros(batch, 4, *hw, device=device)
    return wrappers.build_call(state, x, torch.tensor([sigma]), torch.zeros(batch, 5, 3), options(sigma, cond), {})


def test_deepcopy_gives_fresh_holder():
    state = make_state()
    call(state, 10.0)
    clone = copy.deepcopy({"s": state})["s"]
    assert clone is not state and clone.config is state.config
    assert clone.stats.calls == 0 and not clone.plans and not clone.running


def test_window_and_steps():
    state = make_state(schedule=core.MergeSchedule(0.0, 0.5, 1))
    merged = [call(state, s).merge for s in (10.0, 7.5, 5.0, 2.5)]
    assert merged == [True, True, False, False]
    assert call(state, 5.0).reason == "outside the sigma window"
    assert state.stats.steps_merged == {0, 1}


def test_not_running_and_min_tokens():
    state = runtime.RunState(make_state().config)
    assert call(state, 10.0).reason == "outside a sampling run"
    small = make_state(min_tokens=100)
    assert "min_tokens=100" in call(small, 10.0).reason


def plan_of(ctx, slot="s", hw=(8, 8), feats=None):
    """What a call does with its plans: a block asks for one, the wrapper keeps it after the call."""
    feats = feats or (lambda: torch.randn(ctx.batch, hw[0] * hw[1], 8))
    plan = ctx.plan(slot, *hw, feats)
    ctx.state.keep_plans(ctx)
    return plan


def test_plan_cache_keys_composition_and_epoch():
    state = make_state(schedule=core.MergeSchedule(0.0, 1.0, 2))
    a = plan_of(call(state, 10.0))
    assert plan_of(call(state, 10.0)) is a  # Heun / second eval of the step
    assert plan_of(call(state, 7.5)) is a  # recompute_every=2: same epoch
    assert plan_of(call(state, 10.0, batch=1, cond=(0,))) is not a
    assert plan_of(call(state, 10.0, device="meta")) is not a  # MultiGPU CFG Split: each device its own
    assert plan_of(call(state, 5.0)) is not a  # new epoch
    assert state.stats.plans_built == 4
    assert all(key[-1] == 1 for key in state.plans)  # older epochs dropped


def test_merge_every_skips_steps_and_never_reuses_a_plan_too_old():
    """merge_every=2 on the 4-step run: steps 0 and 2 merge, 1 and 3 run unmerged with their reason.
    recompute_every counts sampling steps: 2 re-selects at step 2, 3 keeps step 0's plan."""
    for recompute, shared in ((2, False), (3, True)):
        state = make_state(schedule=core.MergeSchedule(0.0, 1.0, recompute, 2))
        a = plan_of(call(state, 10.0))
        skipped = call(state, 7.5)
        assert not skipped.merge and skipped.plans == {}
        assert skipped.reason == "between merge steps (merge_every=2)"
        assert (plan_of(call(state, 5.0)) is a) == shared
        assert not call(state, 2.5).merge
        assert state.stats.steps_merged == {0, 2}
        assert state.stats.unmerged_calls == {"between merge steps (merge_every=2)": 2}
        assert state.stats.plans_built == (1 if shared else 2)


def test_call_plans_are_fresh_and_prefilled_eagerly():
    """Blocks see only ctx.plans: empty when the call builds, pre-filled when it reuses; a plan
    built in a call reaches the run's cache only through keep_plans (the wrapper, after the call)."""
    state = make_state(schedule=core.MergeSchedule(0.0, 1.0, 2))
    first = call(state, 10.0)
    assert first.plans == {}
    a = first.plan("s", 8, 8, lambda: torch.randn(2, 64, 8))
    assert first.plan("s", 8, 8, lambda: 1 / 0) is a  # later blocks of the call share it
    b = first.plan("s", 4, 4, lambda: torch.randn(2, 16, 8))  # another level: its own plan
    assert not state.plans and state.stats.plans_built == 0
    state.keep_plans(first)
    assert state.stats.plans_built == 2
    again = call(state, 7.5)
    assert again.plans == {("s", 8, 8): a, ("s", 4, 4): b} and again.plans is not first.plans
    state.keep_plans(again)
    assert state.stats.plans_built == 2
    assert call(state, 5.0).plans == {}  # new epoch: build
    assert call(state, 2.5, batch=1, cond=(0,)).plans == {}  # other composition
    unmerged = make_state(schedule=core.MergeSchedule(0.0, 0.0, 1))
    assert call(unmerged, 10.0).plans == {}


def test_plans_use_the_budget_setting():
    """The settings' budget reaches make_plan: "adaptive" shares the same D by content."""
    x = torch.zeros(2, 256, 8)
    x[:, :128] = torch.randn(2, 128, 8)  # detailed top half, flat bottom half
    for budget in core.BUDGETS:
        ctx = call(make_state(budget=budget), 10.0, hw=(16, 16))
        plan = ctx.plan("s", 16, 16, lambda: x)
        expected = core.make_plan(x, 16, 16, 0.5, 4, budget=budget)
        assert plan.num_kept == expected.num_kept and torch.equal(plan.dst_index, expected.dst_index)
    tile = core.make_plan(x, 16, 16, 0.5, 4, budget="tile")
    adaptive = core.make_plan(x, 16, 16, 0.5, 4, budget="adaptive")
    assert not torch.equal(tile.dst_index, adaptive.dst_index)


def test_report_is_one_line_with_facts():
    state = make_state(ratio=0.5)
    ctx = call(state, 10.0)
    plan_of(ctx)
    ctx.record_block(True)
    ctx.record_block(False, "attn_mask")
    line = stats_mod.format_report(state.config, state.stats, orphan_blocks=0)
    assert "\n" not in line
    record = report_mod.parse_run_line(line)
    assert record.tokens == {(8, 8): (64, 32)} and record.block_runs_merged == 1 and record.plans_built == 1
    assert record.unmerged_blocks == {"attn_mask": 1}


def test_find_call_order():
    state = make_state()
    ctx = call(state, 10.0)
    assert current.find_call({"transformer_options": {settings_mod.CALL_KEY: ctx}}) is ctx
    assert current.find_call({}, {"transformer_options": {settings_mod.CALL_KEY: ctx}}) is ctx
    assert current.find_call({}) is None
    token = current.enter_call(ctx)
    try:
        assert current.find_call({"transformer_options": {}}) is ctx
    finally:
        current.leave_call(token)
    assert current.find_call({}) is None and not any(current.live_state().values())


def test_merge_rows_gives_destination_rows_and_keeps_text():
    torch.manual_seed(0)
    plan = core.make_plan(torch.randn(2, 36, 8), 6, 6, 0.5, 3)
    pe = torch.arange(2 * 1 * (4 + 36 + 3), dtype=torch.float32).view(2, 1, 43, 1)
    merged = runner.merge_rows(pe, 2, 4, plan)
    d = plan.num_kept
    assert merged.shape == (2, 1, 4 + d + 3, 1)
    assert torch.equal(merged[:, :, :4], pe[:, :, :4]) and torch.equal(merged[:, :, 4 + d:], pe[:, :, 40:])
    expected = torch.stack([pe[b, 0, 4 + plan.dst_index[b], 0] for b in range(2)])
    assert torch.equal(merged[:, 0, 4:4 + d, 0], expected)


def test_merge_rows_broadcasts_batch_one():
    plan = core.make_plan(torch.randn(2, 16, 8), 4, 4, 0.5, 2)
    pe = torch.randn(1, 1, 20, 3)
    assert runner.merge_rows(pe, 2, 4, plan).shape == (2, 1, 4 + plan.num_kept, 3)


def test_merge_mask_square_and_refuses_other_layouts():
    plan = core.make_plan(torch.randn(1, 16, 8), 4, 4, 0.5, 2)
    mask = torch.randn(1, 20, 20)
    merged = flux.merge_mask(mask, plan, 4, 20)
    d = plan.num_kept
    assert not isinstance(merged, contract.Unmerged) and merged.shape == (1, 4 + d, 4 + d)
    idx = torch.cat([torch.arange(4), 4 + plan.dst_index[0]])
    assert torch.equal(merged[0], mask[0][idx][:, idx])
    assert isinstance(flux.merge_mask(torch.randn(1, 20), plan, 4, 20), contract.Unmerged)


def test_identity_plan_span_roundtrip_is_exact():
    seq = torch.randn(2, 30, 8)
    plan = core.make_plan(seq[:, 5:25], 4, 5, 0.0, 2)
    x, x_m, seq_m = runner.merge_span(seq, 5, 20, plan)
    assert torch.equal(seq_m, seq) and seq_m.data_ptr() != seq.data_ptr()
    out = seq_m * 2
    assert torch.equal(runner.unmerge_span(out, 5, plan, x, x_m), out)
