"""How the benches time calls: the --clock choices, one timed call with the device synchronised, the
one round-robin timer every speed figure comes from (``samples_ms``; ``median_ms`` its medians), and
a profiler table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch

Clock = Callable[[], float]

CLOCKS: dict[str, Clock] = {"cpu": time.process_time, "wall": time.perf_counter}
"""The benches' --clock choices. cpu: this process's CPU time, which waiting for a core shared with
other jobs does not inflate (with one torch thread it is about the wall time the call would take
alone); wall: elapsed time (the only meaningful clock on a GPU)."""


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work (CUDA only)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed_ms(fn: Callable[[], object], device: str | torch.device, clock: Clock = time.perf_counter) -> float:
    """Milliseconds of one fn() call on `clock`, the device synchronised before and after."""
    sync(device)
    start = clock()
    fn()
    sync(device)
    return (clock() - start) * 1000


def samples_ms(calls: Mapping[str, Callable[[], object]], device: str | torch.device, *, warmup: int, repeats: int,
               clock: Clock = time.perf_counter, before: Mapping[str, Callable[[], object]] | None = None,
               per_turn: int = 1) -> dict[str, list[float]]:
    """The one timer of the benches: ms of each timed call of each entry on `clock`. `warmup`
    untimed rounds, then `repeats` timed ones; in every round the entries take turns (round-robin),
    so that load changes on a shared machine hit every configuration alike, and each turn makes
    `per_turn` calls. ``before[name]()``, when given, runs untimed before each of that entry's turns
    (e.g. loading its patcher, as sampling does)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(warmup + repeats):
        for name, fn in calls.items():
            if before is not None:
                before[name]()
            ms = [timed_ms(fn, device, clock) for _ in range(per_turn)]
            if round_index >= warmup:
                times[name] += ms
    return times


def median_ms(calls: Mapping[str, Callable[[], object]], device: str | torch.device, *, warmup: int, repeats: int,
              clock: Clock = time.perf_counter, before: Mapping[str, Callable[[], object]] | None = None,
              per_turn: int = 1) -> dict[str, float]:
    """Median ms per call of each entry, timed by ``samples_ms``."""
    times = samples_ms(calls, device, warmup=warmup, repeats=repeats, clock=clock, before=before, per_turn=per_turn)
    return {name: statistics.median(values) for name, values in times.items()}


def profile_call(call: Callable[[], torch.Tensor], device: str | torch.device, row_limit: int) -> None:
    """Top operators of one call after a warm-up call (torch.profiler), to see where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    call()
    cuda = str(device).startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        call()
        sync(device)
    print(prof.key_averages().table(sort_by="cuda_time_total" if cuda else "self_cpu_time_total", row_limit=row_limit))
