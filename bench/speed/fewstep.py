"""What the basic ToMA Patch node does on a model's run: which steps fall in its merge window, how many
blocks it merges, the run line's few-step warning, and the real-size predicted speed-up.

    python -m bench.speed.fewstep --families flux2_klein4b zimage --start-percent 0.4 0.2 0
    python -m bench.speed.fewstep --families flux2 --steps 20 28 50

The run's sigmas come from ComfyUI's own code on the family's real model_sampling
(bench/speed/realsize_setup.py: ``calculate_sigmas`` with the workflow's ModelSampling node, or the
Flux2Scheduler node for Flux.2), the window from that model_sampling's ``percent_to_sigma``, and each
evaluation is decided by the pack's ``MergeSchedule.decide`` as the APPLY_MODEL wrapper decides it. The
warning is the node's own (nodes/run/stats.py ``schedule_warning``). The speed-up is the real-size cost
model's (bench/speed/realsize_model.py) from the cached probes; "not probed" where the family has none.
Settings other than start_percent are the basic node's defaults (nodes/settings.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import torch

from . import realsize as rsize
from . import realsize_model as model
from . import realsize_setup as rs


@dataclass(frozen=True)
class WindowRun:
    """One run at one start_percent: its schedule (sigmas, steps + 1 values, last 0), the window's
    start sigma, the steps the window merges, and the node's warning (None when it says nothing)."""

    sigmas: list[float]
    start_sigma: float
    merged_steps: list[int]
    warning: str | None

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1


def node_setting(start_percent: float) -> model.Setting:
    """The basic node's defaults (nodes/settings.py) with this start_percent."""
    settings = rs.pack_module("nodes.settings")
    return model.Setting(settings.NODE_RATIO, settings.NODE_TILE_SIZE, start_percent)


def window_run(name: str, resolution: str, start_percent: float, steps: int | None = None) -> WindowRun:
    """The merge window of the basic node (at `start_percent`) on the family's usual run (or `steps`)."""
    fam = rs.family(name)
    setting = node_setting(start_percent)
    schedule = setting.schedule()
    sigmas = [float(s) for s in rs.run_sigmas(name, resolution, steps or fam.steps, fam.scheduler)]
    window = schedule.window(rs.model_sampling(name, resolution).percent_to_sigma)
    merged = [i for i, s in enumerate(sigmas[:-1]) if schedule.decide(s, sigmas, window).merge]
    settings_mod = rs.pack_module("nodes.settings")
    stats_mod = rs.pack_module("nodes.run.stats")
    node = settings_mod.ToMASettings(ratio=setting.ratio, tile_size=setting.tile_size, schedule=schedule)
    stats = stats_mod.RunStats(total_steps=len(sigmas) - 1, planned_steps=len(merged))
    return WindowRun(sigmas, window.start_sigma, merged, stats_mod.schedule_warning(node, stats))


def steps_text(merged: list[int], steps: int) -> str:
    """E.g. '2/4 (steps 3-4)', steps counted from 1 as ComfyUI's progress bar counts them."""
    if not merged:
        return f"0/{steps}"
    span = f"{merged[0] + 1}-{merged[-1] + 1}" if len(merged) > 1 else f"{merged[0] + 1}"
    return f"{len(merged)}/{steps} (step{'s' if len(merged) > 1 else ''} {span})"


def rows(names: list[str], starts: list[float], step_counts: list[int | None], cache: dict[str, Any],
         plans: Any) -> list[str]:
    """A markdown row per family, step count and start_percent."""
    out = ["| model | run | start_percent | window starts at sigma | steps merged | blocks merged (auto) | "
           "predicted speed-up | run line warns |", "|---|---|---:|---:|---|---:|---:|---|"]
    for name in names:
        fam = rs.family(name)
        resolution = fam.resolution
        try:
            cost = model.fit_family(name, cache)
        except ValueError:
            cost = None
        for steps in step_counts:
            for start in starts:
                run = window_run(name, resolution, start, steps)
                setting = node_setting(start)
                sites = rs.block_sites(name, setting.blocks)
                speed = "not probed"
                if cost is not None:
                    p = model.predict(cost, resolution, setting, fam.frames, run.steps, plan_ms=plans)
                    speed = f"**{p.speedup:.2f}x**"
                calls = rs.calls_per_evaluation(name)
                run_label = (f"{resolution}{f', {fam.frames} frames' if fam.video else ''}, {run.steps} steps {fam.sampler} / "
                             f"{fam.scheduler}, cfg {fam.cfg:g}{' (2 samples per call)' if calls > 1 else ''}")
                warns = "no" if run.warning is None else f"yes: \"{run.warning}\""
                out.append(f"| {fam.title} | {run_label} | {start:g} | {run.start_sigma:.3f} | {steps_text(run.merged_steps, run.steps)} | "
                           f"{sum(s.selected for s in sites)}/{len(sites)} | {speed} | {warns} |")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=["flux2_klein4b", "flux2_klein9b", "zimage"], choices=list(rs.FAMILIES))
    p.add_argument("--start-percent", nargs="+", type=float, default=None,
                   help="start_percent values (default: the node's, nodes/settings.py NODE_START_PERCENT)")
    p.add_argument("--steps", nargs="+", type=int, default=None, help="step counts (default: each family's usual run)")
    p.add_argument("--sigmas", action="store_true", help="also print each run's sigma schedule")
    p.add_argument("--cache", default=str(rsize.CACHE))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rs.import_comfy()
    starts = args.start_percent or [rs.pack_module("nodes.settings").NODE_START_PERCENT]
    cache = rsize.load_cache(rsize.Path(args.cache))
    plans = rsize.PlanTimes(cache, "cpu")
    print("\n".join(rows(args.families, starts, args.steps or [None], cache, plans)))
    if args.sigmas:
        for name in args.families:
            fam = rs.family(name)
            for steps in args.steps or [None]:
                run = window_run(name, fam.resolution, starts[0], steps)
                print(f"{fam.title}, {run.steps} steps: sigmas " + ", ".join(f"{s:.3f}" for s in run.sigmas))
    return 0


if __name__ == "__main__":
    sys.exit(main())
