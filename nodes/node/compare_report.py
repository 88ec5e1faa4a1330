"""What the ToMA Compare node concludes from its timed runs: the fewer-steps run that matches ToMA's
time, the verdict at equal time, and the report text.

Pure Python (no ComfyUI, no torch), so the arithmetic is unit-tested everywhere. A run's speed-up is
the unpatched run's seconds over its own, both measured in the same node call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TIME_TOLERANCE = 0.05
"""Two runs within 5 % of each other's time count as equal time: one timed run each, and a GPU's
clock varies by a few percent from run to run (clocks, other work)."""
NO_RUN_LINE = "ToMA's run line: none logged (ComfyUI's log level is above INFO)."
VERDICT = "Verdict:"
"""How the one verdict line of the report starts."""


@dataclass(frozen=True)
class TimedRun:
    """One sampling run of the comparison: its label, steps, seconds and likeness to the unpatched
    images (psnr in dB, ssim; None for the unpatched run itself)."""

    label: str
    steps: int
    seconds: float
    psnr: float | None = None
    ssim: float | None = None

    def speedup(self, reference: TimedRun) -> float:
        return reference.seconds / self.seconds


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
    """`run` took no more time than `rival`, within TIME_TOLERANCE."""
    return run.seconds <= rival.seconds * (1 + TIME_TOLERANCE)


def verdict(unpatched: TimedRun, toma: TimedRun, fewer: TimedRun) -> str:
    """One line: which of ToMA and fewer steps won at equal time (higher PSNR against the unpatched
    images at equal or lower time), or why neither did."""
    speedup = toma.speedup(unpatched)
    if fewer.steps >= unpatched.steps:
        return (f"{VERDICT} ToMA does not pay here: it ran at {speedup:.2f}x of the unpatched speed, too little "
                f"to drop one of {unpatched.steps} steps; use the unpatched model (or fewer steps).")
    toma_text = f"ToMA {_db(toma.psnr)} in {toma.seconds:.2f} s"
    fewer_text = f"{fewer.steps} of {unpatched.steps} steps {_db(fewer.psnr)} in {fewer.seconds:.2f} s"
    if toma.psnr > fewer.psnr and no_slower(toma, fewer):
        return f"{VERDICT} ToMA wins at equal time: {toma_text} against {fewer_text} (PSNR against the unpatched image)."
    if fewer.psnr >= toma.psnr and no_slower(fewer, toma):
        return f"{VERDICT} fewer steps win at equal time: {fewer_text} against {toma_text} (PSNR against the unpatched image)."
    return (f"{VERDICT} no winner at equal time: {toma_text}, {fewer_text}; the closer image took more than "
            f"{TIME_TOLERANCE:.0%} longer.")


def report(runs: list[TimedRun], setup: str, timing: str, toma_lines: list[str], conclusion: str) -> str:
    """The report: what was compared, how it was timed, one line per run (steps, seconds, speed-up,
    PSNR / SSIM against the first run, the unpatched one), ToMA's own run lines, the verdict."""
    reference = runs[0]
    rows = [run_text(run, reference) for run in runs]
    ran = [f"ToMA's run line: {line}" for line in toma_lines] or [NO_RUN_LINE]
    return "\n".join([setup, timing, *rows, *ran, conclusion])


def run_text(run: TimedRun, reference: TimedRun) -> str:
    """A run's report line, also its caption under the pictures."""
    likeness = "reference" if run is reference else f"PSNR {_db(run.psnr)}, SSIM {run.ssim:.3f}"
    return f"{run.label}: {run.steps} steps, {run.seconds:.2f} s, {run.speedup(reference):.2f}x, {likeness}"


def _db(value: float) -> str:
    return "inf dB (identical)" if math.isinf(value) else f"{value:.2f} dB"
