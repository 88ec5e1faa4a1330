"""What a merged call gains, predicted by the cost model (prediction.py) and measured by the run's
timer, and `min_tokens = "auto"`, which asks both (`auto_call_veto`, asked by the APPLY_MODEL wrapper,
wrappers.py).

min_tokens "auto" merges a call where its whole range is at least AUTO_MIN_SPEEDUP and runs it
unmerged where its whole range is below: there the prediction decides, a pure function of the call's
shape, and the run does not depend on the clock. Where the range holds AUTO_MIN_SPEEDUP
(`Prediction.close`), or without a cost model, the run measures instead (`CallTimer.measured_veto`; the decision is judge.py `judge`, a pure function of the
measured durations): it times an unmerged call of that shape (one outside the sigma window, or else
the first merge-eligible one, run unmerged for it), then a merged one, and from the next call on the
measurement decides, against the bar the prediction had to clear (AUTO_MIN_SPEEDUP). Merged calls
stay measured: once merging, a shape measured clearly slower merged (AUTO_STOP_BELOW) stops merging
for the rest of the run. A wrong prediction is so corrected in either direction by a shape's third
call, within a 4-step run, and the run line says what was measured and decided. Under torch.compile
(the first call of each kind compiles) the prediction decides.

Measured (`CallTimer`): the time of each model call, merged or not, and the sentence the run's log
line ends with. On a GPU each call is bracketed by two CUDA events on the current stream, read at the
end of the run by waiting for each end event (every GPU's, under MultiGPU CFG Split); while auto
still has a shape to time, the next call of it first waits for the calls before to finish
(`torch.cuda.Event.synchronize`), so the decision reads the device's time and is in time. On the CPU
a monotonic clock (time.perf_counter, or the clock a test injects) brackets the call.

Merged calls are compared with unmerged calls of the same batch and token count (the steps outside
the merge window, between merge steps, or timed for auto), by median. A run without such an
unmerged call gives the cost model's speed-up instead, labelled "predicted" in its run line: it is
never presented as measured. A merged call that a step cache skipped is not timed (wrappers.py); an
unmerged one it skipped cannot be told apart and counts as a fast unmerged call, which can make auto
stop merging, never start.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...toma_core.kernels import Kernel
from ..contract import CallGeometry
from .judge import Verdict, judge
from .prediction import CostProfile

log = logging.getLogger(__name__)

CallKey = tuple[int, int, int]
"""(batch, image tokens, text + pass-through tokens) of a call: only calls of one key are compared."""


def call_key(batch: int, geometry: CallGeometry) -> CallKey:
    """The timer's key of a call of batch `batch` with this token layout."""
    return (batch, geometry.tokens, geometry.others)


@dataclass(frozen=True)
class TimedCall:
    key: CallKey
    merged: bool
    seconds: float


AUTO_TIMING = "timed unmerged by min_tokens auto (the prediction is within the cost model's error)"
"""Unmerged-call reason of a call min_tokens "auto" runs unmerged to time it: a shape whose prediction
is close, with no unmerged call timed yet (every call of the run would merge)."""


def auto_stop_reason(ratio: float) -> str:
    """The unmerged-call reason of a shape min_tokens "auto" stopped merging, measured at `ratio`."""
    return f"merging measured {_faster(ratio)} at this size, stopped by min_tokens auto"


@dataclass(frozen=True)
class Measured:
    """What min_tokens "auto" measured for one call shape of a run (the run line's auto part): the
    shape (image tokens, batch), the measured and the predicted speed-up (None without a cost model)
    and whether it merged from then on."""

    tokens: int
    batch: int
    speedup: float
    predicted: float | None
    merge: bool

    def text(self) -> str:
        predicted = "no prediction" if self.predicted is None else f"predicted {_faster(self.predicted)}"
        return AUTO_MEASURED.format(
            tokens=self.tokens, batch=self.batch, speedup=_faster(self.speedup), predicted=predicted,
            outcome=AUTO_OUTCOMES[self.merge],
        )


AUTO_MEASURED = "min_tokens auto timed {tokens} image tokens (batch {batch}): merged {speedup} than unmerged, {predicted}: {outcome}"
"""The run line's words for one shape min_tokens "auto" decided by measurement (report.parse_run_line
reads them back; shapes are joined by "; ")."""

AUTO_OUTCOMES = {True: "merged from then on", False: "unmerged from then on"}


@dataclass
class CallTimer:
    """Start/stop marks of a run's model calls. clock: seconds, monotonic (CPU calls). device: the
    device type of the last call started ("cpu", "cuda", ...). verdicts: min_tokens "auto"'s decision
    for each shape whose prediction is close; predicted: that prediction's speed-up (None without a
    cost model)."""

    clock: Callable[[], float] = time.perf_counter
    device: str = "cpu"
    verdicts: dict[CallKey, Verdict] = field(default_factory=dict)
    predicted: dict[CallKey, float | None] = field(default_factory=dict)
    _marks: list[tuple[CallKey, bool, Any, Any]] = field(default_factory=list)
    _finished: dict[CallKey, tuple[list[float], list[float]]] = field(default_factory=dict)
    _read: int = 0

    def start(self, x: torch.Tensor) -> Any:
        """A start mark for a call on x's device: a recorded CUDA event, or the clock's reading."""
        self.device = x.device.type
        if x.is_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(x.device))
            return event
        return self.clock()

    def stop(self, start: Any, key: CallKey, merged: bool) -> None:
        """End the call begun at `start` (same kind of mark), merged or not."""
        if isinstance(start, torch.cuda.Event):
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(start.device))  # the call's GPU, whichever is current
        else:
            end = self.clock()
        self._marks.append((key, merged, start, end))

    def measured_veto(self, key: CallKey, predicted: float | None) -> str | None:
        """min_tokens "auto", before a merge-eligible call of `key` whose prediction is close: why it
        runs unmerged, or None when it merges (`judge` of the shape's finished calls; a stop is final).
        predicted: the prediction's speed-up, for the run line (None without a cost model). While the shape is still to be
        timed, the calls before are waited for (CUDA), so that the decision is in time."""
        verdict = self.verdicts.get(key)
        if verdict is None or not verdict.stopped:
            timing = verdict is None or verdict.measured is None
            decided = judge(not timing and verdict.merge, *self.finished(key, wait=timing))
            if timing or not decided.merge:  # kept: the measurement that decided, until merging stops
                if decided.measured is not None:  # debug: the run line states it (`measured`), one info line per run
                    log.debug("ToMA: %s", Measured(key[1], key[0], decided.measured, predicted, decided.merge).text())
                self.verdicts[key], self.predicted[key] = decided, predicted
                verdict = decided
        if verdict.merge:
            return None
        return AUTO_TIMING if verdict.measured is None else auto_stop_reason(verdict.measured)

    @property
    def stopped(self) -> dict[CallKey, float]:
        """The shapes min_tokens "auto" measured and runs unmerged, with their measured speed-up."""
        return {key: verdict.measured for key, verdict in self.verdicts.items() if verdict.stopped}

    def measured(self) -> tuple[Measured, ...]:
        """What min_tokens "auto" measured in this run: one entry per shape it decided by measurement,
        with the measurement that decided (a stop's, once merging stopped)."""
        return tuple(
            Measured(key[1], key[0], verdict.measured, self.predicted[key], verdict.merge)
            for key, verdict in self.verdicts.items() if verdict.measured is not None
        )

    def finished(self, key: CallKey, wait: bool = False) -> tuple[list[float], list[float]]:
        """Seconds of the finished (unmerged, merged) calls of `key`, in call order. A CUDA call has
        finished once its end event has (no synchronisation); `wait`: wait for every call's end."""
        while self._read < len(self._marks):
            mark, merged, start, end = self._marks[self._read]
            if isinstance(end, torch.cuda.Event) and not end.query():
                if not wait:
                    break
                end.synchronize()
            self._finished.setdefault(mark, ([], []))[1 if merged else 0].append(_seconds(start, end))
            self._read += 1
        return self._finished.get(key, ([], []))

    def calls(self) -> list[TimedCall]:
        """The run's timed calls; CUDA marks are read here (after waiting for each call's end event)."""
        for _, _, _, end in self._marks:
            if isinstance(end, torch.cuda.Event):
                end.synchronize()  # torch.cuda.synchronize() waits for the current GPU only; MultiGPU CFG Split times several
        return [TimedCall(key, merged, _seconds(start, end)) for key, merged, start, end in self._marks]


def _seconds(start: Any, end: Any) -> float:
    if isinstance(start, torch.cuda.Event):
        return start.elapsed_time(end) / 1000.0
    return float(end - start)


def auto_call_veto(
    cost: CostProfile | None, timer: CallTimer, geometry: CallGeometry, device: str, batch: int, measure: bool,
    kernel: Kernel | None = None,
) -> str | None:
    """min_tokens "auto": why this call runs unmerged, or None when it merges. The prediction decides
    where its error range leaves no doubt; where it is close, or without a cost model, the run's own
    timing of the shape decides (CallTimer.measured_veto) when `measure` (False under torch.compile:
    there the prediction decides, and without a cost model the call merges). The prediction prices
    the call's attention `kernel` (None: the device's default, prediction.default_kernel)."""
    prediction = cost.predict(geometry.tokens, geometry.others, device, batch, kernel) if cost is not None else None
    if measure and (prediction is None or prediction.close):
        return timer.measured_veto(call_key(batch, geometry), prediction.speedup if prediction is not None else None)
    return cost.auto_veto(geometry, device, batch, kernel) if cost is not None else None


@dataclass(frozen=True)
class Gain:
    """A run's gain. call: merged vs unmerged call speed-up (measured, or predicted when `measured`
    is False); run: the run's model calls' predicted time without ToMA over their time with it."""

    call: float
    run: float
    measured: bool
    key: CallKey

    def text(self) -> str:
        """The run line's gain (gain_text)."""
        return gain_text(self.call, self.run, self.measured)


MEASURED_GAIN = "merged calls {call} than unmerged ones; this run about {run} than without ToMA (predicted for all-unmerged)"
PREDICTED_GAIN = (
    "merged calls predicted {call} by the cost model (no unmerged call of their size to measure); "
    "this run predicted about {run} than without ToMA"
)
"""The run line's gain, worded for measured figures and for the cost model's (report.parse_run_line
reads both back); {call} and {run} are "1.71x faster" or "1.25x slower"."""


def gain_text(call: float, run: float, measured: bool) -> str:
    """The run line's gain: measured figures as such; without an unmerged call of the merged calls'
    shape, the cost model's figures, each labelled "predicted"."""
    return (MEASURED_GAIN if measured else PREDICTED_GAIN).format(call=_faster(call), run=_faster(run))


def _faster(speedup: float) -> str:
    """"1.71x faster", or "1.25x slower" for a speed-up of 0.8."""
    return f"{speedup:.2f}x faster" if speedup >= 1.0 else f"{1.0 / speedup:.2f}x slower"


def measure_gain(calls: list[TimedCall], predicted: Callable[[CallKey], float]) -> Gain | None:
    """The gain of a run's timed calls; None when no call merged. predicted(key): the cost model's
    speed-up of a merged call of that key, used where no unmerged call of the key ran."""
    merged = [c for c in calls if c.merged]
    if not merged:
        return None
    ratios = {key: _measured_ratio(calls, key) for key in {c.key for c in merged}}
    main = max(ratios, key=lambda k: (ratios[k] is not None, sum(c.key == k for c in merged)))
    without = sum(c.seconds * (ratios[c.key] or predicted(c.key)) if c.merged else c.seconds for c in calls)
    with_toma = sum(c.seconds for c in calls)
    measured = ratios[main] is not None
    call = ratios[main] if measured else predicted(main)
    return Gain(call, without / with_toma if with_toma > 0 else 1.0, measured, main)


def _measured_ratio(calls: list[TimedCall], key: CallKey) -> float | None:
    """Median unmerged over median merged time of the calls of `key`; None without unmerged ones."""
    merged = [c.seconds for c in calls if c.key == key and c.merged]
    unmerged = [c.seconds for c in calls if c.key == key and not c.merged]
    if not merged or not unmerged:
        return None
    fast = statistics.median(merged)
    return statistics.median(unmerged) / fast if fast > 0 else None


def warn_if_slower(gain: Gain | None, min_tokens: int | str) -> None:
    """Warn when a run's merged calls were measured not faster than its unmerged ones, naming the
    widget that stops merging at this size."""
    if gain is None or not gain.measured or gain.call >= 1.0:
        return
    tokens = gain.key[1]
    fix = (
        f"raise min_tokens above {tokens} on ToMA Patch (Advanced)" if min_tokens == "auto"
        else "set min_tokens to auto on ToMA Patch (Advanced)"
    )
    log.warning(
        "ToMA: merged calls were slower than unmerged ones (%.2fx) at %d image tokens: merging does not pay "
        "for this model at this size; %s, or remove the ToMA node", gain.call, tokens, fix,
    )
