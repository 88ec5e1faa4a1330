"""The one-line summary of a sampling run: what ToMA merged, what ran unmerged and why, whether it
was bypassed, cancelled or stopped by an error, and what it gained (call_timing.py); and the
warning for a schedule that merges (almost) none of a run's steps. RunStats is filled eagerly by
the wrappers (wrappers.py) and the block hooks (CallContext.record_block)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import ToMAConfig

if TYPE_CHECKING:
    from .call_timing import Gain
    from .settings import ToMASettings

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
    """Steps of the run's schedule that the sigma window and merge_every make merge steps."""


def format_report(config: ToMAConfig, stats: RunStats, orphan_blocks: int, gain: Gain | None = None) -> str:
    """One line: tokens before/after, blocks and steps merged, plans built, what ran unmerged and
    why, the settings, and the run's gain (measured, see call_timing.py) when a call merged."""
    adapter = config.adapter
    grids = "; ".join(f"{n}->{d} tokens ({h}x{w})" for (h, w), (n, d) in sorted(stats.tokens.items())) or "no tokens merged"
    parts = [
        f"ToMA [{adapter.family}]: {grids}",
        f"merged {len(stats.steps_merged)}/{stats.total_steps} steps, {stats.merged_calls}/{stats.calls} calls",
        f"{adapter.num_blocks} transformer blocks selected ({adapter.blocks}), {stats.block_runs_merged} block runs merged",
        f"{stats.plans_built} plans built",
    ]
    unmerged = [f"{n} calls {why}" for why, n in stats.unmerged_calls.items()]
    unmerged += [f"{n} block runs {why}" for why, n in stats.unmerged_blocks.items()]
    if orphan_blocks:
        unmerged.append(f"{orphan_blocks} block runs without transformer_options")
    parts.append("unmerged: " + (", ".join(unmerged) if unmerged else "none"))
    if stats.cancelled:
        parts.append("the sampling run was cancelled; counts are partial")
    elif stats.failed:
        parts.append("the sampling run stopped with an error; counts are partial")
    elif stats.compiled:
        parts.append("torch.compile: block runs are not counted")
    elif bypassed(config, stats, orphan_blocks):
        parts.append(f"ToMA was bypassed: none of its block hooks ran in {stats.eligible_calls} merge-eligible calls")
    parts.append(config.settings.describe())
    if gain is not None:
        parts.append(gain.text())
    return " | ".join(parts)


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
