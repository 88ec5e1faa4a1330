"""How the ToMA Compare node times its runs: in rounds, each round running every contender once in
turn (unpatched and ToMA; then also the fewer steps that take ToMA's time and the step cache), so
that a machine that speeds up or slows down during the comparison (clocks, other work, a shared
CPU) weighs on the contenders it compares alike; each run
after a one-step warm-up of the same model that is not counted (loading the weights, switching
patches, first-call set-up), with the device synchronised before and after. A contender's time is
the median of its rounds (compare_report.TimedRun). The samples kept are each contender's first
timed run's; ToMA's run lines are collected from every timed run (report.TOMA_RUN records).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..run import wrappers
from ..run.report import TOMA_RUN, RunRecord


@dataclass
class Contender:
    """One contender's runs: label, model, steps, the seconds of each timed run, the first run's
    latent samples, how the clock was synchronised, and the ToMA run lines and records of each timed run."""

    label: str
    model: Any
    steps: int
    times: list[float] = field(default_factory=list)
    samples: torch.Tensor | None = None
    how: str = ""
    lines: list[list[str]] = field(default_factory=list)
    records: list[list[RunRecord]] = field(default_factory=list)


def synchronize(device: torch.device) -> str:
    """Wait until `device` has finished its queued work (CUDA, XPU and MPS run kernels
    asynchronously: a clock read without waiting times the launches, not the work); how, in words."""
    if device.type in ("cuda", "xpu"):
        getattr(torch, device.type).synchronize(device)
        return f"the clock read after torch.{device.type}.synchronize on {device}"
    if device.type == "mps":
        torch.mps.synchronize()
        return "the clock read after torch.mps.synchronize"
    if device.type == "cpu":
        return "on the CPU (nothing queued to wait for)"
    return f"on {device}, which torch cannot synchronise: each time ends when comfy.sample has copied the result off it"


def time_once(sampling, contender: Contender, callback: Callable) -> None:
    """One timed run of `contender` after its warm-up: the run's last step alone, which loads the model
    with its patches and runs a call of this size (the last step lies inside a ToMA window that ends
    at 1, so merged calls warm up too). The warm-up logs no run line: the timed run's is the run's.
    `sampling`: compare.Sampling."""
    model, steps = contender.model, contender.steps
    with wrappers.unlogged_runs():
        sampling.run(model, steps, start_step=steps - 1)
    with toma_run_lines() as (lines, records):
        contender.how = synchronize(model.load_device)
        start = time.perf_counter()
        samples = sampling.run(model, steps, callback=callback)
        synchronize(model.load_device)
        contender.times.append(time.perf_counter() - start)
    if contender.samples is None:
        contender.samples = samples
    contender.lines.append(lines)
    contender.records.append(records)


def interleaved(sampling, repeats: int, contenders: list[Contender], fewer: Callable[[Contender, Contender], Contender],
                callback: Callable) -> list[Contender]:
    """`repeats` rounds of the unpatched and ToMA runs (the first two `contenders`); `fewer(unpatched,
    toma)` then makes the fewer-steps contender from their times (the unpatched one itself when it
    would run no fewer steps); then `repeats` rounds of every contender (the fewer steps third), so
    that each pair the verdict compares was also measured side by side; skipped when they would
    only repeat the first rounds. Returns the contenders in the report's order: unpatched, ToMA,
    fewer steps[, step cache]."""
    unpatched, toma, *rest = contenders
    for _ in range(repeats):
        for contender in (unpatched, toma):
            time_once(sampling, contender, callback)
    short = fewer(unpatched, toma)
    others = ([short] if short is not unpatched else []) + rest
    for _ in range(repeats if others else 0):
        for contender in (unpatched, toma, *others):
            time_once(sampling, contender, callback)
    return [unpatched, toma, short, *rest]


class _RunLines(logging.Handler):
    """Collects ToMA's run lines (log records carrying report.TOMA_RUN) and their records while installed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.records: list[RunRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        run = getattr(record, TOMA_RUN, None)
        if run is not None:
            self.lines.append(record.getMessage())
            self.records.append(run)


@contextmanager
def toma_run_lines() -> Iterator[tuple[list[str], list[RunRecord]]]:
    """The run lines ToMA logs inside the block (what it merged, and why not) and their RunRecords,
    as lists filled in place; also where the log level is above INFO (the lines then reach only this
    collector, not the log)."""
    handler = _RunLines()
    logger = logging.getLogger(wrappers.__name__)
    level, propagate = logger.level, logger.propagate
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
        logger.propagate = False
    logger.addHandler(handler)
    try:
        yield handler.lines, handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
