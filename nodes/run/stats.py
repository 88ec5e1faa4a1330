"""A sampling run's counters and what its end makes of them. RunStats is filled eagerly by the
wrappers (wrappers.py) and the block hooks (CallContext.record_block); at the end of a run
`run_record` turns it into the run line's RunRecord (report.py), `bypassed` tells whether ToMA's
block hooks ran at all, and `schedule_warning` warns about a schedule that merges (almost) none of
a run's steps."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import ToMAConfig
from .gain import Gain, Measured
from .report import RunGain, RunRecord, Status, stated_auto

if TYPE_CHECKING:
    from ..settings import ToMASettings

FEW_STEPS_SHARE = 0.5
"""A run whose schedule merges fewer than this share of the steps its window nominally covers
((end_percent - start_percent) / merge_every of them) is warned about (few-step runs)."""


@dataclass
class RunStats:
    """Counters of one sampling run (kept eagerly; blocks add to them only outside torch.compile)."""

    total_steps: int = 0
    calls: int = 0
    merged_calls: int = 0
    steps_merged: set[int] = field(default_factory=set)
    block_runs_merged: int = 0
    plans_built: int = 0
    plans_from_outputs: int | None = None
    """Plans chosen on a block output (destinations "output_similarity"; None under the facility rule)."""
    unmerged_calls: Counter = field(default_factory=Counter)
    unmerged_blocks: Counter = field(default_factory=Counter)
    tokens: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """(h, w) grid -> (N, D) for every plan built."""
    eligible_calls: int = 0
    """Calls decided "merge" before they ran (merged_calls drops those in which no block ran)."""
    merged_per_step: Counter = field(default_factory=Counter)
    compiled: bool = False
    """The model ran under torch.compile: blocks cannot count, so no per-block accounting."""
    failed: bool = False
    """The sampling run raised: its counts are partial, and a missing block run proves no bypass."""
    cancelled: bool = False
    """The sampling run was stopped by the user (ComfyUI's interrupt): failed, and said so."""
    planned_steps: int = 0
    attention: Counter = field(default_factory=Counter)
    """Scope keys_values: merged attention calls by "<kernel> as <form>" (CallContext.note_attention)."""
    """Steps of the run's schedule that the sigma window and merge_every make merge steps."""


ORPHAN_REASON = "without transformer_options"
"""Unmerged block-run reason of the block runs that received no transformer_options (the orphans
current.orphan_count counts), stated after the block hooks' own reasons."""


def run_record(
    config: ToMAConfig, stats: RunStats, orphan_blocks: int, gain: Gain | None = None, auto: tuple[Measured, ...] = (),
) -> RunRecord:
    """The facts of a finished run (its counters, its patch's settings, its measured gain, what
    min_tokens "auto" measured: CallTimer.measured)."""
    unmerged_blocks = {str(why): n for why, n in stats.unmerged_blocks.items()}
    if orphan_blocks:
        unmerged_blocks[ORPHAN_REASON] = unmerged_blocks.get(ORPHAN_REASON, 0) + orphan_blocks
    status: Status | None = None
    if stats.cancelled:
        status = "cancelled"
    elif stats.failed:
        status = "failed"
    elif stats.compiled:
        status = "compiled"
    elif bypassed(config, stats, orphan_blocks):
        status = "bypassed"
    adapter = config.adapter
    return RunRecord(
        family=adapter.family,
        tokens=dict(sorted(stats.tokens.items())),
        steps_merged=len(stats.steps_merged), total_steps=stats.total_steps,
        calls_merged=stats.merged_calls, total_calls=stats.calls,
        blocks_selected=adapter.num_blocks, blocks=adapter.blocks,
        block_runs_merged=stats.block_runs_merged, plans_built=stats.plans_built,
        plans_from_outputs=stats.plans_from_outputs,
        unmerged_calls={str(why): n for why, n in stats.unmerged_calls.items()},
        unmerged_blocks=unmerged_blocks,
        status=status, eligible_calls=stats.eligible_calls if status == "bypassed" else None,
        settings=config.settings.describe(),
        gain=RunGain.of(gain) if gain is not None else None,
        auto=tuple(stated_auto(m) for m in auto),
        attention=dict(stats.attention),
    )


def format_report(
    config: ToMAConfig, stats: RunStats, orphan_blocks: int, gain: Gain | None = None, auto: tuple[Measured, ...] = (),
) -> str:
    """One line: tokens before/after, blocks and steps merged, plans built, what ran unmerged and
    why, the settings, what min_tokens "auto" measured, and the run's gain (measured, see gain.py)
    when a call merged."""
    return run_record(config, stats, orphan_blocks, gain, auto).line()


def schedule_warning(settings: ToMASettings, stats: RunStats) -> str | None:
    """Why a run's schedule merged none or few of its steps, naming the widget; None when it is fine
    (or merges nothing by the settings, said once when the node ran: settings.notes)."""
    steps, s = stats.total_steps, settings.schedule
    if not settings.merges or settings.effective_ratio == 0 or steps == 0:
        return None
    nominal = steps * (s.end_percent - s.start_percent) / s.merge_every
    if stats.planned_steps > 0 and stats.planned_steps >= FEW_STEPS_SHARE * nominal:
        return None
    window = f"the window start_percent {s.start_percent:g} - end_percent {s.end_percent:g}"
    if stats.planned_steps == 0:
        return f"merged none of this run's {steps} steps: {window} holds none of them; lower start_percent on the ToMA node"
    return (
        f"merges only {stats.planned_steps} of this run's {steps} steps ({window} is {nominal / steps:.0%} of the "
        f"run, about {nominal:.1f} steps); lower start_percent on the ToMA node to merge more of a few-step run"
    )


def bypassed(config: ToMAConfig, stats: RunStats, orphans: int) -> bool:
    """Merge-eligible calls ran, yet no block hook ran at all (not knowable under torch.compile)."""
    hooked = stats.block_runs_merged + sum(stats.unmerged_blocks.values()) + orphans
    return bool(config.adapter.num_blocks and stats.eligible_calls and not hooked and not stats.compiled and not stats.failed)
