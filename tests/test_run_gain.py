"""What a run says about itself, without ComfyUI: the measured gain (from recorded call times on an
injected clock), the cost model's figure where no unmerged call ran, the warning when merged calls
were slower, min_tokens "auto" (the prediction where it is sure; where it is close, the run's timing:
`judge` with given durations, then whole runs through the APPLY_MODEL wrapper on an injected clock),
ratio 0 reported as such, and schedules that merge (almost) no step."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from harness.pack import PACK_NAME, pack_module

runtime = pack_module("nodes.run.runtime")
contract = pack_module("nodes.contract")
config_mod = pack_module("nodes.run.config")
wrappers = pack_module("nodes.run.wrappers")
settings_mod = pack_module("nodes.settings")
report = pack_module("nodes.run.report")
stats_mod = pack_module("nodes.run.stats")
gain_mod = pack_module("nodes.run.gain")
prediction_mod = pack_module("nodes.run.prediction")
judge_mod = pack_module("nodes.run.judge")
core = pack_module("toma_core")
cost = pack_module("toma_core.cost")
constants = pack_module("toma_core.cost_constants")

SIGMAS = [10.0, 7.5, 5.0, 2.5, 0.0]


class FakeAdapter:
    family, blocks, num_blocks = "fake", "all", 2

    def call_geometry(self, x, context, kwargs):
        return contract.CallGeometry(x.shape[-2], x.shape[-1], None if context is None else context.shape[1])


class FakeClock:
    """Seconds that advance only when a fake model call says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state_of(sigmas=SIGMAS, cost_profile=None, **kwargs) -> runtime.RunState:
    config = config_mod.ToMAConfig(settings_mod.ToMASettings(**kwargs), FakeAdapter(), cost_profile)
    state = runtime.RunState(config)
    state.begin_run(lambda p: 10.0 * (1 - p), torch.tensor(sigmas))
    return state


def sample(state, clock: FakeClock, merged_s, unmerged_s, sigmas=SIGMAS, shape=(2, 4, 8, 8)) -> None:
    """One model call per step through the APPLY_MODEL wrapper on a latent of `shape` (B, C, H, W:
    H x W image tokens, cond and uncond when B is 2); a merged call runs its blocks merged and takes
    merged_s on the clock, an unmerged one unmerged_s (seconds, or a function of the step's index)."""
    batch = shape[0]
    for step, sigma in enumerate(sigmas[:-1]):
        options = {"sigmas": torch.tensor([sigma]), "sample_sigmas": torch.tensor(sigmas),
                   "cond_or_uncond": [0, 1][:batch], "uuids": ["a", "b"][:batch], settings_mod.TOMA_KEY: state}

        def executor(*args, step=step, **kwargs):
            ctx = args[5][settings_mod.CALL_KEY]
            if ctx.merge:
                ctx.record_block(True)
            seconds = merged_s if ctx.merge else unmerged_s
            clock.now += seconds(step) if callable(seconds) else seconds
            return args[0]

        wrappers.apply_model_wrapper(executor, torch.zeros(shape), torch.tensor([sigma]), None, torch.zeros(batch, 5, 3), None, options)


def gain_of(state):
    return gain_mod.measure_gain(state.timer.calls(), state.predicted_speedup)


def test_gain_is_computed_from_the_recorded_call_times():
    clock = FakeClock()
    state = state_of(schedule=core.MergeSchedule(0.0, 0.5))  # steps 0, 1 merge; 2, 3 do not
    state.timer = gain_mod.CallTimer(clock)
    sample(state, clock, merged_s=1.0, unmerged_s=2.0)
    gain = gain_of(state)
    assert gain.measured and gain.call == pytest.approx(2.0)
    assert gain.run == pytest.approx((4 * 2.0) / (2 * 1.0 + 2 * 2.0))
    record = report.parse_run_line(stats_mod.format_report(state.config, state.stats, 0, gain))
    assert record.gain == report.RunGain(call=2.0, run=1.33, measured=True)


def test_median_keeps_a_slow_first_call_from_counting():
    calls = [gain_mod.TimedCall((2, 64, 5), False, s) for s in (9.0, 2.0, 2.0)] + [gain_mod.TimedCall((2, 64, 5), True, 1.0)] * 2
    assert gain_mod.measure_gain(calls, lambda key: 5.0).call == pytest.approx(2.0)


def test_without_an_unmerged_call_the_cost_model_figure_is_used_and_said():
    clock = FakeClock()
    profile = prediction_mod.CostProfile((cost.BlockCost(3072, 57, merged=True),), 3072, 0.5)
    state = state_of(cost_profile=profile)  # window 0-1: every step merges
    state.timer = gain_mod.CallTimer(clock)
    sample(state, clock, merged_s=1.0, unmerged_s=2.0)
    gain = gain_of(state)
    assert not gain.measured
    assert gain.call == pytest.approx(profile.speedup(64, 5, "cpu", 2)) == pytest.approx(gain.run)
    record = report.parse_run_line(stats_mod.format_report(state.config, state.stats, 0, gain))
    figure = round(gain.call, 2)
    assert figure >= 1.0 and record.gain == report.RunGain(call=figure, run=figure, measured=False)


def test_no_merged_call_gives_no_gain():
    state = state_of(ratio=0.0)
    state.timer = gain_mod.CallTimer(FakeClock())
    sample(state, FakeClock(), merged_s=1.0, unmerged_s=2.0)
    assert gain_of(state) is None


@pytest.mark.parametrize("min_tokens, widget", [(0, "set min_tokens to auto"), ("auto", "raise min_tokens above 64")])
def test_slower_merged_calls_warn_and_name_the_widget(caplog, min_tokens, widget):
    clock = FakeClock()
    state = state_of(schedule=core.MergeSchedule(0.0, 0.5), min_tokens=min_tokens)
    state.timer = gain_mod.CallTimer(clock)
    sample(state, clock, merged_s=3.0, unmerged_s=2.0)
    with caplog.at_level(logging.WARNING, logger=f"{PACK_NAME}.nodes.run.gain"):
        gain_mod.warn_if_slower(gain_of(state), min_tokens)
        gain_mod.warn_if_slower(gain_mod.Gain(1.2, 1.1, True, (2, 64, 5)), min_tokens)  # faster: no warning
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "slower than unmerged ones (0.67x)" in warning and widget in warning


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_calls_are_timed_with_events_read_at_the_end():
    timer = gain_mod.CallTimer(lambda: pytest.fail("the CPU clock timed a CUDA call"))
    x = torch.randn(2048, 2048, device="cuda")
    for merged in (False, True, True):
        start = timer.start(x)
        for _ in range(20):
            x = torch.tanh(x @ x)
        timer.stop(start, (1, 256, 0), merged)
    unmerged, merged = timer.finished((1, 256, 0), wait=True)  # auto waits for the calls' ends: no sync before
    assert len(unmerged) == 1 and len(merged) == 2 and min(unmerged + merged) > 0
    assert all(c.seconds > 0 for c in timer.calls())


def test_auto_runs_a_call_unmerged_where_the_cost_model_predicts_no_gain():
    tiny = prediction_mod.CostProfile((cost.BlockCost(64, 4, merged=True),), 64, 0.5)
    wide = prediction_mod.CostProfile((cost.BlockCost(3072, 57, merged=True),), 3072, 0.5)
    for profile, merges in ((tiny, False), (wide, True)):
        assert not profile.predict(64, 5, "cpu", 2).close  # sure either way: the prediction decides
        state = state_of(cost_profile=profile, min_tokens="auto")
        sample(state, FakeClock(), 1.0, 1.0)
        assert (state.stats.merged_calls > 0) is merges
    state = state_of(cost_profile=tiny, min_tokens="auto")
    sample(state, FakeClock(), 1.0, 1.0)
    (reason,) = state.stats.unmerged_calls
    assert reason.startswith("min_tokens auto: merging 64 image tokens at width 64 on cpu is predicted") and "a number in min_tokens" in reason
    forced = state_of(cost_profile=tiny, min_tokens=0)
    sample(forced, FakeClock(), 1.0, 1.0)
    assert forced.stats.merged_calls == 4  # a user's number wins


@pytest.mark.parametrize("ratio, tile, reason", [
    (0.0, 4, "ratio 0 (nothing to merge)"),
    (0.1, 2, "ratio 0.1 at tile_size 2 keeps every token"),
])
def test_a_setting_that_merges_no_token_is_reported_as_such(ratio, tile, reason):
    state = state_of(ratio=ratio, tile_size=tile)
    sample(state, FakeClock(), 1.0, 1.0)
    record = report.parse_run_line(stats_mod.format_report(state.config, state.stats, 0))
    assert state.stats.merged_calls == state.stats.eligible_calls == state.stats.block_runs_merged == 0
    assert record.unmerged_calls == {reason: 4} and record.steps_merged == 0 and record.total_steps == 4
    assert not stats_mod.bypassed(state.config, state.stats, 0)
    assert stats_mod.schedule_warning(state.config.settings, state.stats) is None


def test_block_count_says_what_it_counts():
    record = report.parse_run_line(stats_mod.format_report(state_of().config, state_of().stats, 0))
    assert record.blocks_selected == 2 and record.blocks == "all"


def steps(count: int) -> list[float]:
    return [10.0 * (1 - i / count) for i in range(count)] + [0.0]


@pytest.mark.parametrize("sigmas, start, expected", [
    (steps(20), 0.75, None),
    (steps(4), 0.75, None),
    (steps(2), 0.75, "merged none of this run's 2 steps"),
    (steps(3), 0.75, "merged none of this run's 3 steps"),
    ([10.0 - 0.1 * i for i in range(9)] + [4.0, 0.0], 0.5, "merges only 1 of this run's 10 steps"),
])
def test_a_schedule_that_merges_none_or_few_of_the_steps_warns(sigmas, start, expected):
    state = state_of(sigmas, schedule=core.MergeSchedule(start, 1.0))
    text = stats_mod.schedule_warning(state.config.settings, state.stats)
    if expected is None:
        assert text is None, text
    else:
        assert expected in text and "lower start_percent" in text


def node_default_state(count: int) -> runtime.RunState:
    """A run of `count` steps (linear sigmas, as a flow model's simple schedule) at the nodes' defaults."""
    schedule = core.MergeSchedule(settings_mod.NODE_START_PERCENT, 1.0)
    return state_of(steps(count), schedule=schedule)


@pytest.mark.parametrize("few", [1, 2, 4, 8])
def test_at_the_node_defaults_a_few_step_run_merges_its_share_or_warns(few):
    many, short = node_default_state(20), node_default_state(few)
    share = short.stats.planned_steps / few
    comparable = share >= stats_mod.FEW_STEPS_SHARE * many.stats.planned_steps / 20
    assert comparable or stats_mod.schedule_warning(short.config.settings, short.stats)


def test_a_loss_reads_as_slower():
    assert "merged calls 1.25x slower than unmerged ones" in gain_mod.Gain(0.8, 0.9, True, (1, 64, 0)).text()


def long_run(count: int, start: float, min_tokens: int | str, merged_s: float, unmerged_s: float) -> runtime.RunState:
    """A `count`-step run (no cost profile: auto has no prediction, so the measurement decides) whose
    merged calls take merged_s on the timer's clock, unmerged ones unmerged_s."""
    clock = FakeClock()
    state = state_of(steps(count), schedule=core.MergeSchedule(start, 1.0), min_tokens=min_tokens)
    state.timer = gain_mod.CallTimer(clock)
    sample(state, clock, merged_s=merged_s, unmerged_s=unmerged_s, sigmas=steps(count))
    return state


def test_auto_stops_merging_once_merged_calls_measure_slower_and_says_so():
    state = long_run(8, 0.5, "auto", merged_s=3.0, unmerged_s=2.0)  # steps 0-3 unmerged, 4-7 in the window
    assert state.stats.merged_calls == 1  # the one merged call it timed
    record = report.parse_run_line(stats_mod.format_report(state.config, state.stats, 0, gain_of(state), state.timer.measured()))
    assert record.unmerged_calls.get("merging measured 1.50x slower at this size, stopped by min_tokens auto") == 3, record
    assert record.steps_merged == 1 and record.total_steps == 8
    assert record.auto == (gain_mod.Measured(64, 2, 1 / 1.5, None, False),)


@pytest.mark.parametrize("min_tokens, merged_s, merged", [
    ("auto", 1.0, 4),  # faster
    ("auto", lambda step: 1.0 if step == 4 else 2.0 / (judge_mod.AUTO_STOP_BELOW + 0.05), 4),  # then slower within a noisy clock's reach: no flip
    (0, 3.0, 4),  # a number always merges
])
def test_auto_keeps_merging_faster_calls_and_a_number_always_merges(min_tokens, merged_s, merged):
    state = long_run(8, 0.5, min_tokens, merged_s=merged_s, unmerged_s=2.0)
    assert state.stats.merged_calls == merged
    assert not any("stopped by min_tokens auto" in reason for reason in state.stats.unmerged_calls)


# The trained Wan fixture (width 64, heads of 32, 4 of 6 blocks merged, 2,304 tokens, cfg 1) as DitCost
# sees it at the node's tiles 8 x 4 frames: at the node's scope keys_values predicted 0.97x (merged calls
# measured 0.99-1.02x, toma_core/cost_constants.py CALL_CALIBRATION), at scope block 1.24x (measured
# 1.32-1.36x); both within the model's error of 1.05x. The Wan-shaped model (width 256, 3 of 4 blocks
# merged, 1,680 tokens) at tile 4.
WAN_FIXTURE = prediction_mod.CostProfile((cost.BlockCost(64, 4, joint=False, merged=True, scope="keys_values", head=32),
                                          cost.BlockCost(64, 2, joint=False, head=32)), 64, 0.5, 256)
WAN_BLOCK = prediction_mod.CostProfile((cost.BlockCost(64, 4, joint=False, merged=True, head=32), cost.BlockCost(64, 2, joint=False, head=32)), 64, 0.5, 256)
WAN_SHAPED_TILE_4 = prediction_mod.CostProfile((cost.BlockCost(256, 3, joint=False, merged=True), cost.BlockCost(256, 1, joint=False)), 256, 0.5, 16)
FIXTURE_LATENT, SHAPED_LATENT = (1, 4, 48, 48), (1, 4, 40, 42)
"""Latents of 2,304 and 1,680 image tokens (FakeAdapter: one token per latent pixel), batch 1."""


def test_both_predictions_of_the_report_are_close_and_a_real_size_one_is_not():
    fixture, block = WAN_FIXTURE.predict(2304, 5), WAN_BLOCK.predict(2304, 5)
    assert fixture.close and not fixture.merge and round(fixture.speedup, 2) == 0.97
    assert block.close and block.merge and round(block.speedup, 2) == 1.24
    flux = prediction_mod.CostProfile((cost.BlockCost(3072, 57, merged=True),), 3072, 0.5, 64)
    assert not flux.predict(4096, 512).close and flux.predict(4096, 512).merge  # Flux.1-dev at 1024 px: merges, as predicted
    assert flux.predict(4096, 512, "cuda").close  # not calibrated on a GPU: measured there
    on_gpu = WAN_BLOCK.predict(2304, 5, "cuda")
    assert not on_gpu.close and not on_gpu.merge  # far below on a GPU (launch-bound plan): unmerged, as predicted


@pytest.mark.parametrize("merging, unmerged, merged, merge, measured", [
    (False, [], [], False, None),  # time one unmerged call first (every call would merge, or none)
    (False, [1.31, 1.31], [], True, None),  # then merge one to time it
    (False, [1.31, 1.31], [1.0], True, 1.31),  # (a) predicted no gain, measured 1.31x faster: merges
    (False, [1.0, 1.0], [1.32], False, 1 / 1.32),  # (b) predicted a gain, measured 1.32x slower: stops
    (False, [prediction_mod.AUTO_MIN_SPEEDUP + 0.01], [1.0], True, prediction_mod.AUTO_MIN_SPEEDUP + 0.01),  # the prediction's bar
    (False, [prediction_mod.AUTO_MIN_SPEEDUP - 0.01], [1.0], False, prediction_mod.AUTO_MIN_SPEEDUP - 0.01),
    (True, [1.0], [1 / 0.95], True, 0.95),  # once merging: slower within the clock's noise goes on merging
    (True, [1.0], [1 / (judge_mod.AUTO_STOP_BELOW - 0.01)], False, judge_mod.AUTO_STOP_BELOW - 0.01),  # clearly slower stops
    (True, [1.0, 1.0, 9.0], [0.5, 1.6, 1.7], False, 1 / 1.6),  # medians: one stray call moves nothing
])
def test_judge_decides_from_measured_durations(merging, unmerged, merged, merge, measured):
    verdict = judge_mod.judge(merging, unmerged, merged)
    assert verdict.merge is merge
    assert verdict.measured == (None if measured is None else pytest.approx(measured))


def close_run(profile, latent, start: float, merged_s, unmerged_s, count: int = 4):
    """A `count`-step, cfg 1 run at min_tokens auto with `profile`'s predictions (window start_percent
    `start`), timed on a fake clock; its state and the record its run line reads back as."""
    clock = FakeClock()
    state = state_of(steps(count), profile, schedule=core.MergeSchedule(start, 1.0), min_tokens="auto")
    state.timer = gain_mod.CallTimer(clock)
    sample(state, clock, merged_s, unmerged_s, steps(count), latent)
    line = stats_mod.format_report(state.config, state.stats, 0, gain_of(state), state.timer.measured())
    return state, report.parse_run_line(line)


STARTS = [settings_mod.NODE_START_PERCENT, 0.0]
"""The node's default window (start 0.2: the last three of 4 steps merge) and every step merging."""


@pytest.mark.parametrize("start", STARTS)
def test_a_predicted_loss_that_measures_faster_merges_within_a_four_step_run(start):
    _, record = close_run(WAN_FIXTURE, FIXTURE_LATENT, start, merged_s=1.0, unmerged_s=1.31)
    timed = 1 if start == 0 else 0  # with every step merging, the first call runs unmerged to be timed
    assert record.unmerged_calls.get(gain_mod.AUTO_TIMING, 0) == timed
    assert record.calls_merged == record.steps_merged == (4 if start == 0 else 3) - timed
    (measured,) = record.auto
    assert (measured.tokens, measured.batch, measured.merge) == (2304, 1, True)
    assert measured.speedup == pytest.approx(1.31) and measured.predicted < 1.0
    assert "predicted 1.04x slower: merged from then on" in measured.text()


@pytest.mark.parametrize("start", STARTS)
def test_a_predicted_gain_that_measures_slower_stops_after_one_merged_call(start):
    state, record = close_run(WAN_BLOCK, FIXTURE_LATENT, start, merged_s=1.32, unmerged_s=1.0)
    assert record.calls_merged == 1
    stop = gain_mod.auto_stop_reason(1 / 1.32)
    assert record.unmerged_calls == ({gain_mod.AUTO_TIMING: 1, stop: 2} if start == 0 else {"outside the sigma window": 1, stop: 2})
    assert record.auto == (gain_mod.Measured(2304, 1, 1 / 1.32, pytest.approx(1.24, abs=0.005), False),)
    assert "merged 1.32x slower than unmerged, predicted 1.24x faster: unmerged from then on" in record.line()
    assert state.timer.stopped == {(1, 2304, 5): pytest.approx(1 / 1.32)}


def test_merged_calls_stay_measured_and_a_stop_is_final():
    """Merging confirmed by the first merged call, then merged calls turn slow: merging stops, and
    unmerged calls that turn slow after the stop do not restart it."""
    _, record = close_run(WAN_BLOCK, FIXTURE_LATENT, 0.0, merged_s=lambda step: 0.8 if step == 1 else 5.0,
                              unmerged_s=lambda step: 2.0 if step == 0 else 10.0, count=8)
    assert record.calls_merged == 2  # steps 1 (timed, 2.5x faster) and 2 (5 s: median 2.9 s, 0.69x)
    assert record.unmerged_calls == {gain_mod.AUTO_TIMING: 1, gain_mod.auto_stop_reason(2.0 / 2.9): 5}
    assert record.auto == (gain_mod.Measured(2304, 1, 2.0 / 2.9, pytest.approx(1.24, abs=0.005), False),)


def test_what_auto_measured_is_told_in_the_run_line_only(caplog):
    """One info line per run: auto's measurement goes to the debug log as it decides and to the
    run line (outer_sample_wrapper logs it when the run ends), never to an info line of its own."""
    with caplog.at_level(logging.DEBUG, logger=PACK_NAME):
        _, record = close_run(WAN_BLOCK, FIXTURE_LATENT, 0.0, merged_s=1.32, unmerged_s=1.0)
    (measured,) = record.auto
    told = [r for r in caplog.records if r.name.startswith(PACK_NAME)]
    assert [r.getMessage() for r in told if r.levelno >= logging.INFO] == []
    assert [r.getMessage() for r in told] == [f"ToMA: {measured.text()}"]
    assert measured.text() in record.line()


@pytest.mark.parametrize("profile, latent, merges", [
    (WAN_SHAPED_TILE_4, SHAPED_LATENT, True),  # 1.69x
    (prediction_mod.CostProfile((cost.BlockCost(64, 4, merged=True),), 64, 0.5), (2, 4, 8, 8), False),  # width 64, 64 tokens: 0.85x
])
def test_far_from_break_even_the_prediction_decides_whatever_the_clock_says(profile, latent, merges):
    for merged_s, unmerged_s in ((1.0, 9.0), (9.0, 1.0)):
        state, record = close_run(profile, latent, 0.0, merged_s, unmerged_s)
        assert not state.timer.verdicts and not record.auto
        assert record.calls_merged == (4 if merges else 0)


def test_auto_times_each_shape_on_its_own_calls():
    timer = gain_mod.CallTimer(FakeClock())
    key, other = (1, 1680, 5), (1, 64, 5)
    timer._marks += [(other, False, 0.0, 9.0), (other, True, 0.0, 1.0)]
    assert timer.measured_veto(key, 1.24) == gain_mod.AUTO_TIMING  # another shape's calls do not count
    timer._marks.append((key, False, 0.0, 1.0))
    assert timer.measured_veto(key, 1.24) is None  # merged, to be timed
    timer._marks.append((key, True, 0.0, 1.32))
    assert timer.measured_veto(key, 1.24) == gain_mod.auto_stop_reason(1 / 1.32)
    assert timer.measured_veto(other, None) is None  # 9x faster merged
    assert timer.stopped == {key: pytest.approx(1 / 1.32)}
    assert [(m.tokens, m.merge) for m in timer.measured()] == [(1680, False), (64, True)]


README = Path(__file__).resolve().parents[1] / "README.md"


def example_pattern(example: str) -> re.Pattern:
    """A README example as a pattern: its figures (1.71x, 4096->2048, 64x64) stand for any, "..." for
    anything, [flux] for any family."""
    pattern = re.escape(" ".join(example.split()))
    pattern = re.sub(r"\\\.\\\.\\\.", ".*", pattern)
    pattern = re.sub(r"\d+(?:\\\.\d+)?", r"\\d+(?:\\.\\d+)?", pattern)
    return re.compile(re.sub(r"\\\[\w+\\\]", r"\\[\\w+\\]", pattern))


def test_the_readme_example_run_line_is_what_the_code_prints():
    """Quick start step 3 quotes the run line's start and its measured gain: both as printed."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    step = text[text.index("3. Queue."):text.index("4. Compare")]
    head = re.search(r"`(ToMA \[[^`]*)`", step).group(1)
    gained = re.search(r"measured \(`([^`]*)`\)", step).group(1)
    state = long_run(4, 0.5, 0, merged_s=1.0, unmerged_s=2.0)
    state.stats.tokens[(8, 8)] = (64, 32)
    line = stats_mod.format_report(state.config, state.stats, 0, gain_of(state))
    assert example_pattern(head).match(line), (head, line)
    assert example_pattern(gained).search(line), (gained, line)


def test_auto_prices_the_keys_values_scope_by_its_attention_alone():
    """At the fake calls' 64 image tokens a width-3072 model's attention is a sliver of its work: merging
    its keys and values is predicted to gain about nothing, within the cost model's error of the bar, so
    min_tokens "auto" times one merged call against the unmerged ones and, measured no faster, runs the
    rest unmerged, where the block merge of the same model (predicted clearly faster) merges them all."""
    block = prediction_mod.CostProfile((cost.BlockCost(3072, 57, merged=True),), 3072, 0.5)
    keys_values = prediction_mod.CostProfile((cost.BlockCost(3072, 57, merged=True, scope="keys_values"),), 3072, 0.5)
    merged = {}
    for name, profile in (("block", block), ("keys_values", keys_values)):
        clock, state = FakeClock(), state_of(cost_profile=profile, min_tokens="auto")
        state.timer = gain_mod.CallTimer(clock)
        sample(state, clock, 1.0, 1.0)
        merged[name] = state.stats.merged_calls
    assert merged == {"block": 4, "keys_values": 1}


class FakeDit(torch.nn.Module):
    """A DiT as DitCost reads it: the width attribute and one block list whose block names its head count."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.hidden_size = width
        block = torch.nn.Module()
        block.num_heads = heads
        self.double_blocks = torch.nn.ModuleList([block, torch.nn.Module()])


@pytest.mark.parametrize("scope", settings_mod.SCOPES)
def test_a_dit_profile_prices_the_setting_s_scope_and_head_width(scope):
    profile = prediction_mod.DitCost("hidden_size", ("double_blocks",)).profile(FakeDit(2048, 32), 2, settings_mod.ToMASettings(scope=scope), False)
    assert [b.scope for b in profile.blocks] == [scope, "block"] and {b.head for b in profile.blocks} == {64}
    assert prediction_mod.head_width(torch.nn.ModuleList([torch.nn.Module()]), 2048) == constants.HEAD_WIDTH
