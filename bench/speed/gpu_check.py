"""One-shot GPU check: real-size block timings in bf16, the cost model beside them, `min_tokens auto`'s
decision at each size, and the trained fixtures' quality in bf16, written to one Markdown file.

    python -m bench.speed.gpu_check --out bench/out/gpu_check.md              # on a GPU (about 8 minutes on one H200)
    python -m bench.speed.gpu_check --tiny --device cpu --out /tmp/check.md   # toy widths on a CPU, seconds (CI)

Sections of the file, each written as soon as it is done (a run cut short keeps what it finished):

1. Timings: each family's few-block model at the real width (bench/speed/realsize_measure.probe:
   ComfyUI's own class, one or two blocks of each kind, every non-block layer, random weights),
   one model call as a sampler makes it, unmerged and merged through the pack's patch_model at the
   node defaults' ratio and tile (nodes/settings.py NODE_RATIO, NODE_TILE_SIZE; video tiles span
   NODE_TILE_FRAMES frames; blocks "all", every call merged, the plan built in the call), in turns,
   in bf16 with torch SDPA. Beside the measured speed-up: the cost model's prediction for that same
   model and call (nodes/run/prediction.py over toma_core/cost.py, on the run's device type).
2. `min_tokens auto`: the full-size model (built on torch's meta device) patched as the ToMA Patch
   node patches it (node defaults, min_tokens auto), and the decision its cost profile takes for
   a call of each size (CostProfile.auto_veto) on "cuda" and on "cpu".
3. Fixture quality: each trained fixture (fixtures/, harness/trained.py and trained_video.py)
   sampled in fp32 and in bf16, unpatched and at the ToMA Patch node's defaults (min_tokens 0, as
   trained.patch_at_node_defaults says why); PSNR against the fp32 unpatched result.
5. Attention kernels (`--kernels-only` runs this section alone, under 8 minutes on one H100): on each kernel
   this machine imports (SDPA always; sageattention, flash_attn, installed as ComfyUI's flags select
   them), one call of the few-block model unpatched, merged at scope block and at keys_values (a Wan
   14B block at 480p / 720p x 81, a Flux block at 2048 px; --tiny: toy sizes, SDPA only), and the
   merged attention of the form the pack runs on that kernel (keys_values.choose_form) against the exact
   proportional-attention formula on the Wan 480p call's q / k / v (first KERNEL_CHECK_ROWS queries).
   --kernels-json writes the rows for bench/speed/what_you_get.py (GPU_KERNELS).
4. MultiGPU CFG Split (bench/speed/multigpu_check.py), on a machine with two GPUs and a ComfyUI that
   has it (0.33): Flux and SDXL sampled with ToMA on one GPU and split over two, each GPU's calls
   counted, the run lines' counts and the latents compared; elsewhere the section says why it was
   skipped.

A family whose ComfyUI class this tree lacks (Flux.2 and Z-Image on ComfyUI 0.3.64) is skipped by
name in every table. --tiny replaces the real widths by toy ones (TINY_OVERRIDES) and the sizes by
small grids, and samples the fixtures for TINY_STEPS steps: the same code paths in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness import comfy_env
from harness.metrics import psnr
from harness.pack import pack_module

from ..cli import DTYPES
from . import multigpu_check as multigpu
from . import realsize_measure as measure
from . import realsize_setup as rs

log = logging.getLogger("bench.gpu_check")

@dataclass(frozen=True)
class Size:
    """One call size of a family: its label and token grid (F frames of h x w image tokens)."""

    label: str
    grid: rs.Grid


def real_size(name: str, resolution: str, frames: int = 1) -> Size:
    """The token grid of a `resolution` (realsize_setup.RESOLUTIONS) image or video of `frames` frames."""
    width, height = rs.RESOLUTIONS[resolution]
    label = f"{resolution} x {frames} frames" if rs.family(name).video else f"{resolution} px"
    return Size(label, rs.grid_for(name, width, height, frames))


FAMILIES = ("flux", "flux2", "sdxl", "zimage", "wan1.3b", "wan14b")
"""The families checked, in the order they run (realsize_setup.FAMILIES names)."""

REAL_SIZES: dict[str, list[tuple[str, int]]] = {
    "flux": [("512", 1), ("1024", 1), ("2048", 1)],
    "flux2": [("512", 1), ("1024", 1), ("2048", 1)],
    "sdxl": [("512", 1), ("1024", 1), ("2048", 1)],
    "zimage": [("512", 1), ("1024", 1), ("2048", 1)],
    "wan1.3b": [("480p", 33), ("480p", 81)],
    "wan14b": [("480p", 33), ("480p", 81), ("720p", 81)],
}
"""(resolution, frames) of the calls timed and decided per family."""

TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "flux": {"hidden_size": 64, "num_heads": 2, "axes_dim": [8, 12, 12], "context_in_dim": 32},
    "flux2": {"hidden_size": 128, "num_heads": 2, "axes_dim": [16, 16, 16, 16], "context_in_dim": 32},
    "sdxl": {"model_channels": 32, "num_head_channels": 16, "context_dim": 32},
    "zimage": {"dim": 256, "n_heads": 2, "n_kv_heads": 2, "cap_feat_dim": 32},
    "wan1.3b": {"dim": 64, "ffn_dim": 128, "num_heads": 2, "text_dim": 32},
    "wan14b": {"dim": 64, "ffn_dim": 128, "num_heads": 2, "text_dim": 32},
}
"""--tiny: toy widths of the same classes, text of width 32 (Z-Image: width 256, the least its
z_image_modulation takes, 2 heads of its real 128 rope width)."""

TINY_SIZES: dict[str, rs.Grid] = {"flux": rs.Grid(8, 8), "flux2": rs.Grid(8, 8), "sdxl": rs.Grid(16, 16),
                                  "zimage": rs.Grid(8, 8), "wan1.3b": rs.Grid(8, 8, 2), "wan14b": rs.Grid(8, 8, 2)}

TINY_STEPS = 2
"""--tiny: sampler steps of each fixture run (the fixtures' own count otherwise)."""

ROUNDS = 3
"""Unmerged / merged call pairs timed per size (the median is reported); 1 with --tiny."""


def sizes(name: str, tiny: bool) -> list[Size]:
    if tiny:
        grid = TINY_SIZES[name]
        return [Size(f"tiny {grid.frames}x{grid.height}x{grid.width}", grid)]
    return [real_size(name, resolution, frames) for resolution, frames in REAL_SIZES[name]]


def missing_class(name: str) -> str | None:
    """Why this ComfyUI cannot build `name` (its comfy.supported_models class is absent), or None."""
    import comfy.supported_models

    cls = rs.family(name).config_class
    if hasattr(comfy.supported_models, cls):
        return None
    return f"{rs.family(name).title} skipped: ComfyUI {comfy_version()} has no comfy.supported_models.{cls}"


def comfy_version() -> str:
    root = comfy_env.find_comfy_root()
    return comfy_env.comfy_version(root) if root is not None else "?"


def cost_profile(patcher: Any, settings: Any) -> Any:
    """The CostProfile the pack's patch_model builds for `patcher` with `settings`."""
    patched = pack_module("nodes.node.patching").patch_model(patcher, settings)
    return patched.model_options["transformer_options"][pack_module("nodes.settings").TOMA_KEY].config.cost


# ------------------------------------------------------------------------------ 1. timings


def timing_rows(name: str, tiny: bool, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Measured and predicted speed-up of one call per size (module docstring, section 1)."""
    settings = pack_module("nodes.settings")
    ratio, tile = settings.NODE_RATIO, settings.NODE_TILE_SIZE
    overrides = TINY_OVERRIDES[name] if tiny else {}
    chosen = sizes(name, tiny)
    records = measure.probe(name, [s.grid for s in chosen], ratio, tile, 1 if tiny else ROUNDS, device, log=log.info,
                            dtype=dtype, overrides=overrides)
    reduced = measure.build_reduced(name, "meta", overrides=overrides) if overrides else rs.meta_patcher(name, reduced=True)
    profile = cost_profile(reduced, settings.ToMASettings(ratio=ratio, tile_size=tile, blocks="all"))  # the probed model's
    rows = []
    for size in chosen:
        mine = [r for r in records if r["grid"] == [size.grid.frames, size.grid.height, size.grid.width]]
        unmerged = statistics.median(r["unmerged"]["call_ms"] for r in mine)
        merged = statistics.median(r["merged"]["call_ms"] for r in mine)
        plan = statistics.median(sum(r["plan_ms"].values()) for r in mine)
        rows.append({"family": name, "size": size.label, "tokens": size.grid.tokens, "unmerged_ms": unmerged,
                     "merged_ms": merged, "plan_ms": plan, "measured": unmerged / merged,
                     "predicted": profile.speedup(size.grid.tokens, rs.family(name).text_len, device.split(":")[0], 1)})
    return rows


def timing_table(rows: list[dict[str, Any]], skipped: list[str], device: str, dtype: str) -> str:
    lines = [f"## Block timings ({dtype}, torch SDPA, {device})", "",
             "One call of the few-block model at the real width (realsize_measure.probe), unmerged and merged at the "
             "node defaults' ratio and tile on every block; median of the rounds. \"predicted\": the cost model "
             "(nodes/run/prediction.py) for that model and call.", "",
             "| family | size | image tokens N | unmerged ms | merged ms | plan ms | measured | predicted |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['size']} | {r['tokens']:,} | {r['unmerged_ms']:.2f} | {r['merged_ms']:.2f} | "
                     f"{r['plan_ms']:.2f} | {r['measured']:.2f}x | {r['predicted']:.2f}x |")
    return "\n".join(lines + [f"\n{s}" for s in skipped]) + "\n"


# ------------------------------------------------------------------------------ 2. auto


def auto_rows(name: str) -> list[dict[str, Any]]:
    """auto's decision for the full-size model at each real size, on cuda and on cpu."""
    contract, settings = pack_module("nodes.contract"), pack_module("nodes.settings")
    schedule = pack_module("toma_core").MergeSchedule(start_percent=settings.NODE_START_PERCENT)
    profile = cost_profile(rs.meta_patcher(name), settings.ToMASettings(  # the ToMA Patch node's defaults
        ratio=settings.NODE_RATIO, tile_size=settings.NODE_TILE_SIZE, schedule=schedule, min_tokens="auto"))
    batch = rs.calls_per_evaluation(name)
    rows = []
    for size in sizes(name, tiny=False):
        g = size.grid
        geometry = contract.CallGeometry(g.height, g.width, text_len=rs.family(name).text_len, frames=g.frames)
        row: dict[str, Any] = {"family": name, "size": size.label, "tokens": g.tokens, "batch": batch}
        for device in ("cuda", "cpu"):
            prediction = profile.predict(g.tokens, rs.family(name).text_len, device, batch)
            decision = "unmerged" if profile.auto_veto(geometry, device, batch) else "merge"
            row[device] = (prediction.speedup, "measured" if prediction.close else decision)
        rows.append(row)
    return rows


def auto_table(rows: list[dict[str, Any]], skipped: list[str]) -> str:
    floor = pack_module("nodes.run.prediction").AUTO_MIN_SPEEDUP
    lines = ["## min_tokens auto", "",
             f"The full-size model patched at the node defaults (min_tokens auto); a call merges when its predicted "
             f"speed-up is at least {floor:g}x; \"measured\": the cost model's error range holds {floor:g}x, so the run "
             "times an unmerged and a merged call and decides (nodes/run/gain.py, nodes/run/judge.py).", "",
             "| family | size | image tokens N | batch | predicted (cuda) | auto (cuda) | predicted (cpu) | auto (cpu) |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['size']} | {r['tokens']:,} | {r['batch']} | {r['cuda'][0]:.2f}x | {r['cuda'][1]} | "
                     f"{r['cpu'][0]:.2f}x | {r['cpu'][1]} |")
    return "\n".join(lines + [f"\n{s}" for s in skipped]) + "\n"


# ------------------------------------------------------------------------------ 3. fixtures


def on_device(patcher: Any, device: str) -> Any:
    """`patcher`'s model in a ModelPatcher that the sampler loads onto `device`."""
    import comfy.model_patcher

    if device == "cpu":
        return patcher
    return comfy.model_patcher.ModelPatcher(patcher.model, load_device=torch.device(device),
                                            offload_device=torch.device("cpu"))


def fixture_sampler(fixture: str, steps: int | None) -> Callable[[Any], torch.Tensor]:
    """model -> the decoded image (3, H, W) or clip (3, F, H, W, the "wan" fixture) of the fixture's run (its
    own steps, or `steps`)."""
    import comfy.sample

    from harness import trained
    from harness import trained_video as tv

    video = fixture == "wan"
    positive, negative = tv.conditioning() if video else trained.conditioning(fixture)
    s = dict(tv.SAMPLER if video else trained.SAMPLER[fixture]) | ({"steps": steps} if steps else {})
    empty = torch.zeros(tv.latent_shape() if video else trained.latent_shape(fixture))

    def sample(model: Any) -> torch.Tensor:
        noise = comfy.sample.prepare_noise(empty, 0)
        out = comfy.sample.sample(model, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"], positive,
                                  negative, empty, seed=0, disable_pbar=True).float().cpu()
        return (tv.decode(out) if video else trained.decode(fixture, out))[0]

    return sample


def fixture_row(fixture: str, steps: int | None, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """PSNR (dB) against the fp32 unpatched result: `dtype` unpatched, fp32 and `dtype` at the node defaults."""
    from harness import trained, trained_video

    sample = fixture_sampler(fixture, steps)
    load = trained_video.load_model if fixture == "wan" else (lambda dt: trained.load_model(fixture, dt))
    full, low = on_device(load(torch.float32), device), on_device(load(dtype), device)
    reference = sample(full)
    results = {"unpatched": sample(low), "ToMA fp32": sample(trained.patch_at_node_defaults(full)),
               "ToMA low": sample(trained.patch_at_node_defaults(low))}
    return {"fixture": fixture, "steps": steps or "own"} | {k: psnr(reference, v) for k, v in results.items()}


def fixture_table(rows: list[dict[str, Any]], skipped: list[str], dtype: str) -> str:
    lines = ["## Fixture quality", "",
             "PSNR against the fixture's fp32 unpatched result (same seed); ToMA at the ToMA Patch node's defaults, "
             "min_tokens 0.", "",
             f"| fixture | steps | {dtype} unpatched | fp32 ToMA | {dtype} ToMA |", "|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['fixture']} | {r['steps']} | {r['unpatched']:.1f} dB | {r['ToMA fp32']:.1f} dB | "
                     f"{r['ToMA low']:.1f} dB |")
    return "\n".join(lines + [f"\n{s}" for s in skipped]) + "\n"


def fixtures() -> tuple[list[str], list[str]]:
    """(fixtures present, lines saying which are missing)."""
    from harness import trained, trained_video

    present = [*trained.available(), *(["wan"] if trained_video.available() else [])]
    missing = [f"{name}: skipped, fixtures/{name}.safetensors missing" for name in (*trained.FAMILIES, "wan")
               if name not in present]
    return present, missing


# ------------------------------------------------------------------------------ 4. MultiGPU CFG Split


def multigpu_section(args: argparse.Namespace, dtype: torch.dtype) -> str:
    """Section 4 (multigpu_check.py), or the reason it was skipped; a family that fails is said and the check goes on."""
    why = multigpu.skip_reason(args.device, comfy_version())
    if why:
        log.info(why)
        return multigpu.table([], [why])
    rows, failed = [], []
    for name in (n for n in multigpu.FAMILIES if n in args.families):
        size = sizes(name, tiny=True)[0] if args.tiny else real_size(name, multigpu.RESOLUTION)
        steps = multigpu.TINY_STEPS if args.tiny else multigpu.STEPS
        try:
            rows.append(multigpu.family_row(name, size.grid, size.label, steps, args.device, dtype,
                                            TINY_OVERRIDES[name] if args.tiny else None))
        except RuntimeError as error:
            failed.append(f"{name}: failed on two GPUs: {str(error).splitlines()[0]}")
            log.error("MultiGPU CFG Split, %s: %s", name, error)
            continue
        log.info("MultiGPU CFG Split, %s: %s", name, rows[-1])
    return multigpu.table(rows, failed)


# ------------------------------------------------------------------------------ 5. kernels

KERNEL_SIZES = {"wan14b": [("480p", 81), ("720p", 81)], "flux": [("2048", 1)]}
KERNEL_CHECK_ROWS = 1024
MODEL_MODULES = ("comfy.ldm.modules.attention", "comfy.ldm.wan.model", "comfy.ldm.flux.math")
"""The modules that import ComfyUI's selected `optimized_attention` by name (its flags set it at import)."""


def kernels_present(device: str) -> dict[str, str]:
    """toma_core/kernels.py name -> ComfyUI attention function, for each kernel installed here (sage and flash on a GPU)."""
    found = {"sdpa": "attention_pytorch"}
    for module, function, name in (("sageattention", "attention_sage", lambda v: "sage1" if v < "2" else "sage2"),
                                   ("flash_attn", "attention_flash", lambda v: "flash2.8" if v >= "2.8" else "flash2")):
        if device.startswith("cuda") and importlib.util.find_spec(module) is not None:
            found[name(importlib.metadata.version(module))] = function
    return found


def use_kernel(function: str) -> Any:
    """Make ComfyUI's `function` the models' optimized_attention, as its flag does; return it."""
    attention = importlib.import_module(MODEL_MODULES[0])
    if function == "attention_sage" and not hasattr(attention, "sageattn"):
        attention.sageattn = importlib.import_module("sageattention").sageattn
    chosen = getattr(attention, function)
    for module in MODEL_MODULES:
        setattr(importlib.import_module(module), "optimized_attention", chosen)
    return chosen


def exact_error(function: Any, grid: rs.Grid, device: str, dtype: torch.dtype) -> tuple[str, float]:
    """(form, relative error) of the merged attention the pack runs on ComfyUI's `function` over Wan 14B's q / k / v
    on `grid` (40 heads of 128; a plan at the node's ratio and tile) against the exact formula
    softmax(q k_m^T / sqrt(e) + log m) v_m (log m left out in the plain form), on the first KERNEL_CHECK_ROWS queries, in fp32."""
    core, kv = pack_module("toma_core"), pack_module("toma_core.keys_values")
    settings = pack_module("nodes.settings")
    gen = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(1, 40, grid.tokens, 128, generator=gen, device=device).to(dtype) for _ in range(3))
    features = torch.randn(1, grid.tokens, 64, generator=gen, device=device)
    plan = core.make_plan(features, grid.frames * grid.height, grid.width, settings.NODE_RATIO, settings.NODE_TILE_SIZE)
    run_kernel = pack_module("nodes.machinery.kernel_choice").run_kernel
    form = kv.choose_form(run_kernel(None, device.split(":")[0])[0], 128, False)  # as the pack picks it on Wan (Keys.balance off)
    km, vm = kv.merge_key_rows(k, plan, 0), kv.merge_key_rows(v, plan, 0)
    bias = plan.size_bias() if form == kv.CHANNEL else None  # plain: every merged key counts once
    args = kv.with_mass_channel(q, km, vm, bias) if form == kv.CHANNEL else (q, km, vm)
    out = function(*args, heads=40, skip_reshape=True, skip_output_reshape=True)[:, :, :KERNEL_CHECK_ROWS, :128]
    rows = q[:, :, :KERNEL_CHECK_ROWS].float()
    scores = rows @ km.float().transpose(-1, -2) / 128 ** 0.5 + (0 if bias is None else bias.float()[:, None, None, :])
    expected = scores.softmax(-1) @ vm.float()
    return form, float((out.float() - expected).norm() / expected.norm())


def kernel_rows(args: argparse.Namespace, dtype: torch.dtype) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Timing rows (family, size, kernel, scope, ms, speedup) and exactness rows (kernel, form, error) per
    kernel present; a kernel that fails (an import, a refused call) gets its reason as its form, the check goes on."""
    timings, exact = [], []
    for kernel, function in kernels_present(args.device).items():
        try:
            chosen = use_kernel(function)
            timings += [row | {"kernel": kernel} for row in kernel_timings(args, dtype)]
            grid = TINY_SIZES["wan14b"] if args.tiny else real_size("wan14b", "480p", 81).grid
            form, error = exact_error(chosen, grid, args.device, dtype)
        except (ImportError, RuntimeError, ValueError, AssertionError) as failure:
            form, error = f"failed: {str(failure).splitlines()[0] if str(failure) else type(failure).__name__}", float("nan")
        exact.append({"kernel": kernel, "form": form, "error": error})
        log.info("kernel %s: %s", kernel, exact[-1])
    return timings, exact


def kernel_timings(args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, Any]]:
    """One call of each KERNEL_SIZES family's few-block model per size, unmerged and merged at scope block and keys_values."""
    settings, rows = pack_module("nodes.settings"), []
    for name in (n for n in KERNEL_SIZES if n in args.families and not missing_class(n)):
        chosen = sizes(name, True) if args.tiny else [real_size(name, r, f) for r, f in KERNEL_SIZES[name]]
        for scope in ("block", "keys_values"):
            records = measure.probe(name, [s.grid for s in chosen], settings.NODE_RATIO, settings.NODE_TILE_SIZE, 1 if args.tiny else 2,
                                    args.device, log=log.info, dtype=dtype, overrides=TINY_OVERRIDES[name] if args.tiny else {}, scope=scope,
                                    tile_frames=settings.NODE_TILE_FRAMES if rs.family(name).video else None)
            for size in chosen:
                mine = [r for r in records if r["grid"] == [size.grid.frames, size.grid.height, size.grid.width]]
                unmerged, merged = (statistics.median(r[k]["call_ms"] for r in mine) for k in ("unmerged", "merged"))
                rows.append({"family": name, "size": size.label, "scope": scope, "unmerged_ms": unmerged, "merged_ms": merged,
                             "speedup": unmerged / merged})
    return rows


def kernel_table(timings: list[dict[str, Any]], exact: list[dict[str, Any]], device: str, dtype: str) -> str:
    lines = [f"## Attention kernels ({dtype}, {device})", "", "One call of the few-block model per kernel, unpatched and merged at the "
             "node's ratio and tile on every block; the merged attention's form on the kernel against the exact formula.", "",
             "| family | size | kernel | scope | unmerged ms | merged ms | speed-up |", "|---|---|---|---|---:|---:|---:|"]
    lines += [f"| {r['family']} | {r['size']} | {r['kernel']} | {r['scope']} | {r['unmerged_ms']:.2f} | {r['merged_ms']:.2f} | "
              f"{r['speedup']:.2f}x |" for r in timings]
    lines += ["", "| kernel | form | relative error against the formula |", "|---|---|---:|"]
    lines += [f"| {r['kernel']} | {r['form']} | {r['error']:.4f} |" for r in exact]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ run


class Report(list):
    """The output file's sections, the file rewritten whole after each so a run cut short keeps what it finished."""

    def __init__(self, path: Path, header: str) -> None:
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.add(header)

    def add(self, text: str) -> None:
        self.append(text)
        self.path.write_text("\n".join(self))


def each_family(names: Iterable[str], run: Callable[[str], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """run(name) for every family this ComfyUI has; the others as skip lines."""
    rows, skipped = [], []
    for name in names:
        why = missing_class(name)
        if why:
            skipped.append(why)
            log.info(why)
            continue
        start = time.perf_counter()
        rows += run(name)
        log.info("%s: %.1f s", name, time.perf_counter() - start)
    return rows, skipped


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/out/gpu_check.md"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--tiny", action="store_true", help="toy widths, small grids, short fixture runs (CPU smoke run)")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--fixtures", nargs="*", default=None, help="fixtures to sample (default: every one present)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default; --tiny: 1)")
    p.add_argument("--kernels-only", action="store_true", help="section 5 (attention kernels) alone")
    p.add_argument("--kernels-json", type=Path, default=None, help="also write section 5's rows here (what_you_get.GPU_KERNELS)")
    return p.parse_args(argv)


def header(args: argparse.Namespace) -> str:
    device = args.device + (f" ({torch.cuda.get_device_name(args.device)})" if args.device.startswith("cuda") else "")
    tiny = ", --tiny (toy widths: no figure here is a real-size one)" if args.tiny else ""
    return f"# ToMA GPU check\n\nComfyUI {comfy_version()}, torch {torch.__version__}, device {device}, {args.dtype}{tiny}\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    threads = args.threads or (1 if args.tiny else 0)
    if threads:
        torch.set_num_threads(threads)
    rs.import_comfy(args.device)
    dtype = DTYPES[args.dtype]
    start = time.perf_counter()
    report = Report(args.out, header(args))
    timings, exact = kernel_rows(args, dtype)
    report.add(kernel_table(timings, exact, args.device, args.dtype))
    if args.kernels_json:
        device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else args.device
        args.kernels_json.write_text(json.dumps({"device": device, "rows": timings, "exact": exact}, indent=1) + "\n")
    if args.kernels_only:
        return 0
    rows, skipped = each_family(args.families, lambda name: timing_rows(name, args.tiny, args.device, dtype))
    report.add(timing_table(rows, skipped, args.device, args.dtype))
    rows, skipped = each_family(args.families, auto_rows)
    report.add(auto_table(rows, skipped))
    present, missing = fixtures()
    chosen = present if args.fixtures is None else [f for f in args.fixtures if f in present]
    steps = TINY_STEPS if args.tiny else None
    rows, failed = [], []
    for fixture in chosen:
        try:
            rows.append(fixture_row(fixture, steps, args.device, dtype))
        except RuntimeError as error:  # a fixture this ComfyUI cannot load (state-dict keys): said, the check goes on
            failed.append(f"{fixture}: failed on ComfyUI {comfy_version()}: {str(error).splitlines()[0]}")
            log.error("fixture %s: %s", fixture, error)
            continue
        log.info("fixture %s: %s", fixture, rows[-1])
    report.add(fixture_table(rows, missing + failed, args.dtype))
    report.add(multigpu_section(args, dtype))
    report.add(f"Total {time.perf_counter() - start:.0f} s.\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
