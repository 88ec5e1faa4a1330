"""What the ToMA Compare node concludes from its timed runs: the fewer-steps run that matches ToMA's
time, the verdict at equal time, and the report text.

Pure Python (no ComfyUI, no torch), so the arithmetic is unit-tested everywhere. Each run is timed
`repeats` times, interleaved with the others; its time is the median and its spread the fastest to
the slowest repeat. A run's speed-up is the unpatched median over its own, both measured in the same
node call. The verdict says first what ToMA did not do (merged nothing, or few of its steps: Merged),
then whether the timings can tell ToMA from the unpatched run at all (their spreads), then who won.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

TIME_TOLERANCE = 0.05
"""Two runs within 5 % of each other's median time count as equal time (a GPU's clock varies by a few
percent from run to run: clocks, other work); a larger gap within the spreads is too close to call."""
REPEATS_RANGE = (1, 20)
DEFAULT_REPEATS = 3
NO_RUN_LINE = "ToMA's run line: none logged (ComfyUI's log level is above INFO)."
VERDICT = "Verdict:"
"""How the one verdict line of the report starts."""


def check_repeats(repeats: int) -> int:
    """`repeats` when within REPEATS_RANGE, else ValueError naming it and the range."""
    low, high = REPEATS_RANGE
    if not low <= repeats <= high:
        raise ValueError(f"repeats={repeats} is outside the allowed range {low} - {high}")
    return repeats


@dataclass(frozen=True)
class TimedRun:
    """One contender of the comparison: its label, steps, the seconds of each timed repeat, and its
    likeness to the unpatched images (psnr in dB, ssim; None for the unpatched run itself).
    standing_out: why it is shown but not a contender (None for a contender)."""

    label: str
    steps: int
    times: tuple[float, ...]
    psnr: float | None = None
    ssim: float | None = None
    standing_out: str | None = None

    @property
    def seconds(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.times), max(self.times)

    def speedup(self, reference: TimedRun) -> float:
        return reference.seconds / self.seconds

    def overlaps(self, other: TimedRun) -> bool:
        """The spreads of the two runs' repeats overlap: their median times cannot be told apart."""
        return self.spread[0] <= other.spread[1] and other.spread[0] <= self.spread[1]


@dataclass(frozen=True)
class Merged:
    """What ToMA merged in its timed run (from its run line): merged steps of total_steps, the steps
    its settings ask to merge (`planned`, the sigma window over merge_every), the run line's main
    reason for the unmerged calls, and the change on the user's ToMA node that would make it merge."""

    steps: int
    total_steps: int
    planned: float
    reason: str
    fix: str

    FEW_SHARE = 0.5
    """Fewer merged steps than this share of the planned ones count as few (run/stats.FEW_STEPS_SHARE)."""

    @property
    def nothing(self) -> bool:
        return self.steps == 0

    @property
    def few(self) -> bool:
        return 0 < self.steps < self.FEW_SHARE * self.planned

    def text(self) -> str | None:
        """What the picture and the verdict say first, or None when ToMA merged as its settings ask."""
        if self.nothing:
            return (f"ToMA merged nothing: 0 of {self.total_steps} steps ({self.reason}). To make it merge: {self.fix}. "
                    "Its run is the unpatched model, so it is no contender.")
        if self.few:
            return f"ToMA merged only {self.steps} of {self.total_steps} steps ({self.reason}). To merge more: {self.fix}."
        return None


def fewer_steps(steps: int, unpatched_seconds: float, toma_seconds: float) -> int:
    """The step count whose run takes about as long as ToMA's: round(steps * toma / unpatched),
    at least 1 and at most `steps` (a ToMA run no faster than unpatched leaves no step to drop).

    ValueError for steps < 1 or a time that is not positive."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be at least 1")
    for name, seconds in (("unpatched_seconds", unpatched_seconds), ("toma_seconds", toma_seconds)):
        if not seconds > 0:
            raise ValueError(f"{name}={seconds} must be a positive time")
    return max(1, min(steps, round(steps * toma_seconds / unpatched_seconds)))


def no_slower(run: TimedRun, rival: TimedRun) -> bool:
    """`run`'s median took no more time than `rival`'s, within TIME_TOLERANCE."""
    return run.seconds <= rival.seconds * (1 + TIME_TOLERANCE)


def verdict(unpatched: TimedRun, toma: TimedRun, fewer: TimedRun, merged: Merged | None = None) -> str:
    """One line: what ToMA did not merge (first), then which of ToMA and fewer steps won at equal time
    (higher PSNR against the unpatched images at equal or lower time), or why neither did."""
    said = merged.text() if merged is not None else None
    if merged is not None and merged.nothing:
        return f"{VERDICT} {said}"
    contest = _contest(unpatched, toma, fewer)
    return f"{VERDICT} {said} {contest[0].upper()}{contest[1:]}" if said else f"{VERDICT} {contest}"


def _contest(unpatched: TimedRun, toma: TimedRun, fewer: TimedRun) -> str:
    speedup = f"{toma.speedup(unpatched):.2f}x of the unpatched speed"
    if toma.overlaps(unpatched):
        gap = unpatched.seconds - toma.seconds
        return (f"too close to call: ToMA ran at {speedup}, {abs(gap):.2f} s ({abs(gap) / unpatched.seconds:.0%}) "
                f"{'faster' if gap >= 0 else 'slower'}, within the spread of {_repeats(toma)} (unpatched {_span(unpatched)}, "
                f"ToMA {_span(toma)}); raise repeats, or compare at a larger size.")
    if fewer.steps >= unpatched.steps:
        return (f"ToMA does not pay here: it ran at {speedup}, too little to drop one of {unpatched.steps} steps; "
                "use the unpatched model (or fewer steps).")
    toma_text = f"ToMA {_db(toma.psnr)} in {toma.seconds:.2f} s"
    fewer_text = f"{fewer.steps} of {unpatched.steps} steps {_db(fewer.psnr)} in {fewer.seconds:.2f} s"
    closer, other = (toma, fewer) if toma.psnr > fewer.psnr else (fewer, toma)
    if no_slower(closer, other):
        if closer is toma:
            return f"ToMA wins at equal time: {toma_text} against {fewer_text} (PSNR against the unpatched image)."
        return f"fewer steps win at equal time: {fewer_text} against {toma_text} (PSNR against the unpatched image)."
    name = "ToMA's" if closer is toma else "the fewer steps'"
    gap = closer.seconds - other.seconds
    if closer.overlaps(other):
        return (f"too close to call: {name} image is closer ({toma_text}, {fewer_text}) but took {gap:.2f} s "
                f"({gap / other.seconds:.0%}) longer, within the spread of the repeats ({toma.label} {_span(toma)}, "
                f"{fewer.label} {_span(fewer)}); raise repeats.")
    return (f"no winner at equal time: {toma_text}, {fewer_text}; {name} closer image took {gap:.2f} s "
            f"({gap / other.seconds:.0%}) longer, more than {TIME_TOLERANCE:.0%} and beyond the spread of the repeats.")


def report(runs: list[TimedRun], setup: str, timing: str, toma_lines: list[str], conclusion: str) -> str:
    """The report: what was compared, how it was timed, one line per run (steps, median seconds and
    spread, speed-up, PSNR / SSIM against the first run, the unpatched one), ToMA's own run lines, the verdict."""
    reference = runs[0]
    rows = [run_text(run, reference) for run in runs]
    ran = [f"ToMA's run line: {line}" for line in toma_lines] or [NO_RUN_LINE]
    return "\n".join([setup, timing, *rows, *ran, conclusion])


def run_text(run: TimedRun, reference: TimedRun) -> str:
    """A run's report line, also its caption under the pictures."""
    low, high = run.spread
    timing = f"{run.seconds:.2f} s (repeats {low:.2f}-{high:.2f} s), {run.speedup(reference):.2f}x"
    if run is reference:
        likeness = "reference"
    elif run.standing_out is not None:
        likeness = f"not a contender: {run.standing_out}"
    else:
        likeness = f"PSNR {_db(run.psnr)}, SSIM {run.ssim:.3f}"
    return f"{run.label}: {run.steps} steps, {timing}, {likeness}"


def _span(run: TimedRun) -> str:
    return f"{run.spread[0]:.2f}-{run.spread[1]:.2f} s"


def _repeats(run: TimedRun) -> str:
    return f"{len(run.times)} repeats" if len(run.times) > 1 else "one timing each (repeats 1: no spread)"


def _db(value: float) -> str:
    return f"inf dB (identical)" if math.isinf(value) else f"{value:.2f} dB"
