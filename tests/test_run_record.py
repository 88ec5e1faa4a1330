"""The run line and its record (nodes/run/report.py; made from a run's counters by
nodes/run/stats.py), without ComfyUI: a finished run's RunRecord formats to the line format_report
prints, and parse_run_line reads that line back to the same record, for every status, with and
without a gain, and for the unmerged reasons the code words with commas, colons and semicolons."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from harness.pack import pack_module

report = pack_module("nodes.run.report")
stats_mod = pack_module("nodes.run.stats")
config_mod = pack_module("nodes.run.config")
settings_mod = pack_module("nodes.settings")
gain_mod = pack_module("nodes.run.gain")
wrappers = pack_module("nodes.run.wrappers")
contract = pack_module("nodes.contract")
keys_values = pack_module("nodes.machinery.keys_values")
core = pack_module("toma_core")


class FakeAdapter:
    family, blocks, num_blocks = "fake", "double:0-1,single:0", 3


# Unmerged reasons as the code words them: a call reason with a colon inside parentheses, one with a
# colon and a semicolon (prediction.CostProfile.auto_veto's wording), a block reason with a tuple's
# commas, and the merge_every reason with "=".
NO_BLOCK_MERGED = wrappers.NO_BLOCK_MERGED
AUTO_VETO = (
    "min_tokens auto: merging 64 image tokens at width 64 on cpu is predicted 0.80x "
    "(needs 1.05x; a number in min_tokens forces merging)"
)
SHAPE = contract.layout_changed("attn_mask of shape (2, 1, 72, 72) is not (..., 136, 136)").reason


def stats_of(**kw) -> stats_mod.RunStats:
    """A run of 4 steps, 8 calls (cond and uncond), 2 of them unmerged for two reasons."""
    stats = stats_mod.RunStats(
        total_steps=4, calls=8, merged_calls=6, steps_merged={0, 1, 2}, block_runs_merged=17, plans_built=3,
        unmerged_calls=Counter({NO_BLOCK_MERGED: 1, AUTO_VETO: 1}), unmerged_blocks=Counter({SHAPE: 2}),
        tokens={(8, 16): (128, 64), (4, 4): (16, 8)}, eligible_calls=7,
    )
    for name, value in kw.items():
        setattr(stats, name, value)
    return stats


def config_of(**settings) -> config_mod.ToMAConfig:
    return config_mod.ToMAConfig(settings_mod.ToMASettings(**settings), FakeAdapter())


BYPASSED = {"block_runs_merged": 0, "unmerged_blocks": Counter()}
STATUSES = {
    None: {},
    "cancelled": {"failed": True, "cancelled": True},
    "failed": {"failed": True},
    "compiled": {"compiled": True},
    "bypassed": BYPASSED,
}
GAINS = [
    None,
    gain_mod.Gain(2.0, 4 / 3, True, (2, 128, 5)),
    gain_mod.Gain(0.8, 0.9, False, (2, 128, 5)),
    gain_mod.Gain(1.23456, 0.66666, True, (2, 128, 5)),
    gain_mod.Gain(0.999, 1.004, True, (2, 128, 5)),  # "1.00x slower" / "1.00x faster"
]


def round_trip(config, stats, orphans: int, gain, auto=()) -> report.RunRecord:
    """The run's record, checked against the printed line both ways."""
    line = stats_mod.format_report(config, stats, orphans, gain, auto)
    record = stats_mod.run_record(config, stats, orphans, gain, auto)
    assert record.line() == line
    assert report.parse_run_line(line) == record, line
    assert report.parse_run_line(line).line() == line
    return record


@pytest.mark.parametrize("status", list(STATUSES))
@pytest.mark.parametrize("gain", GAINS)
def test_every_status_with_and_without_gain_reads_back(status, gain):
    record = round_trip(config_of(), stats_of(**STATUSES[status]), 0, gain)
    assert record.status == status
    assert record.eligible_calls == (7 if status == "bypassed" else None)
    assert (record.gain is None) == (gain is None)


def test_the_fields_are_the_runs_counts():
    stats = stats_of()
    record = round_trip(config_of(ratio=0.25, schedule=core.MergeSchedule(0.2, 0.9, 2)), stats, 3, GAINS[1])
    assert record.family == "fake" and record.blocks == "double:0-1,single:0" and record.blocks_selected == 3
    assert record.tokens == {(4, 4): (16, 8), (8, 16): (128, 64)} and list(record.tokens) == [(4, 4), (8, 16)]
    assert (record.steps_merged, record.total_steps, record.calls_merged, record.total_calls) == (3, 4, 6, 8)
    assert (record.block_runs_merged, record.plans_built) == (17, 3)
    assert record.unmerged_calls == {NO_BLOCK_MERGED: 1, AUTO_VETO: 1}
    assert record.unmerged_blocks == {SHAPE: 2, stats_mod.ORPHAN_REASON: 3}
    assert record.settings == config_of(ratio=0.25, schedule=core.MergeSchedule(0.2, 0.9, 2)).settings.describe()
    assert record.gain == report.RunGain(2.0, 1.33, True)


ATTENTION = Counter({"sage2 (ComfyUI --use-sage-attention) as equal_mass": 12, "sage2 (KJNodes Patch Sage Attention KJ, auto) as plain": 3})
"""Scope keys_values's merged calls by kernel and form (CallContext.note_attention)."""


@pytest.mark.parametrize("status", list(STATUSES))
def test_the_attention_part_reads_back(status):
    """The kernels and forms of keys_values's merged calls, in their own part, read back with every status."""
    record = round_trip(config_of(), stats_of(attention=ATTENTION, **STATUSES[status]), 0, GAINS[1])
    assert record.attention == dict(ATTENTION) and record.status == status
    assert "| attention: 12 calls sage2 (ComfyUI --use-sage-attention) as equal_mass, 3 calls " in record.line()


def test_a_stated_speed_up_keeps_its_direction():
    slower = round_trip(config_of(), stats_of(), 0, GAINS[4]).gain
    assert slower.call < 1.0 and "1.00x slower than unmerged ones" in slower.text()
    assert slower.run == 1.0
    loss = round_trip(config_of(), stats_of(), 0, GAINS[2]).gain
    assert loss == report.RunGain(0.8, 1 / 1.11, False)


def test_a_run_without_tokens_or_unmerged_reads_back():
    stats = stats_of(tokens={}, unmerged_calls=Counter(), unmerged_blocks=Counter())
    record = round_trip(config_of(ratio=0.0), stats, 0, None)
    assert record.tokens == {} and record.unmerged_calls == {} == record.unmerged_blocks


AUTO = [
    (gain_mod.Measured(1680, 1, 1 / 1.3219, 1.2374, False),),
    (gain_mod.Measured(2304, 1, 1.3149, 0.8172, True), gain_mod.Measured(64, 2, 0.999, None, True)),
]
"""What min_tokens auto measured: a stop, and a start beside a shape without a prediction."""


@pytest.mark.parametrize("status", [None, "cancelled", "bypassed"])
@pytest.mark.parametrize("gain", [None, GAINS[1]])
@pytest.mark.parametrize("auto", AUTO)
def test_what_auto_measured_reads_back(status, gain, auto):
    record = round_trip(config_of(), stats_of(**STATUSES[status]), 0, gain, auto)
    assert [(m.tokens, m.batch, m.merge, m.predicted is None) for m in record.auto] == [
        (m.tokens, m.batch, m.merge, m.predicted is None) for m in auto]
    assert all(abs(m.speedup / n.speedup - 1) < 0.01 for m, n in zip(record.auto, auto))
    assert (record.gain is None) == (gain is None) and record.status == status


class Model(torch.nn.Module):
    """A diffusion model with a forward loop of its class (comfy.ldm.flux.model.Flux.forward_orig)."""

    def forward_orig(self, x):
        return x


def cache_loop(self, x):
    """Another node's loop, set on the instance for a call as TeaCache and MagCache do."""
    return x


def executor_of(model: torch.nn.Module) -> SimpleNamespace:
    """An APPLY_MODEL executor's class_obj: the BaseModel holding the diffusion model."""
    return SimpleNamespace(class_obj=SimpleNamespace(diffusion_model=model))


def test_a_replaced_forward_loop_is_named_in_the_call_reason():
    model = Model()
    assert wrappers.naming_loop(wrappers.IDLE_CALL, executor_of(model)) == wrappers.IDLE_CALL
    with mock.patch.multiple(model, forward_orig=cache_loop.__get__(model, Model)):
        reason = wrappers.naming_loop(wrappers.NO_BLOCK_MERGED, executor_of(model))
    assert reason.startswith(wrappers.NO_BLOCK_MERGED[:-1]) and reason.endswith(f"forward_orig is cache_loop from {__name__})")
    assert wrappers.naming_loop(wrappers.IDLE_CALL, executor_of(model)) == wrappers.IDLE_CALL  # restored after the call
    assert wrappers.naming_loop(wrappers.IDLE_CALL, SimpleNamespace()) == wrappers.IDLE_CALL  # no model to read


LOOP_MODEL = Model()
LOOP_MODEL.forward_orig = cache_loop.__get__(LOOP_MODEL, Model)

CODE_REASONS = [
    wrappers.IDLE_CALL,
    wrappers.naming_loop(wrappers.IDLE_CALL, executor_of(LOOP_MODEL)),
    wrappers.naming_loop(wrappers.NO_BLOCK_MERGED, executor_of(LOOP_MODEL)),
    keys_values.NOT_HANDED.reason,
    keys_values.NOT_REACHED.reason,
    gain_mod.AUTO_TIMING,
    gain_mod.auto_stop_reason(2 / 3),
    gain_mod.auto_stop_reason(1.1),
    config_of(ratio=0.1, tile_size=2).off_reason,
    pack_module("nodes.families.wan").S2V_REASON,
    pack_module("nodes.families.hidream").EDIT,
    pack_module("nodes.machinery.spans").NOT_MOVED.reason,
    contract.TOKENS_DIFFER.reason,
    "the layer received keyword(s) cap_mask, x_mask",  # lumina2.py's wording for two keywords
]


@pytest.mark.parametrize("reason", CODE_REASONS)
def test_the_codes_reasons_read_back_as_calls_and_as_block_runs(reason):
    stats = stats_of(unmerged_calls=Counter({reason: 2, AUTO_VETO: 1}), unmerged_blocks=Counter({reason: 4, SHAPE: 1}))
    record = round_trip(config_of(), stats, 1, GAINS[3])
    assert record.unmerged_calls == {reason: 2, AUTO_VETO: 1}
    assert record.unmerged_blocks == {reason: 4, SHAPE: 1, stats_mod.ORPHAN_REASON: 1}


def test_orphans_alone_are_their_own_block_reason():
    record = round_trip(config_of(), stats_of(unmerged_blocks=Counter()), 5, None)
    assert record.unmerged_blocks == {stats_mod.ORPHAN_REASON: 5}
    assert record.status is None  # block hooks ran (as orphans): no bypass


@pytest.mark.parametrize("text", [
    "",
    "ToMA: merged none of this run's 2 steps",
    "ToMA [fake]: no tokens merged | merged 0/4 steps, 0/4 calls",
    stats_mod.format_report(config_of(), stats_of(), 0).replace("plans built", "plans made"),
])
def test_what_is_not_a_run_line_is_refused(text):
    with pytest.raises(ValueError):
        report.parse_run_line(text)
