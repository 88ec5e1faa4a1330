"""Model-level speed of ToMA on a Wan-shaped video model built from ComfyUI's own classes.

    COMFYUI_PATH=/path/to/ComfyUI OMP_NUM_THREADS=1 python -m bench.speed.bench_wan   # CPU
    python -m bench.speed.bench_wan --device cuda --dtype bf16 --real-size                           # GPU, Wan 14B

Default (CPU): comfy.model_base.WAN21 (WanModel) with dim 512 (4 heads of 128, ffn 1384), 4 blocks,
a 21 x 12 x 13 token grid (3,276 tokens) and 512 text tokens: Wan 2.1/2.2 14B at 832x480x81
(dim 5120, 21 x 30 x 52 = 32,760 tokens) scaled by 1/10 in both width and tokens, so the share of
attention in a block (tokens / width) is the 14B model's. --real-size: dim 5120, 40 heads,
ffn 13824, 40 blocks, 21 x 30 x 52 tokens. Random weights.

Every configuration is timed in the same process, round-robin (median ms per model call after
warm-up; bench/speed/model_speed.py, the skeleton the speed benches share): unpatched; ToMA at each ratio with every block merged and a plan built in every call
(recompute_every=1); and the ideal, the unpatched model on a video of D tokens (same frames, fewer
tokens per frame), what a merge with zero overhead would give. Target at ratio 0.5 on CPU:
>= 2.0x and >= 90 % of the ideal's speed-up. --tile-frames compares frames per tile.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import torch

from harness.pack import pack_module

from .. import cli, sampling
from . import model_speed
from .model_speed import ideal_grid

WAN_14B = {"dim": 5120, "heads": 40, "ffn": 13824, "depth": 40, "frames": 21, "height": 30, "width": 52}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-size", action="store_true", help="Wan 14B at 832x480x81: dim 5120, 40 blocks, 21x30x52 tokens")
    for flag, default in {"dim": 512, "heads": 4, "ffn": 1384, "depth": 4, "text": 512, "batch": 1}.items():
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--frames", type=int, default=21, help="latent frames (81 video frames -> 21)")
    p.add_argument("--height", type=int, default=12, help="tokens per frame column")
    p.add_argument("--width", type=int, default=13, help="tokens per frame row")
    p.add_argument("--tile-frames", type=int, nargs="+", default=None,
                   help="frames per tile, one ToMA row each (default: the node's default)")
    model_speed.add_args(p, repeats=7, warmup=1, clock="auto")
    args = p.parse_args(argv)
    if args.real_size:
        vars(args).update(WAN_14B)
    return args


def build_model(args: argparse.Namespace) -> Any:
    """A Wan-shaped comfy.model_base.WAN21 (T2V) with random weights, in a ModelPatcher on the device."""
    import comfy.supported_models

    config = {
        "image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "text_len": 512,
        "in_dim": 16, "dim": args.dim, "ffn_dim": args.ffn, "freq_dim": 256, "text_dim": 4096, "out_dim": 16,
        "num_heads": args.heads, "num_layers": args.depth, "window_size": (-1, -1), "qk_norm": True,
        "cross_attn_norm": True, "eps": 1e-6,
    }
    return sampling.build_patcher(comfy.supported_models.WAN21_T2V, config, args)


def make_call(patcher: Any, args: argparse.Namespace, grid: tuple[int, int, int]) -> Callable[[], torch.Tensor]:
    """One model call as a sampler makes it, on a latent of grid (frames, h, w) tokens."""
    frames, h, w = grid
    return model_speed.seeded_call(patcher, args, (args.batch, 16, frames, 2 * h, 2 * w), (args.text, 4096))


def kept_tokens(ratio: float, tile_frames: int, args: argparse.Namespace) -> int:
    """D of a text-to-video call: frame 0 alone in spatial tiles, frames 1.. in tiles of
    `tile_frames` frames (nodes/families/wan.py)."""
    first = model_speed.kept_tokens(args.height, args.width, ratio, args)
    if args.frames == 1:
        return first
    return first + model_speed.kept_tokens(args.height, args.width, ratio, args, frames=args.frames - 1, tile_frames=tile_frames)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = model_speed.start(args)
    if args.tile_frames is None:
        args.tile_frames = [pack_module("nodes.settings").NODE_TILE_FRAMES]
    base = build_model(args)
    full = (args.frames, args.height, args.width)
    n = args.frames * args.height * args.width
    print(cli.run_header(root, args) + f"Wan dim {args.dim} ({args.heads} heads), ffn {args.ffn}, "
          f"{args.depth} blocks, {args.frames}x{args.height}x{args.width} = {n} video tokens + {args.text} text, "
          f"batch {args.batch}, tile {args.tile_size}, median {args.clock} time of {args.repeats} interleaved calls")
    print("| config | tokens | ms/call | speed-up | ideal ms | ideal x | % of ideal |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for ratio in args.ratios:
        d = {t: kept_tokens(ratio, t, args) for t in args.tile_frames}
        ideal = ideal_grid(math.ceil(d[args.tile_frames[0]] / args.frames), (args.height, args.width))
        entries = {"plain": (base, make_call(base, args, full))}
        for t in args.tile_frames:
            toma = model_speed.toma_every_block(base, ratio, args, tile_frames=t)
            entries[f"toma{t}"] = (toma, make_call(toma, args, full))
        entries["ideal"] = (base, make_call(base, args, (args.frames, *ideal)))
        ms = model_speed.median_ms(entries, args)
        plain, best = ms["plain"], ms["ideal"]
        print(f"| unpatched | {n} | {plain:.1f} | 1.00 | | | |")
        print(f"| ideal {ratio:g} | {args.frames * ideal[0] * ideal[1]} | {best:.1f} | {plain / best:.2f} | | | |")
        for t in args.tile_frames:
            toma_ms = ms[f"toma{t}"]
            label = f"ToMA {ratio:g}" + (f", {t} frames/tile" if len(args.tile_frames) > 1 else "")
            print(f"| {label} | {d[t]} | {toma_ms:.1f} | {plain / toma_ms:.2f} | {best:.1f} | {plain / best:.2f} | "
                  f"{100 * (plain / toma_ms) / (plain / best):.0f}% |")
        if args.profile and ratio == args.ratios[0]:
            model_speed.profile(entries[f"toma{args.tile_frames[0]}"], args)


if __name__ == "__main__":
    main()
