"""Video quality of ToMA on the trained Wan fixture, against fewer steps and the step caches.

    COMFYUI_PATH=/path/to/ComfyUI TOMA_THIRD_PARTY=/path/to/packs OMP_NUM_THREADS=1 python -m bench.quality.video_quality
    python -m bench.quality.video_quality --quick --out /tmp/vq                                  # smoke run

The video counterpart of ``bench/quality/quality.py``, on its machinery (rows are chains of nodes as
a user wires them, ``quality.build_variant``; sampled in shuffled turns with the reference re-run
between them, ``quality.measure``): the pack's ToMA Patch (Advanced), ComfyUI's EasyCache and
LazyCache, the real TeaCache / MagCache packs (``quality.THIRD_PARTY``; they import on ComfyUI
0.3.64, not on 0.33), each called with its schema's defaults for what the row leaves out; every row
samples the same seeds through ``comfy.sample.sample`` (``trained_video.SAMPLER``: euler, simple, cfg
1) and the latent is decoded with the fixture's clip codec. Three regimes (``REGIMES``): the full 20
steps, and 8 and 4 steps (how step-distilled Wan runs: the LightX2V Wan 2.2 template samples 4), each
against its own unpatched reference. The rows: the scope study of quality.py (block merge at ratio
0.25 / 0.5 / 0.75, keys/values at 0.5 / 0.75 / 0.9, tile 4 and 8, with and without the log-mass weight,
from step 0 and from 40 %), keys/values at 1 and 2 tile frames, fewer steps, the caches; ``--add``
stacks.

Per row, against the unpatched clip of the regime's step count and the same seed:
- per-frame PSNR / SSIM: mean over frames and seeds, and the worst frame of any seed;
- flicker: ||D(x) - D(ref)|| / ||D(ref)||, D the frame-to-frame differences x[f+1] - x[f] (0 when
  the clip moves exactly as the reference does; flicker that per-frame errors average away shows
  here), mean over seeds and the worst frame pair (harness/metrics.py ``clip_metrics``);
- speed-up on the fixture: the whole sampling call against the reference, on this process's CPU
  clock (a tiny model on a CPU: not what a user sees);
- predicted end-to-end speed-up on Wan 2.2 14B at 832 x 480 x 81 (``real_speed.py``: the real-size
  cost model for the ToMA node, with the fixture's block list mapped to the real depth by position;
  fewer steps and step caches by the model calls that ran the blocks).

ToMA rows set min_tokens 0, as ``trained.patch_at_node_defaults`` explains (the fixture's width is
far below a real model's). Outputs under --out: video_quality.json, video_quality.md, frames.png
(reference | best keys/values | best block merge | fewer steps | best cache, seed 0, 20 steps).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import metrics

from .. import cli
from . import quality

BENCH = Path(__file__).resolve().parents[1]
BASE = {"ratio": 0.5, "tile_size": 4, "start_percent": 0.0, "end_percent": 1.0, "recompute_every": 1,
        "merge_every": 1, "blocks": "auto", "min_tokens": 0}
"""Pinned inputs of every ToMA row (the paper's every-step schedule, tile 4, the node's tile_frames)."""


def scope_rows() -> list[dict[str, Any]]:
    """The scope study's ToMA Patch (Advanced) rows of quality.py (block merge and keys/values, with
    and without the log-mass weight) with the Wan pins, then keys/values at 1 and 2 tile frames."""
    rows = [{**r, "chain": [(node, BASE | inputs) for node, inputs in r["chain"]]}
            for r in quality.ROWS if r["group"] in ("block merge", "keys_values", "keys_values no mass")
            and r["chain"][0][0] == "ToMAPatchAdvanced"]
    rows += [{"label": f"KV 0.5 start 0 tile 4 tf {tf}" + ("" if mass else " no mass"), "group": "keys_values tile_frames",
              "quick": False, "only": (), "chain": [("ToMAPatchAdvanced", BASE | {"scope": "keys_values", "tile_frames": tf}
                                                    | ({} if mass else {"key_mass": False}))]}
             for tf in (1, 2) for mass in (True, False)]
    return rows


def steps_row(steps: int, ref_steps: int, quick: bool = False) -> dict[str, Any]:
    return {"label": f"unpatched {steps} steps", "group": "fewer steps", "quick": quick, "only": (), "chain": [],
            "steps": steps / ref_steps}


def cache(node: str, quick: bool = False, **inputs: Any) -> dict[str, Any]:
    label = f"{node} " + " ".join(f"{v:g}" for v in inputs.values())
    return {"label": label, "group": node, "quick": quick, "only": (), "chain": [(node, inputs)]}


REFERENCE = {"label": "unpatched", "group": "reference", "quick": True, "only": (), "chain": []}
NODE_DEFAULTS = {"label": "block node defaults", "group": "block merge", "quick": True, "only": (),
                 "chain": [("ToMAPatchAdvanced", {"min_tokens": 0})]}
CACHES = [*(cache("EasyCache", quick=t == 0.1, reuse_threshold=t) for t in (0.05, 0.1, 0.2, 0.5)),
          *(cache("LazyCache", reuse_threshold=t) for t in (0.1, 0.2, 0.5, 1.0)),
          *(cache("TeaCache", rel_l1_thresh=t) for t in (0.1, 0.3)),
          *(cache("MagCache", magcache_thresh=t) for t in (0.06, 0.2))]
"""EasyCache and LazyCache (ComfyUI's), TeaCache and MagCache (the real packs, Wan 2.1 1.3B
coefficients; quality.THIRD_PARTY); the highest thresholds are for the few-step regimes."""


STACKS = [quality.stack_row(r, 0.4, 4, node, t) for r in (0.5, 0.75)
          for node, t in (("LazyCache", 0.2), ("LazyCache", 1.0), ("TeaCache", 0.1), ("MagCache", 0.06))]
"""Keys/values from 40 % with the Wan fixture's best cache rows after it (LazyCache 0.2 at 20 and 8
steps, 1 at 4 steps; TeaCache / MagCache on ComfyUI 0.3.64)."""


def regime_rows(steps: int, fewer: tuple[int, ...]) -> list[dict[str, Any]]:
    """A regime: the unpatched reference at `steps`, the `fewer` step counts, the node defaults, the
    scope study, the caches, the stacks."""
    return [REFERENCE, *(steps_row(s, steps, quick=True) for s in fewer), NODE_DEFAULTS, *scope_rows(), *CACHES, *STACKS]


REGIMES: dict[str, tuple[int, list[dict[str, Any]]]] = {
    "20 steps": (20, regime_rows(20, (16, 14, 12, 10, 8, 6, 5))),
    "8 steps": (8, regime_rows(8, (7, 6, 5, 4, 3, 2))),
    "4 steps": (4, regime_rows(4, (3, 2, 1))),
}
"""Each regime against its own unpatched reference (the fixture is not step-distilled: its 8- and
4-step clips stand in for the per-step behaviour of a distilled model, not for its output)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 2, --quick 1)")
    p.add_argument("--quick", action="store_true", help="a few rows only (smoke test)")
    p.add_argument("--rows", type=re.compile, default=None, metavar="REGEX",
                   help="only rows whose label matches (the reference and fewer-steps rows always run)")
    p.add_argument("--add", action="append", default=[], metavar="CHAIN", type=quality.parse_chain,
                   help="an extra row in every regime, as quality.py's --add")
    p.add_argument("--steps", type=int, default=0, help="override every regime's reference step count (smoke tests)")
    p.add_argument("--no-predict", action="store_true", help="skip the real-size predictions")
    p.add_argument("--student", action="store_true", help="the 4-step student (fixtures/wan_4step; --regimes '4 steps')")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"])
    p.add_argument("--out", type=Path, default=BENCH / "out" / "video_quality")
    p.add_argument("--picture", default=None, metavar="LABEL",
                   help="no sampling: redraw --out's frames.png from its json and clips.npz with this row as the ToMA row")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 2)
    args.device, args.dtype, args.clock = "cpu", "fp32", "cpu" if args.threads == 1 else "wall"
    return args


# ---- sampling ----------------------------------------------------------------------------------------

def load_fixture(student: bool = False) -> quality.Family:
    """The Wan fixture (or its 4-step student) as quality.py samples a fixture: its clips decode to
    (F, H, W, 3) in [0, 1]."""
    from harness import trained_video as tv

    model = tv.load_model(student=student)
    positive, negative = tv.conditioning()
    return quality.Family("wan", model, positive, negative, dict(tv.SAMPLER), torch.zeros(tv.latent_shape()),
                          quality.BlockRuns(model.get_model_object("diffusion_model")),
                          lambda z: tv.decode(z)[0].permute(1, 2, 3, 0).double().numpy())


@dataclass(kw_only=True)
class VideoRow(quality.RowMetrics):
    """What one row of a regime measured (video_quality.json's rows)."""

    regime: str
    psnr_worst_frame: float | None = None
    ssim_worst_frame: float | None = None
    flicker_mean: float | None = None
    flicker_worst_pair: float | None = None


def summarise(regime: str, row: dict, variant: quality.Variant | str, m: quality.Measured | None,
              ref: quality.Measured, clock: str) -> VideoRow:
    """One row's clip metrics against the reference clips of the same seeds (the reference row: its
    first clips against its last re-run)."""
    reason = quality.skip_reason(variant, m)
    if reason is not None:
        return VideoRow.skipped_row(row, reason, regime=regime)
    is_ref = row is REFERENCE
    clips = ref.last if is_ref else m.images
    ms = [metrics.clip_metrics(ref.images[s], c) for s, c in clips.items()]
    finite = lambda xs: [x for x in xs if np.isfinite(x)] or [float("inf")]
    psnrs = [p for m_ in ms for p in m_["psnr"]]
    return VideoRow(
        regime=regime, label=row["label"], group=row["group"], params={"steps": variant.steps, "chain": variant.chain},
        psnr_mean=round(statistics.fmean(finite(psnrs)), 3), psnr_worst_frame=round(min(psnrs), 3),
        ssim_mean=round(statistics.fmean(s for m_ in ms for s in m_["ssim"]), 4),
        ssim_worst_frame=round(min(s for m_ in ms for s in m_["ssim"]), 4),
        flicker_mean=round(statistics.fmean(m_["flicker"] for m_ in ms), 4),
        flicker_worst_pair=round(max(p for m_ in ms for p in m_["flicker_pairs"]), 4),
        **quality.sampled_fields(m, clock, is_ref),
    )


def run_regime(name: str, args: argparse.Namespace, tap: quality.LogTap,
               fam: quality.Family) -> tuple[list[VideoRow], dict, dict[str, dict[int, np.ndarray]]]:
    """Every row of one regime (REGIMES, --rows / --quick, then --add): the rows, what the run was, the
    first-pass clips by label and seed."""
    ref_steps, rows = REGIMES[name]
    ref_steps = args.steps or ref_steps
    always = ("reference", "fewer steps")
    rows = [r for r in rows if r["group"] in always or (args.rows.search(r["label"]) if args.rows else r["quick"] or not args.quick)]
    rows += args.add
    nodes = quality.node_classes()
    built = {r["label"]: quality.build_variant(r, fam.name, fam.model, ref_steps, nodes) for r in rows}
    started = time.perf_counter()
    measured = quality.measure(fam, built, args.seeds, 1, tap, name)
    ref = measured[REFERENCE["label"]]
    results = [summarise(name, r, built[r["label"]], measured.get(r["label"]), ref, args.clock) for r in rows]
    meta = {"regime": name, "steps": ref_steps, "seeds": list(range(args.seeds)), "clock": args.clock,
            "reference_jitter": quality.reference_jitter(ref.seconds[args.clock]), "seconds": round(time.perf_counter() - started, 1),
            "reference_seconds": round(statistics.median(ref.seconds[args.clock]), 3)}
    return results, meta, {label: m.images for label, m in measured.items() if m.failed is None}


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

    if not tv.available(args.student):
        sys.exit(f"error: {tv.weights_path(args.student)} missing (train it: python -m bench.quality.train_video_fixture)")
    tap = quality.LogTap.install()
    fam = load_fixture(args.student)
    header = cli.run_header(root, args) + f"Wan fixture {tv.latent_shape()}, {args.seeds} seeds"
    print(header, flush=True)
    results, metas, picture = [], [], {}
    for name in args.regimes:
        rows, meta, clips = run_regime(name, args, tap, fam)
        results += rows
        metas.append(meta)
        if name == "20 steps":
            picture = {label: c[0] for label, c in clips.items() if 0 in c}
    if not args.no_predict:
        video_report.add_predictions(results, metas)
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "bench.quality.video_quality", *sys.argv[1:]])
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
