"""Times one merge plan (toma_core.make_plan, facility location, ToMA §3.2) at tile 4 / 8 / 16 and
1 / 2 / 4 tile frames, beside the plan term of toma_core/cost.py (plan_flops) in ms; the figures are
toma_core.cost_constants.PLAN_CALIBRATION, which GREEDY and PLAN_MOVES are fitted to.

The greedy (toma_core/facility.py) runs k = round(n (1 - ratio)) iterations, batched over the tiles;
each reads the (G, n, n) similarities, G n = N tokens: its work is k N n element passes, about
(1 - ratio) N n^2, and its launches k times a few ops (cost_constants.py GREEDY, GREEDY_OPS). The model's
flop-equivalents are turned into ms at LAUNCH["cpu"] per LAUNCH_SECONDS_CPU.

Times: process CPU clock, one thread (`OMP_NUM_THREADS=1`; waiting for a shared core does not
count), the fastest of `--repeats`; the spread (slowest / fastest) and the wall / CPU ratio say how
noisy the machine was.

    OMP_NUM_THREADS=1 python -m bench.speed.plan_cost [--frames 4 --height 20 --width 21 --channels 256]
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.pack import pack_module

TILES = (4, 8, 16)
TILE_FRAMES = (1, 2, 4)


def time_plan(x: torch.Tensor, frames: int, height: int, width: int, tile: int, tile_frames: int, ratio: float,
              repeats: int) -> tuple[float, float, float]:
    """(fastest CPU ms, slowest / fastest, wall / CPU) of make_plan on x (1, N, C)."""
    core = pack_module("toma_core")
    features = pack_module("nodes.machinery.runner").features
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        core.make_plan(features(x), height, width, ratio, tile, frames=frames, tile_frames=tile_frames)
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return min(cpu), max(cpu) / min(cpu), sum(wall) / sum(cpu)


def predicted_ms(tokens: int, channels: int, tile_tokens: int, ratio: float) -> float:
    """cost.py's plan term on this CPU, in ms (flop-equivalents at LAUNCH["cpu"] per 7 us)."""
    cost, constants = pack_module("toma_core.cost"), pack_module("toma_core.cost_constants")
    flops = cost.plan_flops(tokens, channels, tile_tokens, 1.0 - ratio, "cpu")
    return flops / constants.LAUNCH["cpu"] * constants.LAUNCH_SECONDS_CPU * 1000


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--height", type=int, default=20)
    p.add_argument("--width", type=int, default=21)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--ratio", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tiling = pack_module("toma_core.tiling")
    n_tokens = args.frames * args.height * args.width
    x = torch.randn((1, n_tokens, args.channels), generator=torch.Generator().manual_seed(0))
    print(f"make_plan, N {n_tokens} ({args.frames}x{args.height}x{args.width}), C {args.channels}, ratio {args.ratio}")
    print("tile  frames  n     k    G    ms      model ms  spread  wall/cpu")
    for tile in TILES:
        for tile_frames in TILE_FRAMES:
            grid = tiling.TileGrid(args.height, args.width, tile, args.ratio, frames=args.frames, tile_frames=tile_frames)
            ms, spread, load = time_plan(x, args.frames, args.height, args.width, tile, tile_frames, args.ratio, args.repeats)
            model = predicted_ms(n_tokens, args.channels, grid.tile_tokens, args.ratio)
            print(f"{tile:<5d} {tile_frames:<7d} {grid.tile_tokens:<5d} {grid.k:<4d} {grid.num_tiles:<4d} "
                  f"{ms:<7.1f} {model:<9.1f} {spread:<7.2f} {load:.2f}")


if __name__ == "__main__":
    main()
