"""Model-level speed of ToMA on a Flux-shaped model built from ComfyUI's own classes.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.bench_flux            # CPU
    python -m bench.speed.bench_flux --device cuda --dtype bf16 --real-size                   # GPU, Flux.1 sizes

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
from collections.abc import Callable

import torch

from ..harness import cli, sampling, timing
from ..harness.cli import DTYPES, import_comfy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_device_args(p)
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
    cli.add_kernel_args(p)
    args = p.parse_args(argv)
    if args.real_size:
        args.hidden, args.depth, args.depth_single, args.grid, args.text = 3072, 19, 38, 64, 512
    return args


def build_model(args: argparse.Namespace):
    """A Flux-shaped comfy.model_base.Flux with random weights, in a ModelPatcher on the device."""
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
    return sampling.build_patcher(comfy.supported_models.Flux, config, args)


def make_call(patcher, args: argparse.Namespace, grid_hw: tuple[int, int]) -> Callable[[], torch.Tensor]:
    """One model call as a sampler makes it (BaseModel.apply_model with the patcher's wrappers)."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((args.batch, 16, 2 * grid_hw[0], 2 * grid_hw[1]), generator=gen).to(device)
    context = torch.randn((args.batch, args.text, 4096), generator=gen).to(device, dtype)
    y = torch.randn((args.batch, 768), generator=gen).to(device, dtype)
    sigmas = torch.tensor([1.0, 0.5, 0.0], device=device)
    guidance = torch.full((args.batch,), 3.5, device=device)
    return sampling.model_call(patcher, x, sigmas, [0], ["bench"], c_crossattn=context, y=y, guidance=guidance)


def ideal_grid(tokens: int, like: tuple[int, int]) -> tuple[int, int]:
    """An h x w grid with exactly `tokens` tokens, as square as possible (h <= like[0])."""
    best = (1, tokens)
    for h in range(1, min(tokens, like[0]) + 1):
        if tokens % h == 0 and abs(h - tokens // h) < abs(best[0] - best[1]):
            best = (h, tokens // h)
    return best


def patch(patcher, ratio: float, args: argparse.Namespace, **options):
    """ToMA on every block at `ratio`; options are further ToMASettings (e.g. proportional_attention)."""
    from ..harness.pack import pack_module

    settings = pack_module("nodes.settings")
    patching = pack_module("nodes.patching")
    return patching.patch_model(patcher, settings.ToMASettings(ratio=ratio, tile_size=args.tile_size, blocks="all", **options))


def kept_tokens(ratio: float, args: argparse.Namespace) -> int:
    from ..harness.pack import pack_module

    grid = pack_module("toma_core").TileGrid(args.grid, args.grid, args.tile_size, ratio)
    return grid.num_kept


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = import_comfy(args)
    base = build_model(args)
    n = args.grid * args.grid
    print(cli.run_header(root, args) + f"hidden {args.hidden}, {args.depth}+{args.depth_single} blocks, "
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
        ms = timing.median_ms(calls, args.device, warmup=args.warmup, repeats=args.repeats)
        plain, toma, ideal = ms["plain"], ms["toma"], ms["ideal"]
        print(f"{'unpatched':<14}{n:>8}{plain:>10.1f}{1.0:>10.2f}")
        print(f"{'ToMA ' + format(ratio, 'g'):<14}{d:>8}{toma:>10.1f}{plain / toma:>10.2f}{ideal:>10.1f}"
              f"{plain / ideal:>9.2f}{(toma / ideal - 1) * 100:>9.1f}%")
        if args.profile and ratio == args.ratios[0]:
            timing.profile_call(calls["toma"], args.device, row_limit=18)


if __name__ == "__main__":
    main()
