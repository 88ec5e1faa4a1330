"""The one-line summary of a sampling run: what ToMA merged, what ran unmerged and why, whether it
was bypassed, cancelled or stopped by an error, what min_tokens "auto" measured and what it gained
(gain.py). At the end of a run stats.run_record turns the run's counters into a RunRecord, the
line's facts as fields, which `RunRecord.line` prints, wrappers.py logs with the line (LogRecord
attribute TOMA_RUN) and `parse_run_line` reads back from the line's text (e.g. a server log)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from .gain import (
    AUTO_MEASURED,
    AUTO_OUTCOMES,
    MEASURED_GAIN,
    PREDICTED_GAIN,
    Gain,
    Measured,
    gain_text,
)

TOMA_RUN = "toma_run"
"""Attribute of the run line's logging.LogRecord that holds its RunRecord (wrappers.py logs it as
``extra``), so a reader in the same process needs no parsing."""

Status = Literal["cancelled", "failed", "compiled", "bypassed"]
"""What the run line says beyond its counts: the run was cancelled or stopped by an error (counts
partial), ran under torch.compile (block runs not counted), or ToMA was bypassed."""

STATUS_TEXT: dict[str, str] = {
    "cancelled": "the sampling run was cancelled; counts are partial",
    "failed": "the sampling run stopped with an error; counts are partial",
    "compiled": "torch.compile: block runs are not counted",
    "bypassed": "ToMA was bypassed: none of its block hooks ran in {eligible_calls} merge-eligible calls",
}


@dataclass(frozen=True)
class RunGain:
    """The gain a run line states (gain.Gain without its call key): call, the merged calls'
    speed-up over unmerged ones; run, the run's predicted speed-up over running without ToMA; both
    as the line prints them (2 decimals; "F.FFx slower" is 1 / F.FF); measured False when call is
    the cost model's prediction."""

    call: float
    run: float
    measured: bool

    @classmethod
    def of(cls, gain: Gain) -> RunGain:
        return cls(_stated(gain.call), _stated(gain.run), gain.measured)

    def text(self) -> str:
        """The run line's last part (gain.gain_text)."""
        return gain_text(self.call, self.run, self.measured)


def stated_auto(measured: Measured) -> Measured:
    """`measured` with its speed-ups as the run line states them (see RunGain)."""
    predicted = None if measured.predicted is None else _stated(measured.predicted)
    return Measured(measured.tokens, measured.batch, _stated(measured.speedup), predicted, measured.merge)


@dataclass(frozen=True)
class RunRecord:
    """The facts of one run line (format: `line`, read back: `parse_run_line`).

    tokens: (h, w) token grid -> (N, D) image tokens before / after merging, for every plan built,
    by grid. unmerged_calls / unmerged_blocks: reason -> model calls / block runs that ran unmerged
    for it, in the line's order (block runs without transformer_options under stats.ORPHAN_REASON, last).
    status: see Status; eligible_calls: the merge-eligible calls of a bypassed run (the line states
    them only then), else None. settings: ToMASettings.describe(). gain: None when no call merged.
    auto: the shapes min_tokens "auto" decided by measurement (gain.Measured, as stated), in the order
    it first measured them.
    """

    family: str
    tokens: dict[tuple[int, int], tuple[int, int]]
    steps_merged: int
    total_steps: int
    calls_merged: int
    total_calls: int
    blocks_selected: int
    blocks: str
    block_runs_merged: int
    plans_built: int
    unmerged_calls: dict[str, int]
    unmerged_blocks: dict[str, int]
    status: Status | None
    eligible_calls: int | None
    settings: str
    gain: RunGain | None
    auto: tuple[Measured, ...] = ()
    attention: dict[str, int] = field(default_factory=dict)
    """Scope keys_values: merged attention calls by "<kernel> as <form>" (the line's "attention:" part)."""
    plans_from_outputs: int | None = None
    """Destinations "output_similarity": the plans chosen on a block output ("n plans built, m from block outputs")."""

    def line(self) -> str:
        """The one-line run summary: its parts joined by " | "."""
        grids = "; ".join(f"{n}->{d} tokens ({h}x{w})" for (h, w), (n, d) in self.tokens.items()) or NO_TOKENS
        unmerged = [f"{n} calls {why}" for why, n in self.unmerged_calls.items()]
        unmerged += [f"{n} block runs {why}" for why, n in self.unmerged_blocks.items()]
        parts = [
            f"ToMA [{self.family}]: {grids}",
            f"merged {self.steps_merged}/{self.total_steps} steps, {self.calls_merged}/{self.total_calls} calls",
            f"{self.blocks_selected} transformer blocks selected ({self.blocks}), {self.block_runs_merged} block runs merged",
            f"{self.plans_built} plans built" + ("" if self.plans_from_outputs is None else f", {self.plans_from_outputs} {FROM_OUTPUTS}"),
            "unmerged: " + (", ".join(unmerged) or "none"),
        ]
        if self.attention:
            parts.append(ATTENTION + ", ".join(f"{n} calls {what}" for what, n in self.attention.items()))
        if self.status is not None:
            parts.append(STATUS_TEXT[self.status].format(eligible_calls=self.eligible_calls))
        parts.append(self.settings)
        if self.auto:
            parts.append("; ".join(m.text() for m in self.auto))
        if self.gain is not None:
            parts.append(self.gain.text())
        return " | ".join(parts)


NO_TOKENS = "no tokens merged"
FROM_OUTPUTS = "from block outputs"


def parse_run_line(line: str) -> RunRecord:
    """The RunRecord of a run line (as `RunRecord.line` writes it, e.g. read from a server log);
    ValueError when `line` is not one. An unmerged reason that itself contains ", <n> calls " or
    ", <n> block runs ", or a " | ", cannot be told apart from the line's separators."""
    parts = line.split(" | ")
    if len(parts) < 6:
        raise ValueError(f"not a ToMA run line: {line!r}")
    head = _match(r"ToMA \[(.*?)\]: (.*)", parts[0])
    steps = _match(r"merged (\d+)/(\d+) steps, (\d+)/(\d+) calls", parts[1])
    blocks = _match(r"(\d+) transformer blocks selected \((.*)\), (\d+) block runs merged", parts[2])
    plans = _match(rf"(\d+) plans built(?:, (\d+) {FROM_OUTPUTS})?", parts[3])
    calls, block_runs = _unmerged(_match(r"unmerged: (.*)", parts[4])[1])
    rest = parts[5:]
    attention = _attention(rest[0][len(ATTENTION):]) if rest[0].startswith(ATTENTION) else {}
    rest = rest[1:] if attention else rest
    status, eligible = _status(rest[0])
    if status is not None:
        rest = rest[1:]
    settings, extra = rest[0], rest[1:]
    gain = _gain(extra[-1]) if extra else None
    if gain is not None:
        extra = extra[:-1]
    auto = _auto(extra[0]) if len(extra) == 1 else None
    if len(extra) > 1 or (extra and auto is None):
        raise ValueError(f"not a ToMA run line: {line!r}")
    return RunRecord(
        family=head[1], tokens=_grids(head[2]),
        steps_merged=int(steps[1]), total_steps=int(steps[2]), calls_merged=int(steps[3]), total_calls=int(steps[4]),
        blocks_selected=int(blocks[1]), blocks=blocks[2], block_runs_merged=int(blocks[3]), plans_built=int(plans[1]),
        unmerged_calls=calls, unmerged_blocks=block_runs, status=status, eligible_calls=eligible,
        settings=settings, gain=gain, auto=auto or (), attention=attention,
        plans_from_outputs=None if plans[2] is None else int(plans[2]),
    )


ATTENTION = "attention: "


def _attention(text: str) -> dict[str, int]:
    """"<n> calls <kernel> as <form>, ..." -> {"<kernel> as <form>": n}."""
    found = re.findall(r"(\d+) calls (.*?)(?=, \d+ calls |$)", text)
    return {what: int(n) for n, what in found}


def _stated(speedup: float) -> float:
    """`speedup` as the run line states it: 2 decimals of the factor faster or slower (a loss too
    small to print, "1.00x slower", stays below 1)."""
    if speedup >= 1.0:
        return round(speedup, 2)
    return _slower(round(1.0 / speedup, 2))


def _slower(factor: float) -> float:
    """The speed-up of a line's "<factor>x slower"."""
    return 1.0 / factor if factor > 1.0 else math.nextafter(1.0, 0.0)


def _match(pattern: str, text: str) -> re.Match:
    match = re.fullmatch(pattern, text)
    if match is None:
        raise ValueError(f"run line part {text!r} does not match {pattern!r}")
    return match


def _grids(text: str) -> dict[tuple[int, int], tuple[int, int]]:
    if text == NO_TOKENS:
        return {}
    grids = {}
    for item in text.split("; "):
        m = _match(r"(\d+)->(\d+) tokens \((\d+)x(\d+)\)", item)
        grids[(int(m[3]), int(m[4]))] = (int(m[1]), int(m[2]))
    return grids


def _unmerged(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """(reason -> calls, reason -> block runs) of the line's "unmerged:" part."""
    calls: dict[str, int] = {}
    blocks: dict[str, int] = {}
    if text == "none":
        return calls, blocks
    for item in re.split(r", (?=\d+ (?:calls|block runs) )", text):
        m = _match(r"(\d+) (calls|block runs) (.*)", item)
        (calls if m[2] == "calls" else blocks)[m[3]] = int(m[1])
    return calls, blocks


def _status(text: str) -> tuple[Status | None, int | None]:
    """(status, merge-eligible calls of a bypassed run) of a line part, (None, None) for another part."""
    for status, wording in STATUS_TEXT.items():
        match = re.fullmatch(re.escape(wording).replace(re.escape("{eligible_calls}"), r"(\d+)"), text)
        if match:
            return status, int(match[1]) if match.groups() else None
    return None, None


FASTER = r"(\d+\.\d\d)x (faster|slower)"
"""A speed-up as the line states it: "1.71x faster", "1.25x slower"."""


def _speedup(figure: str, direction: str) -> float:
    return float(figure) if direction == "faster" else _slower(float(figure))


def _auto(text: str) -> tuple[Measured, ...] | None:
    """The shapes of the line's min_tokens "auto" part (gain.AUTO_MEASURED, joined by "; "), None for another part."""
    fields = {"tokens": r"(\d+)", "batch": r"(\d+)", "speedup": FASTER,
              "predicted": f"(?:predicted {FASTER}|no prediction)", "outcome": "(" + "|".join(AUTO_OUTCOMES.values()) + ")"}
    pattern = re.escape(AUTO_MEASURED)
    for name, wording in fields.items():
        pattern = pattern.replace(re.escape("{" + name + "}"), wording)
    found = []
    for item in text.split("; "):
        m = re.fullmatch(pattern, item)
        if m is None:
            return None
        predicted = None if m[5] is None else _speedup(m[5], m[6])
        merge = next(merge for merge, outcome in AUTO_OUTCOMES.items() if outcome == m[7])
        found.append(Measured(int(m[1]), int(m[2]), _speedup(m[3], m[4]), predicted, merge))
    return tuple(found)


def _gain(text: str) -> RunGain | None:
    """The gain part (gain.MEASURED_GAIN or PREDICTED_GAIN), None for another part."""
    for wording in (MEASURED_GAIN, PREDICTED_GAIN):
        pattern = re.escape(wording).replace(re.escape("{call}"), FASTER).replace(re.escape("{run}"), FASTER)
        m = re.fullmatch(pattern, text)
        if m is not None:
            return RunGain(_speedup(m[1], m[2]), _speedup(m[3], m[4]), measured=wording is MEASURED_GAIN)
    return None
