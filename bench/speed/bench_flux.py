"""Model-level speed of ToMA on a Flux-shaped model built from ComfyUI's own classes.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.bench_flux            # CPU
    python -m bench.speed.bench_flux --device cuda --dtype bf16 --real-size                   # GPU, Flux.1 sizes

Default (CPU): comfy.model_base.Flux with hidden 768 (12 heads of 64), 2 double + 4 single blocks,
a 32x32 image-token grid (64x64 latent) and 256 text tokens: the tokens-to-width balance of Flux.1
at 1024^2. --real-size: hidden 3072, 24 heads, 19 + 38 blocks, 64x64 tokens, 512 text tokens.
Random weights. Every configuration is timed in the same process (median ms per model call after
warm-up): unpatched; ToMA at each ratio with every block merged (a plan is built in every call, as
with recompute_every=1); and the ideal, the unpatched model on a grid of D tokens. Speed-ups are
against the unpatched model timed in the same round-robin (bench/speed/model_speed.py, the skeleton
the speed benches share). Targets at ratio 0.5 on CPU: >= 1.6x, within 10% of the ideal. --profile
prints where a ToMA call spends its time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from .. import cli, sampling
from . import model_speed
from .model_speed import ideal_grid


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-size", action="store_true", help="Flux.1 sizes: hidden 3072, 19+38 blocks, 64x64 tokens, T=512")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--depth-single", type=int, default=4)
    p.add_argument("--grid", type=int, default=32, help="image tokens per side")
    p.add_argument("--text", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    model_speed.add_args(p, repeats=9)
    args = p.parse_args(argv)
    if args.real_size:
        args.hidden, args.depth, args.depth_single, args.grid, args.text = 3072, 19, 38, 64, 512
    return args


def build_model(args: argparse.Namespace) -> Any:
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


def make_call(patcher: Any, args: argparse.Namespace, grid_hw: tuple[int, int]) -> Callable[[], torch.Tensor]:
    """One model call on an h x w token grid (latent 2h x 2w), --text text tokens, guidance 3.5."""
    return model_speed.seeded_call(patcher, args, (args.batch, 16, 2 * grid_hw[0], 2 * grid_hw[1]), (args.text, 4096),
                                   pooled=768, guidance=torch.full((args.batch,), 3.5))


def kept_tokens(ratio: float, args: argparse.Namespace) -> int:
    return model_speed.kept_tokens(args.grid, args.grid, ratio, args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = model_speed.start(args)
    base = build_model(args)
    n, full = args.grid * args.grid, (args.grid, args.grid)
    print(cli.run_header(root, args) + f"hidden {args.hidden}, {args.depth}+{args.depth_single} blocks, "
          f"{args.grid}x{args.grid} image tokens + {args.text} text, batch {args.batch}, tile {args.tile_size}, "
          f"{args.clock} clock, median of {args.repeats} calls")
    print(f"{'config':<14}{'tokens':>8}{'ms/call':>10}{'speed-up':>10}{'ideal ms':>10}{'ideal x':>9}{'vs ideal':>10}")
    for ratio in args.ratios:
        d = kept_tokens(ratio, args)
        toma = model_speed.toma_every_block(base, ratio, args)
        entries = {"plain": (base, make_call(base, args, full)), "toma": (toma, make_call(toma, args, full)),
                   "ideal": (base, make_call(base, args, ideal_grid(d, full)))}
        ms = model_speed.median_ms(entries, args)
        plain, toma_ms, ideal = ms["plain"], ms["toma"], ms["ideal"]
        print(f"{'unpatched':<14}{n:>8}{plain:>10.1f}{1.0:>10.2f}")
        print(f"{'ToMA ' + format(ratio, 'g'):<14}{d:>8}{toma_ms:>10.1f}{plain / toma_ms:>10.2f}{ideal:>10.1f}"
              f"{plain / ideal:>9.2f}{(toma_ms / ideal - 1) * 100:>9.1f}%")
        if args.profile and ratio == args.ratios[0]:
            model_speed.profile(entries["toma"], args)


if __name__ == "__main__":
    main()
