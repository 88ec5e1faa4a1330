"""Model-level speed of ToMA on a Flux-shaped model built from ComfyUI's own classes.

    COMFYUI_PATH=~/comfy/ComfyUI ~/comfy/venv/bin/python bench/bench_flux.py            # CPU
    python bench/bench_flux.py --device cuda --dtype bf16 --real-size                   # GPU, Flux.1 sizes

Default (CPU): comfy.model_base.Flux with hidden 768 (12 heads of 64), 2 double + 4 single blocks,
a 32x32 image-token grid (64x64 latent) and 256 text tokens: the tokens-to-width balance of Flux.1
at 1024^2. --real-size: hidden 3072, 24 heads, 19 + 38 blocks, 64x64 tokens, 512 text tokens.
Random weights. Every configuration is timed in the same process (median ms per model call after
warm-up): unpatched; ToMA at each ratio with every block merged (a plan is built in every call, as
with recompute_every=1); and the ideal, the unpatched model on a grid of D tokens. Speed-ups are
against the unpatched model timed in the same round-robin. Targets at ratio 0.5 on CPU: >= 1.6x, within 10% of
the ideal. --profile prints where a ToMA call spends its time.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--real-size", action="store_true", help="Flux.1 sizes: hidden 3072, 19+38 blocks, 64x64 tokens, T=512")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--depth-single", type=int, default=4)
    p.add_argument("--grid", type=int, default=32, help="image tokens per side")
    p.add_argument("--text", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    p.add_argument("--tile-size", type=int, default=4)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"],
                   help="pytorch: SDPA (what ComfyUI uses on GPUs); comfy-default: ComfyUI's CPU choice")
    p.add_argument("--profile", action="store_true", help="break a ToMA call at the first ratio into parts")
    args = p.parse_args(argv)
    if args.real_size:
        args.hidden, args.depth, args.depth_single, args.grid, args.text = 3072, 19, 38, 64, 512
    return args


def import_comfy(args: argparse.Namespace):
    """Import ComfyUI (cpu mode unless --device cuda) with the chosen attention kernel."""
    import os

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


def build_model(args: argparse.Namespace):
    """A Flux-shaped comfy.model_base.Flux with random weights, in a ModelPatcher on the device."""
    import comfy.model_patcher
    import comfy.supported_models

    heads = args.hidden // 64
    head_dim = args.hidden // heads
    axes = [head_dim // 8, head_dim * 7 // 16, head_dim * 7 // 16]
    axes[0] += head_dim - sum(axes)
    config = {
        "image_model": "flux", "in_channels": 16, "out_channels": 16, "vec_in_dim": 768,
        "context_in_dim": 4096, "hidden_size": args.hidden, "mlp_ratio": 4.0, "num_heads": heads,
        "depth": args.depth, "depth_single_blocks": args.depth_single, "axes_dim": axes, "theta": 10000,
        "patch_size": 2, "qkv_bias": True, "guidance_embed": True,
    }
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    model_config = comfy.supported_models.Flux(config)
    model_config.unet_config.update(config)
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({}, device=device)
    with torch.no_grad():
        for name, param in model.diffusion_model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif param.ndim <= 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 1.0 / math.sqrt(param[0].numel()))
    model.to(device).eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def make_call(patcher, args: argparse.Namespace, grid_hw: tuple[int, int]) -> Callable[[], torch.Tensor]:
    """One model call as a sampler makes it (BaseModel.apply_model with the patcher's wrappers)."""
    import comfy.model_patcher
    import comfy.patcher_extension

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((args.batch, 16, 2 * grid_hw[0], 2 * grid_hw[1]), generator=gen).to(device)
    context = torch.randn((args.batch, args.text, 4096), generator=gen).to(device, dtype)
    y = torch.randn((args.batch, 768), generator=gen).to(device, dtype)
    sigmas = torch.tensor([1.0, 0.5, 0.0], device=device)
    options = comfy.model_patcher.create_model_options_clone(patcher.model_options)
    to = options.setdefault("transformer_options", {})
    to["wrappers"] = comfy.patcher_extension.copy_nested_dicts(patcher.wrappers)
    to.update(sample_sigmas=sigmas, sigmas=sigmas[:1], cond_or_uncond=[0] * 1, uuids=["bench"])
    state = _start_run(patcher, to)
    t = sigmas[:1].expand(args.batch)
    guidance = torch.full((args.batch,), 3.5, device=device)

    def call() -> torch.Tensor:
        if state is not None:
            state.plans.clear()  # recompute_every=1: every step builds its plan
        with torch.no_grad():
            return patcher.model.apply_model(x, t, c_crossattn=context, y=y, guidance=guidance, transformer_options=dict(to))

    return call


def _start_run(patcher, transformer_options: dict):
    """What the OUTER_SAMPLE wrapper does for a run: a fresh RunState with its sigma window."""
    from pack import pack_module

    key = pack_module("nodes.settings").TOMA_KEY
    template = transformer_options.get(key)
    if template is None:
        return None
    state = template.fresh()
    state.begin_run(patcher.get_model_object("model_sampling").percent_to_sigma, transformer_options["sample_sigmas"])
    transformer_options[key] = state
    return state


def median_ms(calls: dict[str, Callable[[], object]], args: argparse.Namespace) -> dict[str, float]:
    """Median ms per call of each entry, timed round-robin so that load changes on a shared
    machine hit every configuration alike."""
    for fn in calls.values():
        for _ in range(args.warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            _sync(args)
            start = time.perf_counter()
            fn()
            _sync(args)
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def _sync(args: argparse.Namespace) -> None:
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def ideal_grid(tokens: int, like: tuple[int, int]) -> tuple[int, int]:
    """An h x w grid with exactly `tokens` tokens, as square as possible (h <= like[0])."""
    best = (1, tokens)
    for h in range(1, min(tokens, like[0]) + 1):
        if tokens % h == 0 and abs(h - tokens // h) < abs(best[0] - best[1]):
            best = (h, tokens // h)
    return best


def patch(patcher, ratio: float, args: argparse.Namespace):
    from pack import pack_module

    settings = pack_module("nodes.settings")
    patching = pack_module("nodes.patching")
    return patching.patch_model(patcher, settings.ToMASettings(ratio=ratio, tile_size=args.tile_size, blocks="all"))


def kept_tokens(ratio: float, args: argparse.Namespace) -> int:
    from pack import pack_module

    grid = pack_module("toma_core").TileGrid(args.grid, args.grid, args.tile_size, ratio)
    return grid.num_kept


def profile_call(call: Callable[[], torch.Tensor], args: argparse.Namespace) -> None:
    """Top operators of one ToMA call (torch.profiler), to see where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    call()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        call()
        _sync(args)
    sort = "cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=18))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = import_comfy(args)
    import comfy_env

    base = build_model(args)
    n = args.grid * args.grid
    print(f"ComfyUI {comfy_env.comfy_version(root)}; device {args.device} {args.dtype}, threads {torch.get_num_threads()}, "
          f"attention {args.attention}; hidden {args.hidden}, {args.depth}+{args.depth_single} blocks, "
          f"{args.grid}x{args.grid} image tokens + {args.text} text, batch {args.batch}, tile {args.tile_size}, "
          f"median of {args.repeats} calls")
    print(f"{'config':<14}{'tokens':>8}{'ms/call':>10}{'speed-up':>10}{'ideal ms':>10}{'ideal x':>9}{'vs ideal':>10}")
    for ratio in args.ratios:
        d = kept_tokens(ratio, args)
        calls = {
            "plain": make_call(base, args, (args.grid, args.grid)),
            "toma": make_call(patch(base, ratio, args), args, (args.grid, args.grid)),
            "ideal": make_call(base, args, ideal_grid(d, (args.grid, args.grid))),
        }
        ms = median_ms(calls, args)
        plain, toma, ideal = ms["plain"], ms["toma"], ms["ideal"]
        print(f"{'unpatched':<14}{n:>8}{plain:>10.1f}{1.0:>10.2f}")
        print(f"{'ToMA ' + format(ratio, 'g'):<14}{d:>8}{toma:>10.1f}{plain / toma:>10.2f}{ideal:>10.1f}"
              f"{plain / ideal:>9.2f}{(toma / ideal - 1) * 100:>9.1f}%")
        if args.profile and ratio == args.ratios[0]:
            profile_call(calls["toma"], args)

if __name__ == "__main__":
    main()
