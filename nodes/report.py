"""The one-line summary of a sampling run: what ToMA merged, what ran unmerged and why, and whether
it was bypassed. RunStats is filled eagerly by the wrappers (wrappers.py) and the
block hooks (CallContext.record_block)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .contract import ToMAConfig


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


def format_report(config: ToMAConfig, stats: RunStats, orphan_blocks: int) -> str:
    """One line: tokens before/after, blocks and steps merged, plans built, what ran unmerged and why."""
    adapter = config.adapter
    grids = "; ".join(f"{n}->{d} tokens ({h}x{w})" for (h, w), (n, d) in sorted(stats.tokens.items())) or "no tokens merged"
    parts = [
        f"ToMA [{adapter.family}]: {grids}",
        f"merged {len(stats.steps_merged)}/{stats.total_steps} steps, {stats.merged_calls}/{stats.calls} calls",
        f"{adapter.num_blocks} blocks selected ({adapter.blocks}), {stats.block_runs_merged} block runs merged",
        f"{stats.plans_built} plans built",
    ]
    unmerged = [f"{n} calls {why}" for why, n in stats.unmerged_calls.items()]
    unmerged += [f"{n} block runs {why}" for why, n in stats.unmerged_blocks.items()]
    if orphan_blocks:
        unmerged.append(f"{orphan_blocks} block runs without transformer_options")
    parts.append("unmerged: " + (", ".join(unmerged) if unmerged else "none"))
    if stats.failed:
        parts.append("the sampling run stopped with an error; counts are partial")
    elif stats.compiled:
        parts.append("torch.compile: block runs are not counted")
    elif bypassed(config, stats, orphan_blocks):
        parts.append(f"ToMA was bypassed: none of its block hooks ran in {stats.eligible_calls} merge-eligible calls")
    parts.append(config.settings.describe())
    return " | ".join(parts)


def bypassed(config: ToMAConfig, stats: RunStats, orphans: int) -> bool:
    """Merge-eligible calls ran, yet no block hook ran at all (not knowable under torch.compile)."""
    hooked = stats.block_runs_merged + sum(stats.unmerged_blocks.values()) + orphans
    return bool(config.adapter.num_blocks and stats.eligible_calls and not hooked and not stats.compiled and not stats.failed)
