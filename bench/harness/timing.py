"""How the benches time a call: the --clock choices, one timed call with the device synchronised,
and a profiler table."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
"""The benches' --clock choices. cpu: this process's CPU time, which waiting for a core shared with
other jobs does not inflate (with one torch thread it is about the wall time the call would take
alone); wall: elapsed time (the only meaningful clock on a GPU)."""


def timed_ms(fn: Callable[[], object], args: argparse.Namespace,
             clock: Callable[[], float] = time.perf_counter) -> float:
    """Milliseconds of one fn() call on `clock`, the device synchronised before and after."""
    sync(args)
    start = clock()
    fn()
    sync(args)
    return (clock() - start) * 1000


def sync(args: argparse.Namespace) -> None:
    """Wait for the device's queued work (CUDA only)."""
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_call(call: Callable[[], torch.Tensor], args: argparse.Namespace, row_limit: int) -> None:
    """Top operators of one call after a warm-up call (torch.profiler), to see where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    call()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        call()
        sync(args)
    sort = "cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=row_limit))
