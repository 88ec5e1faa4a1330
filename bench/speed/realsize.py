"""Real-size cost model of ToMA: the end-to-end speed-up a node setting gives on the models users run.

    python -m bench.speed.realsize measure --families flux sdxl      # time probes (CPU, 1 thread), cache them
    python -m bench.speed.realsize table                              # tables from the cache (+ plan timings)
    python -m bench.speed.realsize predict --family flux --resolution 1024 --ratio 0.5 --start-percent 0.4
    python -m bench.speed.realsize predict --family wan14b --resolution 720p --frames 81 --steps 30 --sampler euler
    python -m bench.speed.realsize measure-kv                          # keys/values attention probes (padded heads)
    python -m bench.speed.realsize scopes                              # block against keys/values on video and large images

Families: Flux.1-dev, SDXL, SD1.5, SD3.5 Large, Qwen-Image, Wan 2.1 14B / 1.3B, HunyuanVideo; on ComfyUI 0.33
Flux.2-dev, Flux.2 Klein 4B / 9B, Z-Image (Turbo), HunyuanVideo 1.5, LongCat-Image, Kandinsky 5 Video Lite / Pro
and Image Lite
(realsize_setup.FAMILIES). A prediction combines (a) block times measured at the real width
(realsize_measure: the real ComfyUI class with one or two blocks of each kind, random weights,
merged through the pack's own hooks and unmerged, in turns), fitted per kind as a + b L + heads
attn(L) where the real token count was not run (realsize_model); (b) the full model's real block
list and the blocks the setting selects (the pack's own `blocks` parsing); (c) the evaluations of
the family's own run (its ComfyUI model_sampling and shift, scheduler, sampler, CFG calls), each
decided by the pack's MergeSchedule. Measurements are cached in --cache (JSON); `table` and
`predict` re-use them and only time what is missing (the plans of new token counts).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from . import realsize_measure as measure
from . import realsize_model as model
from . import realsize_setup as rs

CACHE = Path(__file__).resolve().parent / "realsize_cpu.json"
"""The committed cache of the CPU probes (one thread, process CPU clock)."""

PROBES: dict[str, list[tuple[rs.Grid, int]]] = {
    "flux": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1), (rs.Grid(64, 64), 1)],
    "sdxl": [(rs.Grid(48, 48), 1), (rs.Grid(64, 64), 1), (rs.Grid(128, 128), 1)],
    "sd15": [(rs.Grid(32, 32), 1), (rs.Grid(64, 64), 1)],
    "sd35_large": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1)],
    "qwen_image": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1)],
    "wan14b": [(rs.Grid(16, 16, 2), 1), (rs.Grid(16, 16, 4), 1)],
    "wan1.3b": [(rs.Grid(16, 16, 4), 1), (rs.Grid(32, 32, 4), 1)],
    "hunyuan_video": [(rs.Grid(16, 16, 2), 1), (rs.Grid(16, 16, 4), 1)],
    "flux2": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1)],
    "flux2_klein4b": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1)],
    "flux2_klein9b": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1)],
    "zimage": [(rs.Grid(16, 16), 1), (rs.Grid(32, 32), 1)],
    "hunyuan_video15": [(rs.Grid(16, 16, 2), 1), (rs.Grid(16, 16, 4), 1)],
    "kandinsky5_lite": [(rs.Grid(16, 16, 2), 2), (rs.Grid(16, 16, 4), 2), (rs.Grid(32, 32, 4), 2)],
    "kandinsky5_pro": [(rs.Grid(16, 16, 2), 2), (rs.Grid(16, 16, 4), 2)],
    "kandinsky5_image": [(rs.Grid(16, 16), 2), (rs.Grid(32, 32), 2)],
}
"""Token grids (and rounds) each family is timed on: the real token count where one call fits the
CPU budget (Flux.1-dev and SDXL at 1024 px), smaller grids at the real width elsewhere (the fits).
Flux 16 x 16 and SDXL 48 x 48 are the validation sizes (docs/realsize.md, Validation). Families without an entry
(Z-Image base, LongCat-Image) are priced by another family's probes (RealFamily.probes)."""

ATTENTION = {128: [2048, 4096, 8192, 16384], 64: [2048, 4096, 8192], 40: [2048, 4096, 8192], 80: [2048, 4096, 8192],
             160: [2048, 4096, 8192]}
"""SDPA lengths per head_dim for the N^2 terms."""

KV_ATTENTION = [(q, k) for q in (2048, 4096, 8192, 16384) for k in (q // 2, q // 4, q // 10)]
"""(L_q, L_kv) of the keys/values attention probes in the padded head: every query over a half, a
quarter, a tenth of the keys."""

KV_SQUARE = [(q, q) for q in (2048, 4096, 8192)]
"""(L_q, L_kv) of the unpadded square attention timed in the same session (realsize_model.kv_attention_terms)."""

SCOPE_RUNS = [("wan22_14b", "480p"), ("wan22_14b", "720p"), ("wan22_14b_4step", "480p"), ("wan22_14b_4step", "720p"),
              ("hunyuan_video15", "720p"), ("kandinsky5_lite", "768x512"), ("kandinsky5_pro", "768x512"),
              ("flux", "1024"), ("flux", "2048"), ("flux2", "1024"), ("flux2", "2048")]
"""The runs `realsize scopes` compares block and keys/values merging on (video and large images)."""

PROBE_RATIO, PROBE_TILE = 0.5, 4

DEFAULT_SETTING = model.Setting(0.5, 4, 0.75)
"""The basic node's defaults of version 0.1.0 (start_percent 0.75, tile 4), for the tables' first row."""


def load_cache(path: Path) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    return {"meta": {}, "probes": [], "attention": [], "plans": {}}


def save_cache(path: Path, cache: dict[str, Any]) -> None:
    path.write_text(json.dumps(cache, indent=0, sort_keys=True))


def host_meta(device: str) -> dict[str, Any]:
    return {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "clock": "process CPU time" if device == "cpu" else "wall after cuda synchronize",
            "cpu": platform.processor() or platform.machine(), "python": platform.python_version()}


def cmd_measure(args: argparse.Namespace) -> None:
    cache = load_cache(args.cache)
    cache["meta"] = host_meta(args.device)
    needed = sorted({hd for name in args.families for _, hd in model.HEADS[name].values()})
    have = {(p["head_dim"], p["length"]) for p in cache["attention"]}
    for hd in needed:
        todo = [length for length in ATTENTION[hd] if (hd, length) not in have]
        if todo:
            cache["attention"] += measure.attention_probe(hd, todo, args.device)
            print(f"attention head_dim {hd}: {todo}", flush=True)
            save_cache(args.cache, cache)
    for name in args.families:
        def cached(grid: rs.Grid) -> bool:
            return any(r["family"] == name and r["grid"] == [grid.frames, grid.height, grid.width] for r in cache["probes"])

        todo = [grid for grid, _ in PROBES[name] if args.again or not cached(grid)]
        if not todo:
            continue
        rounds = args.rounds or max(n for grid, n in PROBES[name] if grid in todo)

        def keep(records: list[dict[str, Any]], name: str = name) -> None:
            done = {tuple(r["grid"]) for r in records}
            cache["probes"] = [r for r in cache["probes"] if not (r["family"] == name and tuple(r["grid"]) in done)] + records
            save_cache(args.cache, cache)

        measure.probe(name, todo, PROBE_RATIO, PROBE_TILE, rounds, args.device, log=lambda s: print(s, flush=True), keep=keep)


class CachedTimes:
    """Timings read from the cache or timed now; `timed` counts the new ones. With `path`, each new
    timing is saved there at once (a long table keeps what it timed)."""

    def __init__(self, cache: dict[str, Any], device: str, path: Path | None = None) -> None:
        self.cache, self.device, self.timed, self.path = cache, device, 0, path

    def _timed(self) -> None:
        self.timed += 1
        if self.path is not None:
            save_cache(self.path, self.cache)


class PlanTimes(CachedTimes):
    """plan_ms for the model: one plan (realsize_measure.plan_ms) at those tokens, width and setting."""

    def __call__(self, grid: rs.Grid, channels: int, ratio: float, tile: int, tile_frames: int | None = None) -> float:
        frames = "" if tile_frames is None else f":tf{tile_frames}"
        key = f"{grid.frames}x{grid.height}x{grid.width}:{channels}:{ratio:g}:{tile}{frames}:{self.device}"
        if key not in self.cache["plans"]:
            self.cache["plans"][key] = measure.plan_ms(grid, channels, ratio, tile, measure.Clock(self.device), self.device,
                                                       tile_frames=tile_frames)
            self._timed()
        return self.cache["plans"][key]


KV_PROBE_TOKENS = 8192
"""Image tokens at most of a K / V merge probe (KvTimes): larger grids are probed on fewer frames or a
smaller square and scaled by their token count (the merge's work is a few passes over the N x C keys,
values and queries and the tiles' matmuls: linear in N at a fixed tile)."""


class KvTimes(CachedTimes):
    """kv_ms for the model: ms of one keys/values block's K / V merge (realsize_measure.kv_overhead_ms),
    timed on a probe grid of at most KV_PROBE_TOKENS image tokens (the real rows and columns, fewer
    frames; or a smaller square) and scaled to the block's N; cached in the cache's "kv_merge"."""

    def __init__(self, cache: dict[str, Any], device: str, path: Path | None = None) -> None:
        super().__init__(cache, device, path)
        self.cache.setdefault("kv_merge", {})

    def __call__(self, grid: rs.Grid, channels: int, heads: int, text: int, ratio: float, tile: int,
                 tile_frames: int | None = None) -> float:
        probe = kv_probe_grid(grid, tile, tile_frames)
        frames = "" if tile_frames is None else f":tf{tile_frames}"
        key = f"{probe.frames}x{probe.height}x{probe.width}:{channels}:{heads}:{text}:{ratio:g}:{tile}{frames}:{self.device}"
        if key not in self.cache["kv_merge"]:
            self.cache["kv_merge"][key] = measure.kv_overhead_ms(probe, channels, heads, text, ratio, tile, tile_frames,
                                                                 measure.Clock(self.device), self.device)
            self._timed()
        return self.cache["kv_merge"][key] * grid.tokens / probe.tokens


def kv_probe_grid(grid: rs.Grid, tile: int, tile_frames: int | None) -> rs.Grid:
    """The grid KvTimes probes for `grid`: itself when small enough; else a video's first 1 +
    tile_frames frames (frame 0 and one tile of frames), then a square of whole tiles per frame."""
    if grid.tokens <= KV_PROBE_TOKENS:
        return grid
    frames = min(grid.frames, 1 + (tile_frames or 1))
    side = max(tile, int((KV_PROBE_TOKENS / frames) ** 0.5) // tile * tile)
    return rs.Grid(min(grid.height, side), min(grid.width, side), frames)


def setting_of(args: argparse.Namespace) -> model.Setting:
    return model.Setting(args.ratio, args.tile_size, args.start_percent, args.end_percent, args.recompute_every,
                         args.merge_every, args.blocks, args.scope, args.tile_frames)


def node_tile_frames() -> int:
    """The node's frames per tile in video families (nodes/settings.py NODE_TILE_FRAMES)."""
    return rs.pack_module("nodes.settings").NODE_TILE_FRAMES


@functools.cache
def _cached(path: Path) -> dict[str, Any]:
    return load_cache(path)


def predicted_speedup(run: str, scope: str = "block", ratio: float = 0.5, tile_size: int = 8, start_percent: float = 0.4,
                      steps: int | None = None, resolution: str | None = None, tile_frames: int | None = None,
                      cache: Path = CACHE) -> float:
    """Predicted end-to-end speed-up (model calls of the sampling run, CPU ratios from the cached
    probes) of ToMA Patch (Advanced) with `scope` ("block" or "keys_values"), `ratio`, `tile_size` and
    `start_percent` (end 1, blocks auto, min_tokens 0) on the run `run` (a realsize_setup.FAMILIES name:
    its template's sampler, scheduler, CFG and frames, e.g. "wan22_14b", "wan22_14b_4step", "flux",
    "sdxl", "flux2_klein4b") at `steps` (default: the template's) and `resolution` (a RESOLUTIONS
    label; default: the template's size). Video families tile `tile_frames` frames (default: the
    node's). Imports ComfyUI if nothing has (the run's sigmas come from its schedulers); a plan or
    K / V merge the cache lacks is timed here (one thread) and kept in memory only."""
    if "comfy.supported_models" not in sys.modules:
        rs.import_comfy()
    fam = rs.family(run)
    data = _cached(Path(cache))
    setting = model.Setting(ratio, tile_size, start_percent, scope=scope,
                            tile_frames=(tile_frames or node_tile_frames()) if fam.video else None)
    cost = model.fit_family(run, data)
    return model.predict(cost, resolution or fam.resolution, setting, fam.frames, steps,
                         plan_ms=PlanTimes(data, "cpu"), kv_ms=KvTimes(data, "cpu")).speedup


def cmd_predict(args: argparse.Namespace) -> None:
    cache = load_cache(args.cache)
    plans, kvs = PlanTimes(cache, args.device), KvTimes(cache, args.device)
    cost = model.fit_family(args.family, cache)
    frames = args.frames or rs.family(args.family).frames
    p = model.predict(cost, args.resolution, setting_of(args), frames, args.steps, args.sampler, args.scheduler, args.cfg,
                      plan_ms=plans, kv_ms=kvs)
    if plans.timed or kvs.timed:
        save_cache(args.cache, cache)
    print(f"{rs.family(args.family).title} {args.resolution}: {p.speedup:.3f}x predicted ({p.setting.label()}); "
          f"{p.merged_evaluations}/{p.evaluations} evaluations merged, {p.blocks_merged}/{p.blocks} blocks; per merged block "
          + ", ".join(f"{k} {v:.2f}x" for k, v in sorted(p.per_block_speedup.items()))
          + ("" if p.measured_tokens else "; block times fitted (token count not probed)"))


def resolutions_of(name: str) -> list[str]:
    return ["480p", "720p"] if rs.family(name).video else ["1024", "2048"]


def cmd_table(args: argparse.Namespace) -> None:
    from . import realsize_tables

    cache = load_cache(args.cache)
    plans = PlanTimes(cache, args.device)
    text = realsize_tables.all_tables(cache, args.families, plans, [DEFAULT_SETTING, *realsize_tables.settings_from(args.settings)])
    if plans.timed:
        save_cache(args.cache, cache)
    if args.out:
        args.out.write_text(text)
    print(text)


def cmd_measure_kv(args: argparse.Namespace) -> None:
    """The keys/values attention probes (padded heads, fewer keys than queries) of the families' kinds,
    and with --blocks their probe grids (or --grid) timed with --scope (cache["kv_probes"], the
    same-session check of the block models, realsize_tables.kv_probe_table)."""
    cache = load_cache(args.cache)
    cache.setdefault("kv_attention", [])
    cache.setdefault("kv_probes", [])
    heads = {hd for name in args.families for _, hd in model.HEADS[name].values()}
    needed = sorted([(model.padded_head(hd), KV_ATTENTION) for hd in heads] + [(hd, KV_SQUARE) for hd in heads])
    have = {(p["head_dim"], p["length"], p["keys"]) for p in cache["kv_attention"]}
    for hd, pairs in needed:
        todo = [(q, k) for q, k in pairs if (hd, q, k) not in have]
        if todo:
            cache["kv_attention"] += measure.kv_attention_probe(hd, todo, args.device)
            print(f"keys/values attention head_dim {hd}: {todo}", flush=True)
            save_cache(args.cache, cache)
    for name in args.families if args.blocks else []:
        def keep(records: list[dict[str, Any]], name: str = name) -> None:
            done = {(tuple(r["grid"]), r["scope"]) for r in records}
            cache["kv_probes"] = [r for r in cache["kv_probes"]
                                  if not (r["family"] == name and (tuple(r["grid"]), r.get("scope")) in done)] + records
            save_cache(args.cache, cache)

        grids = [rs.Grid(args.grid[1], args.grid[2], args.grid[0])] if args.grid else [grid for grid, _ in PROBES[rs.family(name).probed]][: args.grids]
        measure.probe(rs.family(name).probed, grids, PROBE_RATIO, PROBE_TILE, args.rounds or 1, args.device,
                      log=lambda s: print(s, flush=True), keep=keep, scope=args.scope,
                      tile_frames=node_tile_frames() if rs.family(name).video else None)


def cmd_scopes(args: argparse.Namespace) -> None:
    from . import realsize_tables

    cache = load_cache(args.cache)
    plans, kvs = PlanTimes(cache, args.device, args.cache), KvTimes(cache, args.device, args.cache)
    runs = [tuple(r.split("@")) for r in args.runs] if args.runs else SCOPE_RUNS
    text = realsize_tables.scope_table(cache, runs, args.ratios, args.starts, args.tile_size, node_tile_frames(), plans, kvs)
    if args.check:
        text += "\n\n" + realsize_tables.kv_probe_table(cache, kvs)
    print(text)


def cmd_probes(args: argparse.Namespace) -> None:
    from . import realsize_tables

    cache = load_cache(args.cache)
    print("\n".join(realsize_tables.probe_table(cache, name) for name in args.families))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time the probes missing from the cache")
    m.add_argument("--families", nargs="+", default=list(PROBES), choices=list(PROBES))
    m.add_argument("--rounds", type=int, default=0, help="rounds per grid (0: PROBES' count)")
    m.add_argument("--again", action="store_true", help="re-time probes already cached")
    t = sub.add_parser("table", help="tables per family and resolution from the cache")
    t.add_argument("--families", nargs="+", default=list(PROBES), choices=list(rs.FAMILIES))
    t.add_argument("--settings", type=Path, default=None, help="JSON list of settings (Setting fields) to tabulate")
    t.add_argument("--out", type=Path, default=None)
    k = sub.add_parser("measure-kv", help="time the keys/values attention probes (and with --blocks the families' "
                       "probe grids with scope keys_values)")
    k.add_argument("--families", nargs="+", default=[name for name, _ in SCOPE_RUNS], choices=list(rs.FAMILIES))
    k.add_argument("--blocks", action="store_true", help="also time the families' probe grids with scope keys_values")
    k.add_argument("--grids", type=int, default=1, help="how many of a family's probe grids --blocks times (smallest first)")
    k.add_argument("--grid", type=int, nargs=3, default=None, metavar=("F", "H", "W"), help="--blocks on this grid instead")
    k.add_argument("--rounds", type=int, default=1)
    k.add_argument("--scope", default="keys_values", choices=list(model.SCOPES), help="the merged model's scope (--blocks)")
    c = sub.add_parser("scopes", help="block against keys/values merging on the video and large-image runs")
    c.add_argument("--runs", nargs="+", default=None, help="family@resolution (default: SCOPE_RUNS)")
    c.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75, 0.9])
    c.add_argument("--starts", nargs="+", type=float, default=[0.0, 0.4])
    c.add_argument("--tile-size", type=int, default=8)
    c.add_argument("--check", action="store_true", help="also the keys/values block probes against the model")
    b = sub.add_parser("probes", help="the cached probes of families: block times, fit and merge correction")
    b.add_argument("--families", nargs="+", default=list(PROBES), choices=list(PROBES))
    q = sub.add_parser("predict", help="one prediction")
    q.add_argument("--family", required=True, choices=list(rs.FAMILIES))
    q.add_argument("--resolution", default="1024", choices=list(rs.RESOLUTIONS))
    q.add_argument("--frames", type=int, default=0, help="video frames (0: the family's usual count)")
    q.add_argument("--steps", type=int, default=None)
    q.add_argument("--sampler", default=None)
    q.add_argument("--scheduler", default=None)
    q.add_argument("--cfg", type=float, default=None)
    for name, kind, default in (("ratio", float, 0.5), ("tile-size", int, 4), ("start-percent", float, 0.0),
                                ("end-percent", float, 1.0), ("recompute-every", int, 1), ("merge-every", int, 1)):
        q.add_argument(f"--{name}", type=kind, default=default)
    q.add_argument("--blocks", default="auto")
    q.add_argument("--scope", default="block", choices=list(model.SCOPES))
    q.add_argument("--tile-frames", type=int, default=None, help="frames per tile of a video family's plan (default: the "
                   "earlier accounting, spatial tiles per frame)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rs.import_comfy(args.device)
    {"measure": cmd_measure, "predict": cmd_predict, "table": cmd_table, "probes": cmd_probes, "measure-kv": cmd_measure_kv,
     "scopes": cmd_scopes}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
