"""docs/what_you_get.md's predicted speed-up table and the README's one-row summary of it, generated from
the real-size cost model's cached probes and the defaults search's fixture record.

    python -m bench.speed.what_you_get            # print the generated parts
    python -m bench.speed.what_you_get --write    # rewrite them in docs/what_you_get.md and README.md
    python -m bench.speed.what_you_get --check    # exit 1 when either differs

The table runs from docs/what_you_get.md's `<!-- what-you-get: start -->` marker to its
`<!-- what-you-get: generated above -->` marker (heading, intro, table, note); the per-family advice after
it is written by hand. The README's summary (between its `<!-- what-you-get summary: ... -->` markers) is
the defaults column of SUMMARY's rows. Speed-ups: bench/speed/realsize_model.py `predict` (CPU ratios, one thread) on each
run as its ComfyUI template sets it up (bench/speed/realsize_setup.py FAMILIES); the block-merge
columns at ratio 0.5, the keys/values columns at ratio 0.75, both at the node's tile 8 except Flux.1-dev
and SDXL's start 0.25 and every-step columns at tile 4, the settings the defaults search sampled on
the fixtures (bench/speed/defaults_search.py); the defaults column at the scope the node's `scope` auto
runs on each model (keys/values on HunyuanVideo, Wan and Kandinsky 5, block elsewhere); video families' plans as the node builds them (frame 0
alone, tiles of the node's tile frames). Fixture quality: its record, mean over the seeds.
A plan or K / V merge the cache lacks is timed on this machine and added to the cache.

Per attention kernel (kernel_cells): the pack's own cost model on a GPU (toma_core/cost.py through
nodes/run/prediction.py: the full-size model's CostProfile, priced on each kernel in the form that runs
there, `scope` auto's per-kernel choice), per evaluation of the run as rs.evaluations decides it; the
GPU check's measured per-call speed-ups (bench/speed/gpu_check.py --kernels-json GPU_KERNELS) where
that file is committed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from . import defaults_search, gpu_check, realsize
from . import realsize_model as model
from . import realsize_setup as rs

ROOT = Path(__file__).resolve().parents[2]
README, TABLE = ROOT / "README.md", ROOT / "docs" / "what_you_get.md"
GPU_KERNELS = Path(__file__).resolve().parent / "gpu_kernels.json"
"""Per-kernel call timings written by `python -m bench.speed.gpu_check --kernels-json` (read when present)."""
KERNEL_COLUMNS = ("sdpa", "sage2", "flash3")
"""The attention kernels priced per row (toma_core/kernels.py names): PyTorch SDPA, SageAttention 2, FlashAttention 3."""
KERNEL_HEADS = ("GPU defaults: SDPA", "Sage 2", "FA3", "GPU keys_values 0.75, every step: SDPA", "Sage 2", "FA3")
START, END = "<!-- what-you-get: start -->", "<!-- what-you-get: generated above -->"
SUMMARY_START, SUMMARY_END = "<!-- what-you-get summary: start -->", "<!-- what-you-get summary: end -->"

SUMMARY = ("Flux.1-dev (20 steps)", "SDXL (30 steps, CFG)", "Wan 2.2 14B (20 steps, CFG), 81 frames",
           "Wan 2.2 14B + LightX2V (4 steps, cfg 1), 81 frames")
"""The rows whose defaults column the README's summary quotes."""

COLUMNS = ("defaults: 0.75, start 0.2, scope auto", "block 0.5, start 0.25", "block 0.5, every step",
           "keys_values 0.75, start 0.4", "keys_values 0.75, every step")


def node_settings(tile_frames: int | None = None) -> list[model.Setting]:
    """The table's columns at the node's tile 8 (tile_frames: a video family's plan as the node builds it)."""
    return [model.Setting(0.75, 8, 0.2, tile_frames=tile_frames), model.Setting(0.5, 8, 0.25, tile_frames=tile_frames),
            model.Setting(0.5, 8, 0.0, tile_frames=tile_frames),
            model.Setting(0.75, 8, 0.4, scope="keys_values", tile_frames=tile_frames),
            model.Setting(0.75, 8, 0.0, scope="keys_values", tile_frames=tile_frames)]


SEARCHED = [model.Setting(0.75, 8, 0.2), model.Setting(0.5, 4, 0.25), model.Setting(0.5, 4, 0.0),
            model.Setting(0.75, 8, 0.4, scope="keys_values"), model.Setting(0.75, 8, 0.0, scope="keys_values")]
"""Flux.1-dev's and SDXL's columns: the block-merge settings the defaults search sampled on the fixtures."""


@dataclass(frozen=True)
class Row:
    """One table row: the label, the size cell, the runs (family, resolution) whose speed-ups a cell
    joins with " / ", the settings per column; steps: note the steps the first run merges at the defaults."""

    label: str
    size: str
    runs: tuple[tuple[str, str], ...]
    settings: tuple[model.Setting, ...]
    steps: bool = False


def rows() -> list[Row]:
    video = realsize.node_tile_frames()
    node, frames = tuple(node_settings()), tuple(node_settings(video))
    return [
        Row("Flux.1-dev (20 steps)", "1024 / 2048 px", (("flux", "1024"), ("flux", "2048")), tuple(SEARCHED)),
        Row("SDXL (30 steps, CFG)", "1024 / 2048 px", (("sdxl", "1024"), ("sdxl", "2048")), tuple(SEARCHED)),
        Row("Flux.2-dev (20 steps)", "1024 / 2048 px", (("flux2", "1024"), ("flux2", "2048")), node),
        Row("Flux.2 Klein 4B / 9B (4 steps)", "1024 px", (("flux2_klein4b", "1024"), ("flux2_klein9b", "1024")), node, steps=True),
        Row("Z-Image Turbo (8 steps) / Z-Image (25, CFG) / Kandinsky 5 Image Lite (50, CFG)", "1024 px",
            (("zimage", "1024"), ("zimage_base", "1024"), ("kandinsky5_image", "1024")), node),
        Row("HunyuanVideo 1.5 (20 steps) / Kandinsky 5 Video Lite / Pro (50 steps); 121 frames, CFG", "720p / 768 x 512",
            (("hunyuan_video15", "720p"), ("kandinsky5_lite", "768x512"), ("kandinsky5_pro", "768x512")), frames),
        Row("Wan 2.2 14B (20 steps, CFG), 81 frames", "480p / 720p", (("wan22_14b", "480p"), ("wan22_14b", "720p")), frames),
        Row("Wan 2.2 14B + LightX2V (4 steps, cfg 1), 81 frames", "480p / 720p",
            (("wan22_14b_4step", "480p"), ("wan22_14b_4step", "720p")), frames),
    ]


def speed_cells(row: Row, cache: dict, plans: realsize.PlanTimes, kvs: realsize.KvTimes) -> list[str]:
    """Each column's predicted speed-ups of the row's runs; the first (defaults) column at each run's auto scope."""
    cells = []
    for i, setting in enumerate(row.settings):
        runs = [(name, resolution, dataclasses.replace(setting, scope=rs.pack_family(name).scope) if i == 0 else setting) for name, resolution in row.runs]
        preds = [model.predict(model.fit_family(name, cache), resolution, run, rs.family(name).frames, plan_ms=plans, kv_ms=kvs)
                 for name, resolution, run in runs]
        cell = " / ".join(f"{p.speedup:.2f}x" for p in preds)
        first = preds[0]
        if row.steps and i == 0 and first.merged_evaluations < first.evaluations:
            cell += f" ({first.merged_evaluations} of {first.evaluations} steps)"
        cells.append(cell)
    return cells


def fixture_record() -> dict:
    """The defaults search's fixture records (defaults_search.QUALITY and LATER) as one."""
    return defaults_search.merge_quality([json.loads(path.read_text()) for path in (defaults_search.QUALITY, defaults_search.LATER)])


def quality_cells(quality: dict) -> list[str]:
    """Flux / SDXL fixture PSNR per column where the record has it at blocks auto's later half (keys/values
    and the block columns sampled with the earlier blocks auto: not shown)."""
    cells = []
    for setting in SEARCHED:
        label = dataclasses.replace(setting, blocks="later").label()
        if any(label not in quality["families"][name]["rows"] for name in ("flux", "sdxl")):
            cells.append("–")
            continue
        values = [statistics.mean(quality["families"][name]["rows"][label]["psnr"]) for name in ("flux", "sdxl")]
        cells.append(" / ".join(f"{v:.1f}" for v in values) + " dB")
    return cells


def section(cache: dict, quality: dict, plans: realsize.PlanTimes, kvs: realsize.KvTimes) -> str:
    lines = [
        START, "## Predicted speed-ups", "",
        ("Predicted end-to-end speed-up of a sampling run (model calls only) from real-width block timings on this project's CPU, runs as "
        "ComfyUI's templates set them up, merging whole blocks (`scope` block) or only attention's keys and values (`scope` keys_values, "
        "every query kept); the defaults at the scope `scope` auto runs (keys_values on HunyuanVideo, Wan and Kandinsky 5, block elsewhere); "
        "how, and the defaults search: [realsize.md](realsize.md) ([defaults.md](defaults.md))."), "",
        "| model (run) | size | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS),
    ]
    lines += [f"| {r.label} | {r.size} | " + " | ".join(speed_cells(r, cache, plans, kvs)) + " |" for r in rows()]
    lines.append("| Flux / SDXL fixture quality (PSNR) | 128 / 64 px | " + " | ".join(quality_cells(quality)) + " |")
    lines += ["", ("Per attention kernel, on a GPU: the same runs priced by the pack's cost model for each kernel (its head-size "
              "buckets and its speed against SDPA, toma_core/kernels.py), over the unpatched run on the same kernel; keys/values "
              "in the form the pack runs on that kernel ([keys_values.md](keys_values.md))."), "",
              "| model (run) | size | " + " | ".join(KERNEL_HEADS) + " |", "|---|---|" + "---:|" * len(KERNEL_HEADS)]
    lines += [f"| {r.label} | {r.size} | " + " | ".join(kernel_cells(r)) + " |" for r in rows()]
    lines += ["", ("Generated by `python -m bench.speed.what_you_get --write`; fixture quality: mean over 3 seeds (`python -m "
              "bench.speed.defaults_search table --quality bench/speed/defaults_search_later.json`), with `blocks` auto the later "
              "half of the blocks; Flux.1-dev and SDXL at tile 4 from start 0.25 and every step, tile 8 elsewhere; "
              "video plans in tiles of 4 frames, as the node builds them; the 0.33 models fitted from smaller probes, about ±0.06x. "
              "CPU ratios (one thread); on a GPU re-measure with "
              "`python -m bench.speed.realsize --device cuda measure`. GPU columns: the pack's own cost model on a GPU per "
              "attention kernel (toma_core/kernels.py: the bucket of the keys/values form that runs there, the kernel's speed "
              "against SDPA; `scope` auto's choice on that kernel)." + measured_note()), END]
    return "\n".join(lines)


def kernel_speedup(name: str, resolution: str, setting: model.Setting, kernel_name: str, auto: bool = False) -> float:
    """Predicted run speed-up on a GPU whose attention runs `kernel_name`: unmerged over merged model
    time, each evaluation merged as the schedule decides, priced by the pack's cost model; `auto`:
    the family's scope (scope "auto"), or block where keys_values does not pay on the kernel."""
    prediction, cost = rs.pack_module("nodes.run.prediction"), rs.pack_module("toma_core.cost")
    kernel = rs.pack_module("toma_core.kernels").KERNELS[kernel_name]
    scope = rs.pack_family(name).scope if auto else setting.scope
    profile = toma_profile(name, dataclasses.replace(setting, scope=scope))
    if auto and scope == "keys_values" and not profile.keys_values_pays(kernel, "cuda")[0]:
        profile = toma_profile(name, dataclasses.replace(setting, scope="block"))
    width, height = rs.RESOLUTIONS[resolution]
    fam = rs.family(name)
    grid = rs.grid_for(name, width, height, fam.frames)
    blocks, batch = prediction.on_kernel(profile.blocks, kernel, "cuda"), rs.calls_per_evaluation(name)
    args = (grid.tokens, fam.text_len)
    merged = cost.call_flops(blocks, *args, profile.kept, "cuda", batch, profile.tile_tokens)
    unmerged = cost.call_flops(blocks, *args, 1.0, "cuda", batch)
    evals = rs.evaluations(name, resolution, setting.schedule())
    return unmerged * len(evals) / sum(merged if e.merge else unmerged for e in evals)


def toma_profile(name: str, setting: model.Setting):
    """The CostProfile the pack's patch_model builds for the full-size model at `setting` (min_tokens 0)."""
    toma = rs.pack_module("nodes.settings").ToMASettings(ratio=setting.ratio, tile_size=setting.tile_size, schedule=setting.schedule(),
                                                         blocks=setting.blocks, scope=setting.scope, tile_frames=setting.tile_frames or 1)
    return gpu_check.cost_profile(rs.meta_patcher(name), toma)


def kernel_cells(row: Row) -> list[str]:
    """Per kernel (KERNEL_COLUMNS), the row's runs at its defaults (scope auto) and at keys_values 0.75 from
    the first step, predicted on a GPU (kernel_speedup)."""
    columns = ((row.settings[0], True), (row.settings[4], False))
    return [" / ".join(f"{kernel_speedup(name, r, setting, k, auto):.2f}x" for name, r in row.runs)
            for setting, auto in columns for k in KERNEL_COLUMNS]


def measured_note() -> str:
    """The GPU check's measured per-call speed-ups per kernel, where GPU_KERNELS is committed."""
    if not GPU_KERNELS.exists():
        return ""
    measured = json.loads(GPU_KERNELS.read_text())
    return (f" Measured on {measured['device']} (`python -m bench.speed.gpu_check --kernels-json`), one call of a few-block model: " +
            "; ".join(f"{r['family']} {r['size']} {r['kernel']} {r['scope']} {r['speedup']:.2f}x" for r in measured["rows"]) + ".")


def summary(cache: dict, plans: realsize.PlanTimes, kvs: realsize.KvTimes) -> str:
    """The README's summary: SUMMARY's rows at the node's defaults, between the summary markers."""
    cells = [f"{r.label} at {r.size}: **{speed_cells(r, cache, plans, kvs)[0]}**" for r in rows() if r.label in SUMMARY]
    names = dict(zip(KERNEL_COLUMNS, ("SDPA", "Sage 2", "FlashAttention 3")))
    gpu = [f"{r.label} at {r.size}: " + ", ".join(f"{names[k]} {cell}" for k, cell in zip(KERNEL_COLUMNS, kernel_cells(r)))
           for r in rows() if r.label in SUMMARY[2:]]
    return "\n".join([SUMMARY_START, ("Predicted speed-up of a whole run at the node's defaults (PyTorch SDPA, "
                                      "real-width block timings on a CPU): " + "; ".join(cells) + ". On a GPU, over the "
                                      "unpatched run on the same attention kernel (the cost model per kernel): " + "; ".join(gpu) + "."),
                       SUMMARY_END])


def part(text: str, start: str, end: str) -> str:
    """The part of `text` from marker `start` to marker `end`, both included."""
    return text[text.index(start):text.index(end) + len(end)]


def replace(text: str, generated: str, start: str = START, end: str = END) -> str:
    """`text` with the part from `start` to `end` (both included) replaced by `generated`."""
    return text.replace(part(text, start, end), generated)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the generated parts of docs/what_you_get.md and README.md")
    p.add_argument("--check", action="store_true", help="exit 1 when a generated part differs")
    p.add_argument("--cache", type=Path, default=realsize.CACHE)
    args = p.parse_args(argv)
    rs.import_comfy()
    cache = realsize.load_cache(args.cache)
    plans, kvs = realsize.PlanTimes(cache, "cpu"), realsize.KvTimes(cache, "cpu")
    quality = fixture_record()
    generated, short = section(cache, quality, plans, kvs), summary(cache, plans, kvs)
    if plans.timed or kvs.timed:
        realsize.save_cache(args.cache, cache)
    table, readme = TABLE.read_text(encoding="utf-8"), README.read_text(encoding="utf-8")
    if args.check:
        if part(table, START, END) != generated or part(readme, SUMMARY_START, SUMMARY_END) != short:
            print("docs/what_you_get.md or README.md differ from `python -m bench.speed.what_you_get`", file=sys.stderr)
            return 1
        return 0
    if args.write:
        TABLE.write_text(replace(table, generated), encoding="utf-8")
        README.write_text(replace(readme, short, SUMMARY_START, SUMMARY_END), encoding="utf-8")
    print(generated, short, sep="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
