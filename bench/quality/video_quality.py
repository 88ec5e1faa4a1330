"""Video quality of ToMA on the trained Wan fixture, against fewer steps and the step caches.

    COMFYUI_PATH=/path/to/ComfyUI TOMA_THIRD_PARTY=/path/to/packs OMP_NUM_THREADS=1 python -m bench.quality.video_quality
    python -m bench.quality.video_quality --quick --out /tmp/vq                                  # smoke run

The video counterpart of ``bench/quality/quality.py``, on its harness: every row is a chain of
nodes as a user wires them (the pack's ToMA Patch (Advanced), ComfyUI's EasyCache, the real
TeaCache / MagCache packs from ``harness/third_party.py``), each called with its schema's
defaults for what the row leaves out; every row samples the same seeds through
``comfy.sample.sample`` (``trained_video.SAMPLER``: euler, simple, cfg 1) and the latent is decoded
with the fixture's clip codec. Three regimes (``REGIMES``): the full 20 steps, and the few-step
regime at 8 and 4 steps (how step-distilled Wan runs), each against its own unpatched reference.

Per row, against the unpatched clip of the regime's step count and the same seed:
- per-frame PSNR / SSIM: mean over frames and seeds, and the worst frame of any seed;
- flicker: ||D(x) - D(ref)|| / ||D(ref)||, D the frame-to-frame differences x[f+1] - x[f] (0 when
  the clip moves exactly as the reference does; flicker that per-frame errors average away shows
  here), mean over seeds and the worst frame pair;
- speed-up on the fixture: the whole sampling call against the reference, timed in turns as in
  quality.py (rows shuffled, the reference re-run every REF_EVERY rows, the mean of the two
  reference calls around a row over its own time, median over seeds), on this process's CPU clock;
- predicted speed-up on Wan 2.1 14B (832 x 480 x 81) and 1.3B (480p) from the real-size cost model
  (``bench/speed/realsize_model.py``, real block widths and token counts; it prices tile_size, not
  tile_frames). A fixture block list is mapped to the real depth by position (block i of 6 -> the
  i-th sixth of the real blocks); ``auto`` stays ``auto``. Step caches and fewer steps are priced by
  the model calls that ran their blocks (steps / computed steps; a cache's own cost is not priced).

ToMA rows set min_tokens 0, as ``trained.patch_at_node_defaults`` explains (the fixture's width is
far below a real model's). Outputs under --out: video_quality.json, video_quality.md, frames.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from harness import metrics

from .. import cli
from ..timing import CLOCKS
from . import quality

BENCH = Path(__file__).resolve().parents[1]
REF_EVERY = quality.REF_EVERY
BASE = {"ratio": 0.5, "tile_size": 4, "start_percent": 0.0, "end_percent": 1.0, "recompute_every": 1,
        "merge_every": 1, "blocks": "auto", "tile_frames": 2, "min_tokens": 0}
"""Pinned inputs of every ToMA row but "ToMA node defaults" (the paper's every-step schedule, tile 4)."""


WORKFLOW = {"ratio": 0.5, "tile_size": 4, "start_percent": 0.0, "tile_frames": 4, "blocks": "auto"}
"""The ToMA inputs of example_workflows/wan_toma.json (tests/integration/test_video_fixture.py checks
that they match), stacked on the best caches in the "ToMA + cache" rows."""


def toma(label: str, group: str, quick: bool = False, **inputs: Any) -> dict[str, Any]:
    return {"label": label, "group": group, "quick": quick, "chain": [("ToMAPatchAdvanced", BASE | inputs)]}


def steps_row(steps: int, quick: bool = False) -> dict[str, Any]:
    return {"label": f"unpatched {steps} steps", "group": "fewer steps", "quick": quick, "chain": [], "steps": steps}


def cache(node: str, quick: bool = False, **inputs: Any) -> dict[str, Any]:
    label = f"{node} " + " ".join(f"{v:g}" for v in inputs.values())
    return {"label": label, "group": node, "quick": quick, "chain": [(node, inputs)]}


REFERENCE = {"label": "unpatched", "group": "reference", "quick": True, "chain": []}
NODE_DEFAULTS = {"label": "ToMA node defaults", "group": "ToMA defaults", "quick": True,
                 "chain": [("ToMAPatchAdvanced", {"min_tokens": 0})]}

MAIN_ROWS: list[dict[str, Any]] = [
    REFERENCE,
    *(steps_row(s, quick=s == 14) for s in (16, 14, 12, 10, 8)),
    NODE_DEFAULTS,
    *(toma(f"ToMA {r:g} tf {tf}", "ToMA ratio x tile_frames", quick=(r, tf) == (0.5, 2), ratio=r, tile_frames=tf)
      for r in (0.25, 0.5, 0.75) for tf in (1, 2, 4)),
    toma("ToMA 0.5 tf 2 tile 8", "ToMA schedule", tile_size=8),
    toma("ToMA 0.5 tf 2 tile 8 start 0.2", "ToMA schedule", tile_size=8, start_percent=0.2),
    toma("ToMA 0.75 tf 2 tile 8 start 0.4", "ToMA schedule", ratio=0.75, tile_size=8, start_percent=0.4),
    toma("ToMA 0.5 tf 2 start 0.2", "ToMA schedule", start_percent=0.2),
    toma("ToMA 0.5 tf 2 start 0.4", "ToMA schedule", start_percent=0.4),
    toma("ToMA 0.75 tf 2 start 0.4", "ToMA schedule", ratio=0.75, start_percent=0.4),
    toma("ToMA 0.5 tf 2 merge_every 2", "ToMA schedule", merge_every=2),
    toma("ToMA 0.5 tf 2 blocks all", "ToMA blocks", blocks="all"),
    toma("ToMA 0.5 tf 2 blocks 1-5", "ToMA blocks", blocks="blocks:1-5"),
    toma("ToMA 0.5 tf 2 blocks 3-5", "ToMA blocks", blocks="blocks:3-5"),
    toma("ToMA 0.5 tf 2 blocks 0-3", "ToMA blocks", blocks="blocks:0-3"),
    toma("ToMA 0.5 tf 2 blocks 2-5", "ToMA blocks", blocks="blocks:2-5"),
    *(toma(f"ToMA {r:g} tf 4 tile 8{' start ' + format(st, 'g') if st else ''} blocks {b.removeprefix('blocks:')}",
           "ToMA combined", ratio=r, tile_frames=4, tile_size=8, start_percent=st, blocks=b)
      for r, st, b in ((0.5, 0, "auto"), (0.5, 0, "all"), (0.5, 0, "blocks:0-3"), (0.5, 0, "blocks:0-4"),
                       (0.75, 0, "blocks:0-3"), (0.5, 0.2, "all"), (0.5, 0, "blocks:1-5"), (0.5, 0.2, "blocks:1-5"),
                       (0.5, 0.2, "blocks:2-5"))),
    *(cache("EasyCache", quick=t == 0.1, reuse_threshold=t) for t in (0.05, 0.1, 0.2)),
    *(cache("TeaCache", rel_l1_thresh=t) for t in (0.1, 0.3)),
    *(cache("MagCache", magcache_thresh=t) for t in (0.06, 0.2)),
    {"label": "ToMA 0.5 tf 2 + EasyCache 0.1", "group": "ToMA + cache", "quick": False,
     "chain": [("ToMAPatchAdvanced", BASE), ("EasyCache", {"reuse_threshold": 0.1})]},
    {"label": "ToMA 0.5 tf 2 + EasyCache 0.2", "group": "ToMA + cache", "quick": False,
     "chain": [("ToMAPatchAdvanced", BASE), ("EasyCache", {"reuse_threshold": 0.2})]},
    *({"label": f"ToMA workflow + {node} {threshold:g}", "group": "ToMA + cache", "quick": False,
       "chain": [("ToMAPatchAdvanced", BASE | WORKFLOW), (node, {key: threshold})]}
      for node, key, threshold in (("TeaCache", "rel_l1_thresh", 0.3), ("MagCache", "magcache_thresh", 0.2))),
]
"""The 20-step regime. Block lists are the fixture's 6 blocks (``auto``: the DiT rule of
nodes/machinery/dit_blocks.py, blocks 2-5 on the fixture)."""


def few_rows(steps: int) -> list[dict[str, Any]]:
    """A few-step regime: ToMA on every step against the unpatched run with fewer steps."""
    fewer = range(steps - 1, max(1, steps // 2) - 1, -1)
    return [REFERENCE, *(steps_row(s, quick=True) for s in fewer),
            *(toma(f"ToMA {r:g} tf 2", "ToMA ratio", quick=r == 0.5, ratio=r) for r in (0.25, 0.5, 0.75)),
            toma("ToMA 0.5 tf 1", "ToMA ratio x tile_frames", ratio=0.5, tile_frames=1)]


REGIMES: dict[str, tuple[int, list[dict[str, Any]]]] = {
    "20 steps": (20, MAIN_ROWS), "8 steps": (8, few_rows(8)), "4 steps": (4, few_rows(4)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 2, --quick 1)")
    p.add_argument("--quick", action="store_true", help="a few rows only (smoke test)")
    p.add_argument("--rows", type=re.compile, default=None, metavar="REGEX",
                   help="only rows whose label matches (and the reference)")
    p.add_argument("--steps", type=int, default=0, help="override every regime's reference step count (smoke tests)")
    p.add_argument("--no-predict", action="store_true", help="skip the real-size predictions")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"])
    p.add_argument("--out", type=Path, default=BENCH / "out" / "video_quality")
    p.add_argument("--picture", default=None, metavar="LABEL",
                   help="no sampling: redraw --out's frames.png from its json and clips.npz with this row as ToMA's")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 2)
    args.device, args.dtype, args.clock = "cpu", "fp32", "cpu" if args.threads == 1 else "wall"
    return args


# ---- rows -> patched models -------------------------------------------------------------------------

def third_party_nodes() -> dict[str, Callable[..., Any]]:
    """TeaCache and MagCache (real packs) as model -> model functions at their Wan 2.1 1.3B settings."""
    from harness import third_party as tp

    def teacache(model: Any, rel_l1_thresh: float) -> Any:
        node = tp.pack_module(tp.TEACACHE, "nodes").TeaCache()
        return node.apply_teacache(model, "wan2.1_t2v_1.3B", rel_l1_thresh, 0.0, 1.0, "cpu")[0]

    def magcache(model: Any, magcache_thresh: float) -> Any:
        node = tp.pack_module(tp.MAGCACHE, "nodes").MagCache()
        return node.apply_magcache(model, "wan2.1_t2v_1.3B", magcache_thresh, 0.2, 2, 0, -1)[0]

    return {"TeaCache": teacache, "MagCache": magcache}


def build(row: dict[str, Any], model: Any, ref_steps: int, nodes: dict[str, Any]) -> quality.Variant | str:
    """The row's patched model and step count, or why it is skipped."""
    steps = row.get("steps", ref_steps)
    chain = []
    for name, given in row["chain"]:
        try:
            if name in ("TeaCache", "MagCache"):
                model = third_party_nodes()[name](model, **given)
                chain.append({"node": name, "inputs": given})
                continue
            inputs = quality.schema_defaults(nodes[name]) | given
            model = nodes[name].execute(model, **inputs).result[0]
        except (ValueError, KeyError, ImportError) as exc:
            return f"{name}: {type(exc).__name__}: {exc}"
        except BaseException as exc:  # a missing pack skips (pytest's Skipped is a BaseException)
            if type(exc).__name__ != "Skipped":
                raise
            return f"{name}: {exc}"
        chain.append({"node": name, "inputs": inputs})
    return quality.Variant(row, steps, model, chain)


# ---- sampling, metrics ------------------------------------------------------------------------------

class BlockRuns:
    """Counts runs of the fixture's last block (a step cache that skips a call runs none)."""

    def __init__(self, diffusion_model: torch.nn.Module) -> None:
        self.count = 0
        diffusion_model.blocks[-1].register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.count += 1


@dataclass
class Clip:
    seconds: dict[str, float]
    frames: np.ndarray
    """(F, H, W, 3) in [0, 1]."""
    computed: int
    log: str


def sample(variant: quality.Variant, seed: int, tap: quality.LogTap, runs: BlockRuns) -> Clip:
    import comfy.sample

    from harness import trained_video as tv

    latent = torch.zeros(tv.latent_shape())
    noise = comfy.sample.prepare_noise(latent, seed)
    positive, negative = tv.conditioning()
    s = tv.SAMPLER
    tap.lines.clear()
    runs.count = 0
    start = {name: clock() for name, clock in CLOCKS.items()}
    out = comfy.sample.sample(variant.model, noise, variant.steps, s["cfg"], s["sampler_name"], s["scheduler"],
                              positive, negative, latent, seed=seed, disable_pbar=True)
    seconds = {name: clock() - start[name] for name, clock in CLOCKS.items()}
    frames = tv.decode(out)[0].permute(1, 2, 3, 0).double().numpy()
    return Clip(seconds, frames, runs.count, "; ".join(tap.lines))


def clip_metrics(ref: np.ndarray, clip: np.ndarray) -> dict[str, Any]:
    """Per-frame PSNR / SSIM and the flicker of (F, H, W, 3) clips (see the module docstring)."""
    psnrs = [metrics.psnr(r, x) for r, x in zip(ref, clip)]
    ssims = [metrics.ssim(r, x) for r, x in zip(ref, clip)]
    d_ref, d = np.diff(ref, axis=0), np.diff(clip, axis=0)
    pairs = [float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)) for a, b in zip(d, d_ref)]
    whole = float(np.linalg.norm(d - d_ref) / max(np.linalg.norm(d_ref), 1e-12))
    return {"psnr": psnrs, "ssim": ssims, "flicker": whole, "flicker_pairs": pairs}


@dataclass
class VideoRow:
    """What one row measured (None where skipped)."""

    regime: str
    label: str
    group: str
    params: dict[str, Any]
    speedup: float | None = None
    speedup_wall: float | None = None
    psnr_mean: float | None = None
    psnr_worst_frame: float | None = None
    ssim_mean: float | None = None
    ssim_worst_frame: float | None = None
    flicker_mean: float | None = None
    flicker_worst_pair: float | None = None
    computed_steps: float | None = None
    predicted: dict[str, float] = field(default_factory=dict)
    log: str = ""
    skipped: str | None = None


def summarise(regime: str, row: dict, variant: quality.Variant | str, clips: dict[int, Clip],
              ref: dict[int, Clip], ratios: dict[str, list[float]]) -> VideoRow:
    if isinstance(variant, str):
        return VideoRow(regime, row["label"], row["group"], {"chain": [list(c) for c in row["chain"]]}, skipped=variant)
    ms = [clip_metrics(ref[s].frames, c.frames) for s, c in clips.items()]
    finite = lambda xs: [x for x in xs if np.isfinite(x)] or [float("inf")]  # noqa: E731
    psnrs = [p for m in ms for p in m["psnr"]]
    is_ref = row is REFERENCE
    return VideoRow(
        regime, row["label"], row["group"], {"steps": variant.steps, "chain": variant.chain},
        speedup=1.0 if is_ref else round(statistics.median(ratios["cpu"]), 4),
        speedup_wall=1.0 if is_ref else round(statistics.median(ratios["wall"]), 4),
        psnr_mean=round(statistics.fmean(finite(psnrs)), 3), psnr_worst_frame=round(min(psnrs), 3),
        ssim_mean=round(statistics.fmean(s for m in ms for s in m["ssim"]), 4),
        ssim_worst_frame=round(min(s for m in ms for s in m["ssim"]), 4),
        flicker_mean=round(statistics.fmean(m["flicker"] for m in ms), 4),
        flicker_worst_pair=round(max(p for m in ms for p in m["flicker_pairs"]), 4),
        computed_steps=statistics.fmean(c.computed for c in clips.values()) / 1,
        log=" / ".join(sorted({c.log for c in clips.values()}))[:400],
    )


def run_regime(name: str, args: argparse.Namespace, tap: quality.LogTap, base: Any,
               runs: BlockRuns) -> tuple[list[VideoRow], dict, dict[str, dict[int, Clip]]]:
    ref_steps, rows = REGIMES[name]
    ref_steps = args.steps or ref_steps
    rows = [r for r in rows if r is REFERENCE or (args.rows.search(r["label"]) if args.rows else r["quick"] or not args.quick)]
    nodes = quality.node_classes()
    built = {r["label"]: build(r, base, ref_steps, nodes) for r in rows}
    variants = [v for v in built.values() if isinstance(v, quality.Variant)]
    reference = built[REFERENCE["label"]]
    others = [v for v in variants if v is not reference]
    clips: dict[str, dict[int, Clip]] = {v.row["label"]: {} for v in variants}
    ratios = {v.row["label"]: {c: [] for c in CLOCKS} for v in variants}
    ref_seconds: list[float] = []
    started = time.perf_counter()
    sample(reference, 0, tap, runs)  # warm-up, not counted
    for seed in range(args.seeds):
        calls = [(v, sample(v, seed, tap, runs)) for v in quality.pass_order(others, reference, seed, 0)]
        ref_at = [i for i, (v, _) in enumerate(calls) if v is reference]
        for i, (v, clip) in enumerate(calls):
            clips[v.row["label"]].setdefault(seed, clip)
            if v is reference:
                ref_seconds.append(clip.seconds[args.clock])
                continue
            before = max(j for j in ref_at if j < i)
            after = min(j for j in ref_at if j > i)
            for c in CLOCKS:
                ratios[v.row["label"]][c].append((calls[before][1].seconds[c] + calls[after][1].seconds[c]) / 2 / clip.seconds[c])
        print(f"  {name}: seed {seed} done ({time.perf_counter() - started:.0f} s)", flush=True)
    ref_clips = clips[REFERENCE["label"]]
    results = [summarise(name, r, built[r["label"]], clips.get(r["label"], {}), ref_clips, ratios.get(r["label"], {}))
               for r in rows]
    meta = {"regime": name, "steps": ref_steps, "seeds": list(range(args.seeds)), "clock": args.clock,
            "reference_jitter": quality.reference_jitter(ref_seconds), "seconds": round(time.perf_counter() - started, 1),
            "reference_seconds": round(statistics.median(ref_seconds), 3)}
    return results, meta, clips


def redraw(out: Path, label: str) -> Path:
    """frames.png again from an earlier run's video_quality.json and clips.npz, `label` as ToMA's row."""
    from . import video_report

    rows = [VideoRow(**r) for r in json.loads((out / "video_quality.json").read_text())["rows"]]
    clips = {k: v.astype(np.float64) / 255 for k, v in np.load(out / "clips.npz").items()}
    return video_report.frames_picture(out / "frames.png", rows, clips, label)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.picture:
        print(f"wrote {redraw(args.out, args.picture)}")
        return 0
    root = cli.import_comfy(args)
    torch.set_num_threads(args.threads)
    from harness import trained_video as tv

    from . import video_report

    if not tv.available():
        sys.exit(f"error: {tv.weights_path()} missing (train it: python -m bench.quality.train_video_fixture)")
    tap = quality.LogTap()
    root_logger = logging.getLogger()
    for handler in root_logger.handlers:
        handler.setLevel(max(handler.level, logging.WARNING))
    root_logger.addHandler(tap)
    root_logger.setLevel(logging.INFO)
    base = tv.load_model()
    runs = BlockRuns(base.get_model_object("diffusion_model"))
    header = cli.run_header(root, args) + f"Wan fixture {tv.latent_shape()}, {args.seeds} seeds"
    print(header, flush=True)
    results, metas, picture = [], [], {}
    for name in args.regimes:
        rows, meta, clips = run_regime(name, args, tap, base, runs)
        results += rows
        metas.append(meta)
        if name == "20 steps":
            picture = {label: c[0].frames for label, c in clips.items() if 0 in c}
    if not args.no_predict:
        video_report.add_predictions(results, metas)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "-m", "bench.quality.video_quality", *sys.argv[1:]])
    (args.out / "video_quality.json").write_text(json.dumps(
        {"setup": header, "command": command, "regimes": metas, "rows": [asdict(r) for r in results]}, indent=1))
    table = video_report.markdown(header, command, metas, results)
    (args.out / "video_quality.md").write_text(table)
    if picture:
        np.savez_compressed(args.out / "clips.npz", **{k: (v * 255).round().astype(np.uint8) for k, v in picture.items()})
        video_report.frames_picture(args.out / "frames.png", results, picture)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
