"""Speed of scope "keys_values" on an attention-bound Wan-shaped model, against its ideal.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.bench_keys_values --threads 1    # CPU, about 10 minutes

Model: comfy.model_base.WAN21 (WanModel, ComfyUI's own classes, random weights) with dim 256 (2 heads
of 128, Wan's real head width), ffn 692 (Wan 14B's 13824 / 5120 = 2.7 times the width), 40 blocks (Wan
14B's: the call's one plan is shared by as many blocks as at real size), a
21 x 16 x 16 grid (81 frames' 21 latent frames; 5,376 tokens) and 512 text tokens. Why this shape:
a block's self-attention costs 4 N^2 C against its linear layers' ~23 N C^2 (and the cross-attention's
4 N T C), so attention's share, 4 N / (4 N + 23 C + 4 T), is set by N / C: Wan 2.2 14B at 1280 x 720
x 81 has N / C = 75,600 / 5,120 = 14.8 (self-attention 72 % of a block), at 832 x 480 6.4 (52 %);
here N / C = 21 (73 %), as attention-bound as the 720p block at a width one CPU thread can run, with
the real head width (the padded log-mass channel costs e' / e = 136 / 128 of the attention, as at
real size).

Configurations, timed in turns in one process (bench/timing.py round-robin, model_speed.time_in_turns;
median ms per model call after warm-up, a plan built in every call):

- unpatched;
- ToMA keys_values r: ToMA Patch (Advanced)'s scope "keys_values" on every block at ratio r: every
  query kept, self-attention over the D merged image keys and values (plus their log-mass channel);
- ideal r: the unpatched model whose self-attention takes the first D image keys and values as they
  are (an optimized_attention_override that slices them): attention on the reduced keys, every other
  layer unchanged, no plan, no merge, no padding. What keys/values merging with zero overhead gives.

"% of ideal" is the ToMA speed-up over the ideal's. --profile breaks one ToMA call into operators.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from harness.pack import pack_module

from .. import cli
from . import bench_wan, model_speed

OVERRIDE = "optimized_attention_override"


class SlicedKeys:
    """The ideal's optimized_attention_override: a self-attention call (as many keys as queries) keeps
    only its first `kept` keys and values, unchanged; other calls (Wan's cross-attention to the text)
    run as they are."""

    def __init__(self, kept: int) -> None:
        self.kept = kept

    def __call__(self, func, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        axis = 2 if kwargs.get("skip_reshape") else 1
        if k.shape[axis] == q.shape[axis]:
            k, v = k.narrow(axis, 0, self.kept), v.narrow(axis, 0, self.kept)
        return func(q, k, v, heads, *args, **kwargs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_wan.add_model_args(p, dim=256, heads=2, ffn=692, depth=40, height=16, width=16)
    p.add_argument("--tile-frames", type=int, default=None, help="frames per tile (default: the node's)")
    p.add_argument("--no-mass", action="store_true", help="key_mass off: no log-mass channel (what the channel costs)")
    model_speed.add_args(p, ratios=(0.5, 0.75), repeats=5, warmup=1, clock="auto")
    p.set_defaults(tile_size=None)
    return p.parse_args(argv)


def sliced(base: Any, kept: int) -> Any:
    """The ideal: `base` with a SlicedKeys override in its transformer_options."""
    patcher = base.clone()
    options = patcher.model_options.setdefault("transformer_options", {})
    options[OVERRIDE] = SlicedKeys(kept)
    return patcher


def spread(values: list[float]) -> float:
    """(max - min) / median of one configuration's timed calls."""
    return (max(values) - min(values)) / statistics.median(values)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = model_speed.start(args)
    node = pack_module("nodes.settings")
    args.tile_size = args.tile_size or node.NODE_TILE_SIZE
    tile_frames = args.tile_frames or node.NODE_TILE_FRAMES
    base = bench_wan.build_model(args)
    full = (args.frames, args.height, args.width)
    n = args.frames * args.height * args.width
    print(cli.run_header(root, args) + f"Wan dim {args.dim} ({args.heads} heads of {args.dim // args.heads}), ffn {args.ffn}, "
          f"{args.depth} blocks, {args.frames}x{args.height}x{args.width} = {n} video tokens + {args.text} text, "
          f"batch {args.batch}, tile {args.tile_size} x {tile_frames} frames, key_mass {'off' if args.no_mass else 'on'}, "
          f"{args.clock} clock, {args.repeats} interleaved rounds after {args.warmup}")
    entries = {"plain": (base, bench_wan.make_call(base, args, full))}
    kept = {}
    for ratio in args.ratios:
        kept[ratio] = bench_wan.kept_tokens(ratio, tile_frames, args)
        toma = model_speed.toma_every_block(base, ratio, args, tile_frames=tile_frames, scope="keys_values",
                                            key_mass=not args.no_mass)
        entries[f"toma {ratio:g}"] = (toma, bench_wan.make_call(toma, args, full))
        ideal = sliced(base, kept[ratio])
        entries[f"ideal {ratio:g}"] = (ideal, bench_wan.make_call(ideal, args, full))
    times = model_speed.time_in_turns(entries, args, warmup=args.warmup, repeats=args.repeats)
    ms = {name: statistics.median(values) for name, values in times.items()}
    plain = ms["plain"]
    print("| config | keys | ms/call | speed-up | ideal ms | ideal x | % of ideal | spread |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| unpatched | {n} | {plain:.1f} | 1.00 | | | | {100 * spread(times['plain']):.1f} % |")
    for ratio in args.ratios:
        toma, best = ms[f"toma {ratio:g}"], ms[f"ideal {ratio:g}"]
        print(f"| ideal {ratio:g} | {kept[ratio]} | {best:.1f} | {plain / best:.2f} | | | | "
              f"{100 * spread(times[f'ideal {ratio:g}']):.1f} % |")
        print(f"| ToMA keys_values {ratio:g} | {kept[ratio]} | {toma:.1f} | {plain / toma:.2f} | {best:.1f} | {plain / best:.2f} | "
              f"{100 * best / toma:.0f}% | {100 * spread(times[f'toma {ratio:g}']):.1f} % |")
    if args.profile:
        model_speed.profile(entries[f"toma {args.ratios[0]:g}"], args, row_limit=25)


if __name__ == "__main__":
    main()
