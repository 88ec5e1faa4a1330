"""Validation of the real-size cost model: predicted against measured end-to-end speed-ups of whole
sampling runs on models small enough to sample here.

    python -m bench.speed.realsize_validate                      # Flux 256 px and SDXL 384 px, 4 steps

The models are the timed few-block models of realsize_measure (real width: Flux hidden 3072 with
1 double + 1 single block; SDXL's real channels with one block per transformer stack), random
weights, through the family's model-sampling node (Flux: ModelSamplingFlux at the image size).
Each run is a whole comfy.sample.sample call (euler, cfg 1: one evaluation per step), unpatched and
through the pack's patch_model at each setting, in turns (U, S1, S2, ..., U), on the process CPU
clock with one thread. The prediction for the same model, size, steps and setting comes from the
cached probes (bench/speed/realsize_cpu.json) with the few-block model's own block list.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from . import realsize
from . import realsize_measure as measure
from . import realsize_model as model
from . import realsize_setup as rs

CASES = {"flux": ("256", 4, "simple"), "sdxl": ("384", 4, "normal")}
SETTINGS = [model.Setting(0.5, 4, 0.0), model.Setting(0.75, 4, 0.5)]


def sample_conditioning(name: str, width: int, height: int) -> list:
    gen = torch.Generator().manual_seed(1)
    if name == "flux":
        return [[torch.randn((1, 256, 4096), generator=gen), {"pooled_output": torch.randn((1, 768), generator=gen), "guidance": 3.5}]]
    return [[torch.randn((1, 77, 2048), generator=gen), {"pooled_output": torch.randn((1, 1280), generator=gen),
                                                        "width": width, "height": height}]]


def run_case(name: str, cost: model.FamilyCost, plans: realsize.PlanTimes, rounds: int) -> list[dict]:
    import comfy.sample

    resolution, steps, scheduler = CASES[name]
    width, height = rs.RESOLUTIONS[resolution]
    base = rs.workflow_patcher(name, measure.build_reduced(name, "cpu"), resolution)
    grid = rs.grid_for(name, width, height)
    channels = 16 if name == "flux" else 4
    latent = torch.zeros((1, channels, height // 8, width // 8))
    cond = sample_conditioning(name, width, height)
    noise = comfy.sample.prepare_noise(latent, 0)
    patched = {s.label(): measure.patch_model(base, s) for s in SETTINGS}

    def seconds(patcher) -> float:
        start = time.process_time()
        comfy.sample.sample(patcher, noise, steps, 1.0, "euler", scheduler, cond, cond, latent, seed=0, disable_pbar=True)
        return time.process_time() - start

    seconds(base)
    plain, times = [], {label: [] for label in patched}
    for _ in range(rounds):
        plain.append(seconds(base))
        for label, patcher in patched.items():
            times[label].append(seconds(patcher))
    plain.append(seconds(base))
    rows = []
    for s in SETTINGS:
        p = model.predict(cost, resolution, s, steps=steps, sampler="euler", scheduler=scheduler, cfg=1.0, reduced=True, plan_ms=plans)
        measured = statistics.mean(plain) / statistics.mean(times[s.label()])
        rows.append({"family": name, "resolution": resolution, "grid_tokens": grid.tokens, "steps": steps, "setting": s.label(),
                     "predicted": round(p.speedup, 4), "measured": round(measured, 4),
                     "error": round(p.speedup / measured - 1, 4), "unpatched_s": [round(x, 2) for x in plain],
                     "patched_s": [round(x, 2) for x in times[s.label()]], "merged_evaluations": f"{p.merged_evaluations}/{p.evaluations}"})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| model | size | steps | setting | merged evaluations | predicted | measured | error | unpatched runs (s) |",
             "|---|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['family']} (few-block, real width) | {r['resolution']} px | {r['steps']} | {r['setting']} | {r['merged_evaluations']} | "
                     f"{r['predicted']:.3f}x | {r['measured']:.3f}x | {r['error'] * 100:+.1f} % | {', '.join(map(str, r['unpatched_s']))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--cache", type=Path, default=realsize.CACHE)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rs.import_comfy()
    cache = realsize.load_cache(args.cache)
    plans = realsize.PlanTimes(cache, "cpu")
    rows = []
    for name in args.families:
        rows += run_case(name, model.fit_family(name, cache), plans, args.rounds)
    text = markdown(rows)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
