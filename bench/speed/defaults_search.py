"""The search that chose the basic node's defaults: fixture quality of candidate settings beside their
predicted real-size speed-ups on Flux.1-dev (20 steps) and SDXL (30 steps) at 1024 x 1024.

    python -m bench.speed.defaults_search quality     # sample the fixtures -> bench/speed/defaults_search_fixtures.json
    python -m bench.speed.defaults_search table       # the search table from that record and the cost model

Criterion: among the settings whose predicted end-to-end speed-up (bench/speed/realsize.py) is
>= 1.25x (--at-least LABEL: at least that candidate's) on both Flux.1-dev and SDXL at 1024 px, the best mean fixture quality (PSNR against the
unpatched image, mean over the Flux and SDXL fixtures and 5 seeds), with SSIM >= 0.95 on both.

A candidate's `blocks` may name a rule instead of a list (`blocks_of`: "old-auto", "later", "later-2/3"),
resolved per model, real or fixture. `quality` samples only what the table needs: per fixture and seed, the unpatched image and each
candidate, through the quality bench's own node chains and sampler (
build_variant, sample, image_metrics in bench/quality/quality.py), untimed. Results are written after every seed. The margin
against fewer steps compares a setting's PSNR with the fewer-steps PSNR of the same fixture at
the step count that gives the same PREDICTED speed-up (steps / speed-up), interpolated in the
fewer-steps rows the quality run also samples (--steps-rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import realsize_model as model

QUALITY = Path(__file__).resolve().parent / "defaults_search_fixtures.json"
"""The committed record of the last `quality` run (5 seeds, every candidate)."""
LATER = Path(__file__).resolve().parent / "defaults_search_later.json"
"""The record of the `blocks` auto study (3 seeds, bench/speed/defaults_later_candidates.json; docs/defaults.md)."""

CANDIDATES: list[model.Setting] = [
    model.Setting(0.5, 4, 0.75),
    model.Setting(0.5, 4, 0.0),
    model.Setting(0.5, 4, 0.25),
    model.Setting(0.5, 4, 0.4),
    model.Setting(0.5, 8, 0.25),
    model.Setting(0.5, 8, 0.4),
    model.Setting(0.5, 8, 0.5),
    model.Setting(0.5, 8, 0.35),
    model.Setting(0.5, 16, 0.4),
    model.Setting(0.6, 4, 0.3),
    model.Setting(0.6, 4, 0.4),
    model.Setting(0.75, 4, 0.4),
    model.Setting(0.75, 4, 0.5),
    model.Setting(0.75, 4, 0.6),
    model.Setting(0.75, 8, 0.5),
    model.Setting(0.75, 4, 0.0, merge_every=2),
    model.Setting(0.9, 4, 0.6),
]
"""The searched settings (basic-node levers: ratio, tile, window, merge_every, recompute_every).
The first is the old default (start_percent 0.75), the second the paper's every-step schedule. The
tile-8 rows at 0.4 and 0.5 were added after a first seed showed tile 8 ahead of tile 4, then tile 8
from 0.35 and tile 16 from 0.4 around the chosen setting."""

STEP_FRACTIONS = (0.9, 0.8, 0.7, 0.6)
"""Fewer-steps rows sampled for the margin column (18, 16, 14, 12 of 20 steps)."""


OLD_AUTO = "old-auto"
"""`blocks` of a candidate: blocks auto before the later half (every stream but its first min(5, n // 3)
blocks; every UNet transformer block, as it was on SDXL and the fixtures). "later": the later half."""


def blocks_of(blocks: str, sizes: dict[str, int] | None) -> str:
    """A candidate's `blocks` as a list for a model with sizes[stream] DiT blocks (None: a UNet): OLD_AUTO,
    "later" (each stream from n // 2; the UNet's output blocks), "later-2/3" (from n // 3; middle and output)."""
    if blocks not in FIRST:
        return blocks
    if sizes is None:
        return {OLD_AUTO: "all", "later": "output"}.get(blocks, "middle,output")
    return ",".join(f"{g}:{FIRST[blocks](n)}-{n - 1}" for g, n in sizes.items())


FIRST = {OLD_AUTO: lambda n: min(5, n // 3), "later": lambda n: n // 2, "later-2/3": lambda n: n // 3}
"""The first block of a DiT stream of n that each rule of blocks_of merges."""


def row_of(s: model.Setting, sizes: dict[str, int] | None) -> dict[str, Any]:
    """The candidate as a quality row; min_tokens 0, as trained.patch_at_node_defaults measures a fixture."""
    inputs = {"ratio": s.ratio, "tile_size": s.tile_size, "start_percent": s.start_percent, "end_percent": s.end_percent,
              "recompute_every": s.recompute_every, "merge_every": s.merge_every, "min_tokens": 0}
    node = "ToMAPatch" if s.blocks == "auto" and s.scope == "block" else "ToMAPatchAdvanced"
    if node == "ToMAPatchAdvanced":
        inputs |= {"blocks": blocks_of(s.blocks, sizes), "scope": s.scope}
    return {"label": s.label(), "group": "search", "quick": True, "only": (), "chain": [(node, inputs)]}


def stream_sizes(diffusion_model: Any) -> dict[str, int] | None:
    """{stream: blocks} of a Flux-layout model, None for a UNet."""
    if not hasattr(diffusion_model, "double_blocks"):
        return None
    return {"double": len(diffusion_model.double_blocks), "single": len(diffusion_model.single_blocks)}


def cmd_quality(args: argparse.Namespace) -> None:
    import torch

    from ..quality import quality as q
    from . import realsize_setup as rs

    torch.set_num_threads(1)
    rs.import_comfy()
    results: dict[str, Any] = {"command": " ".join(sys.argv), "seeds": list(range(args.seeds)), "families": {}}
    tap = q.LogTap()
    for name in args.families:
        fam = q.load_family(name)
        ref_steps = int(fam.sampler["steps"])
        nodes = q.node_classes()
        rows = [{"label": q.REFERENCE, "group": "reference", "quick": True, "only": (), "chain": []}]
        rows += [{"label": f"steps x{f:g}", "group": "fewer steps", "quick": True, "only": (), "chain": [], "steps": f}
                 for f in STEP_FRACTIONS if args.steps_rows]
        sizes = stream_sizes(fam.model.get_model_object("diffusion_model"))
        rows += [row_of(s, sizes) for s in candidates(args)]
        variants = {r["label"]: q.build_variant(r, name, fam.model, ref_steps, nodes) for r in rows}
        out = results["families"].setdefault(name, {"steps": ref_steps, "sampler": fam.sampler, "rows": {}})
        started = time.perf_counter()
        for seed in range(args.seeds):
            ref = q.sample(fam, variants[q.REFERENCE], seed, tap)[1]
            for label, v in variants.items():
                if label == q.REFERENCE or isinstance(v, str):
                    continue
                psnr, ssim = q.image_metrics(ref, q.sample(fam, v, seed, tap)[1])
                entry = out["rows"].setdefault(label, {"steps": v.steps, "psnr": [], "ssim": []})
                entry["psnr"].append(round(psnr, 3))
                entry["ssim"].append(round(ssim, 4))
            args.out.write_text(json.dumps(results, indent=1))
            print(f"  {name}: seed {seed} done ({time.perf_counter() - started:.0f} s)", flush=True)


def candidates(args: argparse.Namespace) -> list[model.Setting]:
    """CANDIDATES, or the settings of --candidates (a JSON list of Setting fields)."""
    if getattr(args, "candidates", None) is None:
        return CANDIDATES
    return [model.Setting(**entry) for entry in json.loads(args.candidates.read_text())]


def fewer_steps_psnr(rows: dict[str, Any], steps: int, equal_steps: float) -> float | None:
    """Fewer-steps PSNR interpolated at `equal_steps` (linear between the sampled step counts)."""
    points = sorted((r["steps"], statistics.mean(r["psnr"])) for label, r in rows.items() if label.startswith("steps x"))
    points.append((steps, float("inf")))
    for (s0, p0), (s1, p1) in zip(points, points[1:]):
        if s0 <= equal_steps <= s1:
            if p1 == float("inf"):
                return p0 if equal_steps < s1 else None
            return p0 + (p1 - p0) * (equal_steps - s0) / (s1 - s0)
    return None


def merge_quality(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One quality record from several `quality` runs: per family and row, the run with the most seeds."""
    out: dict[str, Any] = {"families": {}}
    for run in runs:
        for name, fam in run["families"].items():
            into = out["families"].setdefault(name, {"steps": fam["steps"], "rows": {}})
            for label, row in fam["rows"].items():
                if len(row["psnr"]) > len(into["rows"].get(label, {}).get("psnr", [])):
                    into["rows"][label] = row
    return out


def cmd_table(args: argparse.Namespace) -> None:
    from . import realsize
    from . import realsize_setup as rs

    rs.import_comfy()
    quality = merge_quality([json.loads(path.read_text()) for path in args.quality])
    cache = realsize.load_cache(args.cache)
    plans, kvs = realsize.PlanTimes(cache, "cpu"), realsize.KvTimes(cache, "cpu")
    costs = {name: model.fit_family(name, cache) for name in ("flux", "sdxl")}
    sizes = {"flux": rs.dit_kinds("flux"), "sdxl": None}
    speeds = {s.label(): {name: model.predict(cost, args.resolution, replace(s, blocks=blocks_of(s.blocks, sizes[name])),
                                              plan_ms=plans, kv_ms=kvs).speedup for name, cost in costs.items()} for s in candidates(args)}
    floor = speeds[args.at_least] if args.at_least else dict.fromkeys(costs, args.min_speedup)
    lines = [f"| setting | Flux.1-dev {args.resolution} | SDXL {args.resolution} | Flux fixture PSNR / SSIM | SDXL fixture PSNR / SSIM | mean PSNR | "
             "SD1.5 fixture PSNR | fewer steps at equal speed-up, Flux / SDXL (dB) | meets |",
             "|---|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    chosen = []
    for s in candidates(args):
        speed = speeds[s.label()]
        cells, psnrs, ok = [], [], all(speed[name] >= floor[name] - 5e-4 for name in costs)
        margins = []
        for name in ("flux", "sdxl"):
            fam = quality["families"].get(name, {})
            r = fam.get("rows", {}).get(s.label())
            if r is None:
                cells.append("–")
                ok = False
                continue
            p, ss = statistics.mean(r["psnr"]), statistics.mean(r["ssim"])
            cells.append(f"{p:.1f} / {ss:.3f} ({len(r['psnr'])} seeds)")
            psnrs.append(p)
            ok &= ss >= args.min_ssim
            steps = fam["steps"]
            f = fewer_steps_psnr(fam["rows"], steps, steps / speed[name])
            margins.append("–" if f is None else f"{p - f:+.1f}")
        mean = statistics.mean(psnrs) if len(psnrs) == 2 else float("nan")
        sd15 = quality["families"].get("sd15", {}).get("rows", {}).get(s.label())
        sd15_cell = "–" if sd15 is None else f"{statistics.mean(sd15['psnr']):.1f}"
        if ok:
            chosen.append((mean, s))
        lines.append(f"| {s.label()} | {speed['flux']:.2f}x | {speed['sdxl']:.2f}x | {' | '.join(cells)} | {mean:.1f} | "
                     f"{sd15_cell} | "
                     f"{' / '.join(margins) or '–'} | {'yes' if ok else 'no'} |")
    if plans.timed or kvs.timed:
        realsize.save_cache(args.cache, cache)
    best = max(chosen, key=lambda t: t[0])[1].label() if chosen else "none"
    text = "\n".join(lines) + f"\n\nBest setting meeting every constraint: **{best}**.\n"
    if args.out:
        args.out.write_text(text)
    print(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from . import realsize

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--families", nargs="+", default=["flux", "sdxl"])
    q.add_argument("--seeds", type=int, default=5)
    q.add_argument("--out", type=Path, default=QUALITY)
    q.add_argument("--candidates", type=Path, default=None, help="JSON list of settings instead of CANDIDATES")
    q.add_argument("--steps-rows", action=argparse.BooleanOptionalAction, default=True, help="also sample the fewer-steps rows")
    t = sub.add_parser("table")
    t.add_argument("--quality", type=Path, nargs="+", default=[QUALITY])
    t.add_argument("--candidates", type=Path, default=None, help="JSON list of settings instead of CANDIDATES")
    t.add_argument("--cache", type=Path, default=realsize.CACHE)
    t.add_argument("--resolution", default="1024", choices=["1024", "2048"])
    t.add_argument("--min-speedup", type=float, default=1.25)
    t.add_argument("--at-least", default=None, metavar="LABEL",
                   help="instead of --min-speedup: at least this candidate's predicted speed-up on each model")
    t.add_argument("--min-ssim", type=float, default=0.95)
    t.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    {"quality": cmd_quality, "table": cmd_table}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
