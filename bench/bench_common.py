"""What bench/bench_flux.py and bench/bench_sdxl.py share: ComfyUI import, random-weight model
setup, a sampler-like model call, timing and profiling.

Importing this module puts tests/ and tests/integration/ on sys.path (for ``pack``, ``comfy_env``
and ``tiny_models``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
"""The benches' --clock choices. cpu: this process's CPU time, which waiting for a core shared with
other jobs does not inflate (with one torch thread it is about the wall time the call would take
alone); wall: elapsed time (the only meaningful clock on a GPU)."""


def add_device_args(p: argparse.ArgumentParser) -> None:
    """--device and --dtype."""
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))


def add_kernel_args(p: argparse.ArgumentParser) -> None:
    """--attention and --profile."""
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"],
                   help="pytorch: SDPA (what ComfyUI uses on GPUs); comfy-default: ComfyUI's CPU choice")
    p.add_argument("--profile", action="store_true", help="break a ToMA call at the first ratio into parts")


def import_comfy(args: argparse.Namespace) -> Path:
    """Import ComfyUI (cpu mode unless --device is not cpu) with the chosen attention kernel."""
    import comfy_env

    root = comfy_env.find_comfy_root()
    if root is None:
        sys.exit("ComfyUI not found: set COMFYUI_PATH")
    sys.path.insert(0, str(root))
    import comfy.cli_args

    if args.attention == "pytorch":
        comfy.cli_args.args.use_pytorch_cross_attention = True
    if args.device != "cpu":
        os.environ["COMFYUI_USE_GPU"] = "1"
    result = comfy_env.import_comfy()
    if isinstance(result, str):
        sys.exit(result)
    return result


def run_header(root: Path, args: argparse.Namespace) -> str:
    """The start of a bench's first output line: ComfyUI version, device, dtype, threads, attention."""
    import comfy_env

    return (f"ComfyUI {comfy_env.comfy_version(root)}; device {args.device} {args.dtype}, "
            f"threads {torch.get_num_threads()}, attention {args.attention}; ")


def build_patcher(config_cls: type, unet_config: dict, args: argparse.Namespace) -> Any:
    """A ``comfy.supported_models`` model of --dtype with random weights (``tiny_models.init_weights``
    from torch's global RNG), in a ModelPatcher on --device."""
    import comfy.model_patcher
    from tiny_models import init_weights

    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    model_config = config_cls(unet_config)
    model_config.unet_config.update(unet_config)
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({}, device=device)
    init_weights(model.diffusion_model)
    model.to(device).eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def model_call(patcher: Any, x: torch.Tensor, sigmas: torch.Tensor, cond_or_uncond: list[int], uuids: list[str],
               **kwargs: Any) -> Callable[[], torch.Tensor]:
    """One model call at the first of `sigmas` as a sampler makes it: BaseModel.apply_model on `x`
    with the patcher's wrappers, `cond_or_uncond` and `uuids` in transformer_options and `kwargs`
    (conditioning), ToMA's run started as its OUTER_SAMPLE wrapper would. recompute_every=1: every
    call builds its plans."""
    import comfy.model_patcher
    import comfy.patcher_extension

    b = x.shape[0]
    options = comfy.model_patcher.create_model_options_clone(patcher.model_options)
    to = options.setdefault("transformer_options", {})
    to["wrappers"] = comfy.patcher_extension.copy_nested_dicts(patcher.wrappers)
    to.update(sample_sigmas=sigmas, sigmas=sigmas[:1], cond_or_uncond=cond_or_uncond, uuids=uuids)
    state = start_run(patcher, to)
    t = sigmas[:1].expand(b)

    def call() -> torch.Tensor:
        if state is not None:
            state.plans.clear()  # recompute_every=1: every step builds its plans
        with torch.no_grad():
            return patcher.model.apply_model(x, t, transformer_options=dict(to), **kwargs)

    return call


def start_run(patcher: Any, transformer_options: dict) -> Any:
    """What ToMA's OUTER_SAMPLE wrapper does for a run: a fresh RunState with its sigma window
    (None when the patcher has no ToMA)."""
    from pack import pack_module

    key = pack_module("nodes.settings").TOMA_KEY
    template = transformer_options.get(key)
    if template is None:
        return None
    state = template.fresh()
    state.begin_run(patcher.get_model_object("model_sampling").percent_to_sigma, transformer_options["sample_sigmas"])
    transformer_options[key] = state
    return state


def timed_ms(fn: Callable[[], object], args: argparse.Namespace,
             clock: Callable[[], float] = time.perf_counter) -> float:
    """Milliseconds of one fn() call on `clock`, the device synchronised before and after."""
    sync(args)
    start = clock()
    fn()
    sync(args)
    return (clock() - start) * 1000


def sync(args: argparse.Namespace) -> None:
    """Wait for the device's queued work (CUDA only)."""
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_call(call: Callable[[], torch.Tensor], args: argparse.Namespace, row_limit: int) -> None:
    """Top operators of one call after a warm-up call (torch.profiler), to see where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    call()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        call()
        sync(args)
    sort = "cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=row_limit))
