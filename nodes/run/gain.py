"""What a merged call gains, predicted by the cost model and measured by the run's timer, and
`min_tokens = "auto"`, which asks both (the APPLY_MODEL wrapper's `_auto_veto`, wrappers.py).

Predicted (`CostProfile`): the cost model's view of a patched model (toma_core.cost), read once, when
the node runs, from the diffusion model's own modules by the family's CostModel (its registry entry):
`DitCost` for a DiT (its width and block lists; the adapter says how many blocks the setting
merges), families/unet_cost.py for the UNet. min_tokens "auto" merges a call only where it predicts
a gain of at least AUTO_MIN_SPEEDUP for the family's width, the call's token count and the plan's
tile (tile_size^2 x tile_frames tokens). It is calibrated on a CPU only: the run's measurement checks it.

Measured (`CallTimer`): the time of each model call, merged or not, and the sentence the run's log
line ends with. On a GPU each call is bracketed by two CUDA events on the current stream, read only
at the end of the run (one synchronisation, after sampling); on the CPU a monotonic clock
(time.perf_counter, or the clock a test injects) brackets it.

min_tokens "auto" also judges by measurement during the run (`CallTimer.auto_stop`, asked eagerly by
the APPLY_MODEL wrapper before each merge-eligible call, before the cost model): as soon as a shape
has unmerged calls and AUTO_MIN_MERGED merged ones that have finished, it compares their medians (the
first merged call of the shape left out: it carries one-off work such as a torch.compile trace), and
when merged calls are clearly slower (AUTO_STOP_BELOW) it stops merging calls of that shape for the
rest of the run, the run line saying why. This check needs no calibration, so on a GPU (CUDA events,
read only once finished: `torch.cuda.Event.query`, no synchronisation) it is what keeps a predicted
gain honest.

Merged calls are compared with unmerged calls of the same batch and token count (the steps outside
the merge window, or between merge steps), by median, so a first call's warm-up does not count. A run
without such an unmerged call gives the cost model's speed-up instead, labelled "predicted" in its
run line: it is never presented as measured. No call is run unmerged on purpose to measure one: that
would change the image of a run asked to merge every step, and at the nodes' defaults (start_percent
0.4) the steps before the window are the unmerged calls a measurement needs. A merged call that a
step cache skipped is not timed (wrappers.py); an unmerged one it skipped cannot be told apart and
counts, which the median absorbs while the cache skips fewer than half of those calls.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ...toma_core.cost import HEAD_WIDTH, TILE_TOKENS, BlockCost, call_speedup
from ..contract import CallGeometry
from ..settings import ToMASettings

log = logging.getLogger(__name__)

AUTO_MIN_SPEEDUP = 1.05
"""min_tokens "auto": a call merges only when its predicted speed-up is at least this (a few percent)."""


@dataclass
class CostProfile:
    """The blocks of one patched model for the cost model, with a per-geometry cache of predictions.

    width: the width reported in log lines (a UNet's first transformer level). tile_tokens: tokens
    per plan tile, tile_size^2 (x tile_frames in a video family): the plan's cost grows with it.
    """

    blocks: tuple[BlockCost, ...]
    width: int
    kept: float
    tile_tokens: int = TILE_TOKENS
    _cache: dict[tuple[int, int, str, int], float] = field(default_factory=dict, repr=False)

    def speedup(self, tokens: int, others: int, device: str = "cpu", batch: int = 1) -> float:
        """Predicted unmerged / merged time of a call of batch `batch`, N = `tokens` image tokens and
        `others` text and pass-through tokens, on a device of type `device` ("cpu", "cuda", ...)."""
        key = (tokens, others, device, batch)
        if key not in self._cache:
            self._cache[key] = call_speedup(self.blocks, tokens, others, self.kept, device, batch, self.tile_tokens)
        return self._cache[key]

    def auto_veto(self, geometry: CallGeometry, device: str, batch: int) -> str | None:
        """min_tokens "auto": why this call runs unmerged on `device`, or None when merging is predicted to pay."""
        predicted = self.speedup(geometry.tokens, geometry.others, device, batch)
        if predicted >= AUTO_MIN_SPEEDUP:
            return None
        return (
            f"min_tokens auto: merging {geometry.tokens} image tokens at width {self.width} on {device} is predicted "
            f"{predicted:.2f}x (needs {AUTO_MIN_SPEEDUP:g}x; a number in min_tokens forces merging)"
        )


class CostModel(Protocol):
    """How a family's blocks are priced: each registry entry (registry.py Family.cost) holds one."""

    def profile(self, diffusion_model: torch.nn.Module, merged_blocks: int, settings: ToMASettings, video: bool) -> CostProfile:
        """The CostProfile of a patched model whose adapter merges `merged_blocks` of its blocks; a
        `video` family's tiles span settings.tile_frames frames."""
        ...


@dataclass(frozen=True)
class DitCost:
    """The cost model's view of a DiT family: `width`, the attribute of ComfyUI's model class holding
    the block width C; `blocks`, the ModuleList attributes of its blocks on image tokens (the ones
    `blocks` selects and any others, e.g. Lumina2's noise refiner, priced at full N); `joint`: its
    text joins the blocks' self-attention (False: cross-attention, as Wan and Kandinsky 5)."""

    width: str
    blocks: tuple[str, ...]
    joint: bool = True

    def profile(self, diffusion_model: torch.nn.Module, merged_blocks: int, settings: ToMASettings, video: bool) -> CostProfile:
        width = getattr(diffusion_model, self.width)
        total = sum(len(getattr(diffusion_model, name)) for name in self.blocks)
        merged = min(merged_blocks, total)
        head = head_width(getattr(diffusion_model, self.blocks[0]), width)
        blocks = (
            BlockCost(width, merged, joint=self.joint, merged=True, scope=settings.scope, head=head),
            BlockCost(width, max(0, total - merged), joint=self.joint, head=head),
        )
        return CostProfile(blocks, width, 1.0 - settings.effective_ratio, tile_tokens(settings, video))


def head_width(blocks: torch.nn.Module, width: int) -> int:
    """The head size e of the attention in `blocks` (the keys/values scope pads it): the first
    submodule's `head_dim`, else `width` over its head count (num_heads, heads or n_heads, as
    ComfyUI's attention classes name it); HEAD_WIDTH when none says."""
    for module in blocks.modules():
        size = getattr(module, "head_dim", None)
        if isinstance(size, int) and size > 0:
            return size
        for name in ("num_heads", "heads", "n_heads"):
            count = getattr(module, name, None)
            if isinstance(count, int) and count > 0 and width % count == 0:
                return width // count
    return HEAD_WIDTH


def tile_tokens(settings: ToMASettings, video: bool) -> int:
    """Tokens per plan tile: tile_size^2, times tile_frames in a video family (the plan's cost grows with it)."""
    return settings.tile_size ** 2 * (settings.tile_frames if video else 1)


CallKey = tuple[int, int, int]
"""(batch, image tokens, text + pass-through tokens) of a call: only calls of one key are compared."""


@dataclass(frozen=True)
class TimedCall:
    key: CallKey
    merged: bool
    seconds: float


AUTO_MIN_MERGED = 2
"""Finished merged calls of one shape min_tokens "auto" needs before it judges them by measurement."""

AUTO_STOP_BELOW = 0.9
"""min_tokens "auto" stops merging a shape whose merged calls measure below this speed-up: clearly
slower, not just slower. Stopping changes the image of the rest of the run, and on a loaded machine a
call's clock is noisy (on this project's CPU consecutive unpatched runs differ by 4.5-12 % in time, docs/quality.md
"Few-step runs"), so at a break-even size a threshold of 1 made identical runs give different images."""


def auto_stop_reason(ratio: float) -> str:
    """The unmerged-call reason of a shape min_tokens "auto" stopped merging, measured at `ratio`."""
    return f"merging measured slower ({ratio:.2f}x) at this size, stopped by min_tokens auto"


@dataclass
class CallTimer:
    """Start/stop marks of a run's model calls. clock: seconds, monotonic (CPU calls). device: the
    device type of the last call started ("cpu", "cuda", ...). stopped: the shapes min_tokens "auto"
    stopped merging, with the speed-up they measured."""

    clock: Callable[[], float] = time.perf_counter
    device: str = "cpu"
    stopped: dict[CallKey, float] = field(default_factory=dict)
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
            end.record()
        else:
            end = self.clock()
        self._marks.append((key, merged, start, end))

    def auto_stop(self, key: CallKey) -> str | None:
        """min_tokens "auto", before a merge-eligible call of `key`: why it must run unmerged (its
        shape measured slower merged, now or earlier in the run), or None. Reads only finished calls."""
        if key not in self.stopped:
            ratio = self.finished_ratio(key)
            if ratio is None or ratio >= AUTO_STOP_BELOW:
                return None
            self.stopped[key] = ratio
            log.info("ToMA: %s (%d image tokens, batch %d)", auto_stop_reason(ratio), key[1], key[0])
        return auto_stop_reason(self.stopped[key])

    def finished_ratio(self, key: CallKey) -> float | None:
        """Median unmerged over median merged time of the finished calls of `key` (the first merged
        one left out); None until it has AUTO_MIN_MERGED merged calls and an unmerged one."""
        self._read_finished()
        merged, unmerged = self._finished.get(key, ([], []))
        if len(merged) < AUTO_MIN_MERGED or not unmerged:
            return None
        fast = statistics.median(merged[1:])
        return statistics.median(unmerged) / fast if fast > 0 else None

    def _read_finished(self) -> None:
        """Move the calls finished since the last read, in call order, into `_finished` (a CUDA call
        is finished once its end event is: no synchronisation)."""
        while self._read < len(self._marks):
            key, merged, start, end = self._marks[self._read]
            if isinstance(end, torch.cuda.Event) and not end.query():
                return
            self._finished.setdefault(key, ([], []))[0 if merged else 1].append(_seconds(start, end))
            self._read += 1

    def calls(self) -> list[TimedCall]:
        """The run's timed calls; CUDA marks are read here (after one synchronisation)."""
        if any(isinstance(end, torch.cuda.Event) for _, _, _, end in self._marks):
            torch.cuda.synchronize()
        return [TimedCall(key, merged, _seconds(start, end)) for key, merged, start, end in self._marks]


def _seconds(start: Any, end: Any) -> float:
    if isinstance(start, torch.cuda.Event):
        return start.elapsed_time(end) / 1000.0
    return float(end - start)


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
