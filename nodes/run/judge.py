"""min_tokens "auto" where the cost model's prediction is close (prediction.py `Prediction.close`):
the decision for a call shape, a pure function of the measured durations of its calls in this run
(`judge`), which the run's timer asks before each such call (gain.py `CallTimer.measured_veto`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .prediction import AUTO_MIN_SPEEDUP

AUTO_STOP_BELOW = 0.9
"""min_tokens "auto" stops merging a shape it measured merging once its merged calls measure below this
speed-up: clearly slower, not just slower. Stopping changes the image of the rest of the run, and on
a loaded machine a call's clock is noisy (on this project's CPU consecutive unpatched runs differ by
4.5-12 % in time, docs/quality.md "Few-step runs"), so more merged calls do not undo the first
measurement unless they are slower beyond that noise."""


@dataclass(frozen=True)
class Verdict:
    """min_tokens "auto"'s decision for the next call of a shape whose prediction is close (`judge`).
    measured: median unmerged over median merged seconds of the shape's timed calls; None while one
    of the two is still to be timed (the call then runs as the timing needs)."""

    merge: bool
    measured: float | None = None

    @property
    def stopped(self) -> bool:
        """Measured and unmerged: final for the rest of the run."""
        return self.measured is not None and not self.merge


def judge(merging: bool, unmerged: Sequence[float], merged: Sequence[float]) -> Verdict:
    """min_tokens "auto" where the prediction is close: the decision for the next call of a shape, a
    pure function of the seconds of its finished unmerged and merged calls in this run. Until both
    have been timed: an unmerged call first, then a merged one. Then the measured speed-up (median
    unmerged over median merged) decides: merge when it is at least AUTO_MIN_SPEEDUP, the bar the
    prediction had to clear; once `merging` (a measurement made it merge), stop only below
    AUTO_STOP_BELOW."""
    if not unmerged:
        return Verdict(False)
    if not merged:
        return Verdict(True)
    fast = statistics.median(merged)
    ratio = statistics.median(unmerged) / fast if fast > 0 else math.inf
    return Verdict(ratio >= (AUTO_STOP_BELOW if merging else AUTO_MIN_SPEEDUP), ratio)
