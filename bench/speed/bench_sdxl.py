"""Model-level speed of ToMA on an SDXL-shaped UNet built from ComfyUI's own classes.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.bench_sdxl             # CPU
    python -m bench.speed.bench_sdxl --device cuda --dtype fp16 --real-size                     # GPU, SDXL sizes

Default (CPU): comfy.model_base.SDXL with SDXL's topology (channel_mult 1, 2, 4; transformer depth
0 / 2 / 10, middle 10; linear proj; ADM 2816) and widths scaled by 1/5 (model_channels 64, heads
of 64), on a 56x56 latent: 28x28 = 784 tokens at 128 channels and 14x14 = 196 tokens at 256
channels, i.e. SDXL's tokens-to-width balance at 1024^2 (4096 / 640 and 1024 / 1280), so the
shares of attention, linear layers and convolutions match. --real-size: model_channels 320,
context 2048, 128x128 latent (SDXL at 1024^2). Random weights; batch 2 (cond + uncond).

Configurations: unpatched; ToMA (whole blocks, blocks "auto" = every transformer block) at each
ratio; ToMA with scope "attention" at each --attention-ratios; the built-in TomePatchModel at each
ratio. A plan is built in every call (recompute_every=1). Timing (bench/speed/model_speed.py, the
skeleton the speed benches share): the configurations take turns for --rounds rounds (so load drift
on a shared machine hits all of them alike), each turn loading its model, making a warm-up call and
--calls timed calls; the table gives the median ms per model call and the speed-up
against the unpatched model of the same run. On a shared CPU, `--threads 1 --clock cpu` (process
CPU time) is far less noisy than wall time. Target at ratio 0.5 on CPU: >= 1.4x. --profile
prints where a ToMA call at the first ratio spends its time.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch

from .. import cli, sampling
from . import model_speed

SDXL_CONTEXT_PER_CHANNEL = 2048 / 320
"""SDXL's text context width relative to model_channels."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-size", action="store_true", help="SDXL sizes: model_channels 320, context 2048, 128x128 latent")
    p.add_argument("--channels", type=int, default=64, help="model_channels (SDXL: 320; a multiple of 32)")
    p.add_argument("--latent", type=int, default=56, help="latent side (SDXL at 1024^2: 128; a multiple of 4)")
    p.add_argument("--batch", type=int, default=2, help="model batch (2 = cond + uncond)")
    p.add_argument("--attention-ratios", type=float, nargs="*", default=[0.5], help="ratios for scope 'attention'")
    p.add_argument("--tome", action=argparse.BooleanOptionalAction, default=True, help="include the built-in TomePatchModel")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=3, help="timed calls per configuration and round")
    model_speed.add_args(p, repeats=None)
    args = p.parse_args(argv)
    if args.real_size:
        args.channels, args.latent = 320, 128
    if args.channels % 32 or args.latent % 4:
        p.error(f"--channels={args.channels} must be a multiple of 32 and --latent={args.latent} a multiple of 4")
    return args


def unet_config(args: argparse.Namespace) -> dict:
    """SDXL's unet config with model_channels and the context width scaled together."""
    context = max(64, round(args.channels * SDXL_CONTEXT_PER_CHANNEL / 64) * 64)
    return {
        "use_checkpoint": False, "image_size": 32, "in_channels": 4, "out_channels": 4,
        "model_channels": args.channels, "num_res_blocks": [2, 2, 2], "channel_mult": [1, 2, 4],
        "transformer_depth": [0, 0, 2, 2, 10, 10], "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
        "transformer_depth_middle": 10, "use_spatial_transformer": True, "use_linear_in_transformer": True,
        "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816, "context_dim": context,
        "num_heads": -1, "num_head_channels": 64, "use_temporal_attention": False, "use_temporal_resblock": False,
    }


def build_model(args: argparse.Namespace) -> Any:
    """An SDXL-shaped comfy.model_base.SDXL with random weights, in a ModelPatcher on the device."""
    import comfy.supported_models

    return sampling.build_patcher(comfy.supported_models.SDXL, unet_config(args), args)


def make_call(patcher: Any, args: argparse.Namespace) -> Callable[[], torch.Tensor]:
    """One model call as a sampler makes it with CFG (cond + uncond in one batch of --batch), on
    seeded noise of --latent^2 at the first sigma of the schedule."""
    b = args.batch
    sigma_max = float(patcher.get_model_object("model_sampling").sigma_max)
    return model_speed.seeded_call(patcher, args, (b, 4, args.latent, args.latent), (77, unet_config(args)["context_dim"]),
                                   sigmas=(sigma_max, 1.0, 0.0), cond_or_uncond=[0, 1][:b] + [0] * max(0, b - 2),
                                   pooled=2816)


def configurations(base: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Name -> ModelPatcher for every configuration of the table."""
    from harness.pack import pack_module

    settings = pack_module("nodes.settings")
    patching = pack_module("nodes.node.patching")

    def toma(ratio: float, scope: str) -> Any:
        return patching.patch_model(base, settings.ToMASettings(ratio=ratio, tile_size=args.tile_size, scope=scope))

    configs: dict[str, Any] = {"unpatched": base}
    configs.update({f"ToMA {r:g}": toma(r, "block") for r in args.ratios})
    configs.update({f"ToMA-attn {r:g}": toma(r, "attention") for r in args.attention_ratios})
    if args.tome:
        from comfy_extras.nodes_tomesd import TomePatchModel

        configs.update({f"ToMe {r:g}": TomePatchModel.execute(base, r).result[0] for r in args.ratios})
    return configs


def round_robin(configs: dict[str, Any], args: argparse.Namespace) -> dict[str, list[float]]:
    """ms of every timed call per configuration: --rounds rounds of turns, each turn loading its
    model, one warm-up call, then --calls timed calls."""
    entries = {name: (patcher, make_call(patcher, args)) for name, patcher in configs.items()}
    return model_speed.time_in_turns(entries, args, warmup=0, repeats=args.rounds, per_turn=args.calls,
                                     warm_each_turn=True)


def level_tokens(args: argparse.Namespace, ratio: float) -> str:
    """N -> D of the two transformer levels, e.g. "784->392, 196->98"."""
    sides = [-(-args.latent // down) for down in (2, 4)]
    return ", ".join(f"{side * side}->{model_speed.kept_tokens(side, side, ratio, args)}" for side in sides)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = model_speed.start(args)
    base = build_model(args)
    configs = configurations(base, args)
    times = round_robin(configs, args)
    config = unet_config(args)
    print(cli.run_header(root, args) + f"SDXL topology, model_channels {config['model_channels']}, context "
          f"{config['context_dim']}, latent {args.latent}x{args.latent}, batch {args.batch}, tile {args.tile_size}; "
          f"{args.clock} clock, median of {args.rounds} rounds x {args.calls} calls")
    plain = statistics.median(times["unpatched"])
    print(f"{'config':<16}{'tokens (1/2, 1/4)':>22}{'ms/call':>10}{'speed-up':>10}{'min ms':>10}")
    for name, values in times.items():
        ratio = float(name.split()[-1]) if name.startswith("ToMA") else 0.0
        ms = statistics.median(values)
        print(f"{name:<16}{level_tokens(args, ratio):>22}{ms:>10.1f}{plain / ms:>10.2f}{min(values):>10.1f}")
    if args.profile:
        first = f"ToMA {args.ratios[0]:g}"
        model_speed.profile((configs[first], make_call(configs[first], args)), args, row_limit=20)


if __name__ == "__main__":
    main()
