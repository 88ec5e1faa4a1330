"""The skeleton every per-family speed bench shares (bench_flux, bench_sdxl, bench_wan, bench_families):
one command line, one start, a sampler-style model call on seeded inputs, ToMA on every block, the
ideal (the unpatched model on D tokens, what a merge with zero overhead would give), and one timer:
the configurations take turns (bench/timing.py ``samples_ms``), each patcher loaded, untimed,
before its turn as sampling loads it (object patches applied, the other clones' taken off).

A bench adds its model's options and builds its model and its calls; the rest is here."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.pack import pack_module

from .. import cli, sampling, timing

Entry = tuple[Any, Callable[[], torch.Tensor]]
"""A configuration to time: its ModelPatcher and one model call through it."""


def add_args(p: argparse.ArgumentParser, *, ratios: Sequence[float] = (0.25, 0.5, 0.75), repeats: int | None = 7,
             warmup: int = 2, clock: str = "wall") -> None:
    """--device, --dtype, --ratios, --tile-size, --repeats and --warmup (unless repeats is None: the
    bench has its own), --threads, --clock, --attention and --profile."""
    cli.add_device_args(p)
    p.add_argument("--ratios", type=float, nargs="+", default=list(ratios))
    p.add_argument("--tile-size", type=int, default=4)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help="timed rounds")
        p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--clock", choices=["auto", *timing.CLOCKS], default=clock,
                   help="wall: elapsed time; cpu: this process's CPU time (with --threads 1, robust to other "
                   "processes on a shared machine); auto: cpu on the CPU with one thread, else wall")
    cli.add_kernel_args(p)


def start(args: argparse.Namespace) -> Path:
    """Set the torch threads, resolve --clock auto, import ComfyUI; returns ComfyUI's root."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "auto":
        args.clock = "cpu" if args.device == "cpu" and torch.get_num_threads() == 1 else "wall"
    return cli.import_comfy(args)


def seeded_call(patcher: Any, args: argparse.Namespace, latent: tuple[int, ...], context: tuple[int, int],
                sigmas: Sequence[float] = (1.0, 0.5, 0.0), cond_or_uncond: Sequence[int] = (0,),
                **conditioning: Any) -> Callable[[], torch.Tensor]:
    """One model call as a sampler makes it (``sampling.model_call``) at the first of `sigmas`, on
    seeded noise of shape `latent` (B, C, [F,] H, W) and a seeded text context (B, T, context[1]) with
    T = context[0]; `cond_or_uncond` as ComfyUI's (one entry per cond / uncond chunk of the batch);
    `conditioning` adds further model inputs, and ``pooled=n`` a seeded ``y`` (B, n)."""
    device, dtype = torch.device(args.device), cli.DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    b = latent[0]
    x = torch.randn(latent, generator=gen).to(device)
    kwargs = {"c_crossattn": torch.randn((b, *context), generator=gen).to(device, dtype)}
    pooled = conditioning.pop("pooled", 0)
    if pooled:
        kwargs["y"] = torch.randn((b, pooled), generator=gen).to(device, dtype)
    kwargs |= {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in conditioning.items()}
    return sampling.model_call(patcher, x, torch.tensor(list(sigmas), device=device), list(cond_or_uncond),
                               ["bench"] * len(cond_or_uncond), **kwargs)


def toma_every_block(patcher: Any, ratio: float, args: argparse.Namespace, **options: Any) -> Any:
    """ToMA on every block at `ratio`, tile --tile-size; options are further ToMASettings."""
    settings, patching = pack_module("nodes.settings"), pack_module("nodes.node.patching")
    return patching.patch_model(patcher, settings.ToMASettings(ratio=ratio, tile_size=args.tile_size, blocks="all", **options))


def kept_tokens(height: int, width: int, ratio: float, args: argparse.Namespace, **frames: int) -> int:
    """D of an image grid of height x width tokens (``frames=..., tile_frames=...``: of a video)."""
    return pack_module("toma_core").TileGrid(height, width, args.tile_size, ratio, **frames).num_kept


def ideal_grid(tokens: int, like: tuple[int, int]) -> tuple[int, int]:
    """An h x w grid with exactly `tokens` tokens, as square as possible (h <= like[0])."""
    best = (1, tokens)
    for h in range(1, min(tokens, like[0]) + 1):
        if tokens % h == 0 and abs(h - tokens // h) < abs(best[0] - best[1]):
            best = (h, tokens // h)
    return best


def time_in_turns(entries: dict[str, Entry], args: argparse.Namespace, *, warmup: int, repeats: int,
                  per_turn: int = 1, warm_each_turn: bool = False) -> dict[str, list[float]]:
    """ms of every timed call of each configuration, the configurations in turns (``samples_ms`` on
    --clock); each patcher is loaded before its turn, untimed, and with `warm_each_turn` makes one
    untimed call after loading."""
    import comfy.model_management

    def before(patcher: Any, call: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def load() -> None:
            comfy.model_management.load_models_gpu([patcher])
            if warm_each_turn:
                call()
        return load

    return timing.samples_ms({name: call for name, (_, call) in entries.items()}, args.device, warmup=warmup,
                             repeats=repeats, clock=timing.CLOCKS[args.clock], per_turn=per_turn,
                             before={name: before(patcher, call) for name, (patcher, call) in entries.items()})


def median_ms(entries: dict[str, Entry], args: argparse.Namespace) -> dict[str, float]:
    """Median ms per call of each configuration: --warmup untimed rounds, then --repeats timed ones."""
    times = time_in_turns(entries, args, warmup=args.warmup, repeats=args.repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def profile(entry: Entry, args: argparse.Namespace, row_limit: int = 18) -> None:
    """Top operators of one call of a configuration (loaded first), to see where the time goes."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([entry[0]])
    timing.profile_call(entry[1], args.device, row_limit=row_limit)
