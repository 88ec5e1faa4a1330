"""Section 4 of the GPU check (gpu_check.py): ToMA under ComfyUI 0.33's MultiGPU CFG Split on two GPUs.

Per family (Flux: ToMA on dit replace keys; SDXL: on object patches of its blocks' forwards), the
few-block model at the real width (realsize_measure.build_reduced, random weights, built on the CPU
by a factory ComfyUI can call again, as its core loaders register one in `cached_patcher_init`)
is sampled as KSampler does (euler, simple, cfg CFG, so each step makes a cond and an uncond call):
on one GPU unpatched, on one GPU with ToMA, and with ToMA and then MultiGPU CFG Split
(comfy/multigpu.py `create_multigpu_deepclones`, what the node runs: a second copy of the model on
the second GPU, the cond and uncond calls of each step on different GPUs, each in its own thread).
ToMA runs at the node defaults' ratio and tile, every block, min_tokens 0. Each run is made twice
and the second is timed (model loading and first-call work left out), all GPUs synchronised.

Reported: the three times; the calls each GPU's model copy ran (forward pre-hooks on each copy's
diffusion model); the block runs merged of the one-GPU and the two-GPU run lines (the two-GPU
line must count both GPUs: twice the one-GPU figure, calls of batch 1 instead of 2); how far the
two-GPU latent is from the one-GPU ToMA latent, as a share of ToMA's own change against the
unpatched latent; and the two-GPU run line. A run that fails (e.g. a GPU running another GPU's
weights) is reported with its error, and the check goes on.

It runs only where ComfyUI has MultiGPU CFG Split and the machine two GPUs; otherwise the section
says why it was skipped. tests/integration/test_gpu_check.py runs `family_row` at toy widths on the
CPU with two CPU devices standing in for the GPUs.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from harness import tiny_models
from harness.pack import pack_module

from . import realsize_measure as measure
from . import realsize_setup as rs

log = logging.getLogger("bench.gpu_check")

FAMILIES = ("flux", "sdxl")
RESOLUTION = "1024"
STEPS = 6
TINY_STEPS = 2
CFG = 3.5


def skip_reason(device: str, comfy_version: str) -> str | None:
    """Why this machine and ComfyUI cannot run the section, or None."""
    if importlib.util.find_spec("comfy.multigpu") is None:
        return f"MultiGPU CFG Split skipped: ComfyUI {comfy_version} has no comfy/multigpu.py (added in ComfyUI 0.33)"
    count = torch.cuda.device_count() if device.startswith("cuda") else 0
    if count < 2:
        return f"MultiGPU CFG Split skipped: it needs two GPUs; this machine has {count} (device {device})"
    return None


def reduced_model(name: str, dtype: torch.dtype, device: str, overrides: dict[str, Any]) -> Any:
    """The family's few-block model built on the CPU, in a ModelPatcher that loads it onto `device`:
    the factory MultiGPU CFG Split calls again for each extra GPU (ModelPatcher.deepclone_multigpu)."""
    import comfy.model_patcher

    model = measure.build_reduced(name, "cpu", dtype, overrides).model
    return comfy.model_patcher.ModelPatcher(model, load_device=torch.device(device), offload_device=torch.device("cpu"))


def synchronize() -> None:
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        torch.cuda.synchronize(index)


def timed(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    """run()'s result and the seconds of its second call (the first loads models and warms up)."""
    run()
    synchronize()
    start = time.perf_counter()
    out = run()
    synchronize()
    return out, time.perf_counter() - start


@contextmanager
def run_lines() -> Iterator[list[Any]]:
    """The RunRecords of ToMA's run lines logged inside the block (nodes/run/report.py TOMA_RUN)."""
    attr, records, handler = pack_module("nodes.run.report").TOMA_RUN, [], logging.Handler()
    handler.emit = lambda record: records.extend([getattr(record, attr)] if hasattr(record, attr) else [])
    logger = logging.getLogger(pack_module("nodes.run.wrappers").__name__)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def family_row(name: str, grid: rs.Grid, label: str, steps: int, device: str, dtype: torch.dtype,
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The section's row for one family (module docstring); ComfyUI must list a second device."""
    import comfy.model_management
    import comfy.multigpu
    import comfy.sample

    settings = pack_module("nodes.settings")
    base = reduced_model(name, dtype, device, overrides or {})
    base.cached_patcher_init = (reduced_model, (name, dtype, device, overrides or {}))
    toma = pack_module("nodes.node.patching").patch_model(
        base, settings.ToMASettings(ratio=settings.NODE_RATIO, tile_size=settings.NODE_TILE_SIZE, blocks="all", min_tokens=0))
    split = comfy.multigpu.create_multigpu_deepclones(toma, 2, reuse_loaded=True)
    copies = {str(m.load_device): m.model.diffusion_model for m in [base, *split.get_additional_models_with_key("multigpu")]}
    empty = torch.zeros_like(measure.latent(name, grid, 1, "cpu"))
    positive = tiny_models.make_conditioning(base, 1, text_len=rs.family(name).text_len)
    negative = tiny_models.make_conditioning(base, 2, text_len=rs.family(name).text_len)
    noise = comfy.sample.prepare_noise(empty, 0)

    def sample(model: Any) -> Callable[[], torch.Tensor]:
        return lambda: comfy.sample.sample(model, noise, steps, CFG, "euler", "simple", positive, negative, empty,
                                           seed=0, disable_pbar=True).float().cpu()

    calls: Counter = Counter()
    hooks = [dm.register_forward_pre_hook(lambda *_, d=d: calls.update([d])) for d, dm in copies.items()]
    try:
        plain, plain_s = timed(sample(base))
        with run_lines() as lines:
            one, one_s = timed(sample(toma))
            calls.clear()
            two, two_s = timed(sample(split))
    finally:
        for hook in hooks:
            hook.remove()
        comfy.model_management.unload_all_models()
    one_run, two_run = lines[1], lines[3]
    effect = (one - plain).abs().mean().item()
    return {"family": name, "size": label, "steps": steps, "plain_s": plain_s, "one_s": one_s, "two_s": two_s,
            "calls": {d: calls[d] // 2 for d in copies}, "blocks": (one_run.block_runs_merged, two_run.block_runs_merged),
            "drift": (two - one).abs().mean().item() / effect if effect > 0 else float("nan"), "line": two_run.line()}


def table(rows: list[dict[str, Any]], notes: list[str]) -> str:
    lines = ["## MultiGPU CFG Split", "",
             f"The few-block model at the real width sampled as KSampler does (euler, cfg {CFG:g}): one GPU unpatched, "
             "one GPU with ToMA (node defaults' ratio and tile, every block, min_tokens 0), ToMA then MultiGPU CFG Split "
             "on two GPUs; second of two runs timed (bench/speed/multigpu_check.py). \"calls per GPU\": model calls each "
             "GPU's copy ran; \"block runs merged\": the one-GPU and two-GPU run lines (two GPUs: both counted, twice "
             "the one-GPU figure); \"latent change\": two GPUs against one GPU, as a share of ToMA's change against "
             "unpatched.", "",
             "| family | size | steps | 1 GPU unpatched s | 1 GPU ToMA s | 2 GPUs ToMA s | 2 GPUs vs 1 (ToMA) | "
             "calls per GPU | block runs merged | latent change |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        calls = ", ".join(f"{d}: {n}" for d, n in r["calls"].items())
        lines.append(f"| {r['family']} | {r['size']} | {r['steps']} | {r['plain_s']:.3f} | {r['one_s']:.3f} | {r['two_s']:.3f} | "
                     f"{r['one_s'] / r['two_s']:.2f}x | {calls} | {r['blocks'][0]} / {r['blocks'][1]} | {r['drift']:.2%} |")
    lines += [f"\n{r['family']}, two GPUs: `{r['line']}`" for r in rows]
    return "\n".join(lines + [f"\n{s}" for s in notes]) + "\n"
