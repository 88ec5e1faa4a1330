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
ratio. A plan is built in every call (recompute_every=1). Timing: the configurations take turns
for --rounds rounds (so load drift on a shared machine hits all of them alike), each with a warm-up
call and --calls timed calls; the table gives the median ms per model call and the speed-up
against the unpatched model of the same run. On a shared CPU, `--threads 1 --clock cpu` (process
CPU time) is far less noisy than wall time. Target at ratio 0.5 on CPU: >= 1.4x. --profile
prints where a ToMA call at the first ratio spends its time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch

from ..harness import cli, sampling, timing
from ..harness.cli import DTYPES, import_comfy
SDXL_CONTEXT_PER_CHANNEL = 2048 / 320
"""SDXL's text context width relative to model_channels."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_device_args(p)
    p.add_argument("--real-size", action="store_true", help="SDXL sizes: model_channels 320, context 2048, 128x128 latent")
    p.add_argument("--channels", type=int, default=64, help="model_channels (SDXL: 320; a multiple of 32)")
    p.add_argument("--latent", type=int, default=56, help="latent side (SDXL at 1024^2: 128; a multiple of 4)")
    p.add_argument("--batch", type=int, default=2, help="model batch (2 = cond + uncond)")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    p.add_argument("--attention-ratios", type=float, nargs="*", default=[0.5], help="ratios for scope 'attention'")
    p.add_argument("--tome", action=argparse.BooleanOptionalAction, default=True, help="include the built-in TomePatchModel")
    p.add_argument("--tile-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=3, help="timed calls per configuration and round")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--clock", default="wall", choices=list(timing.CLOCKS),
                   help="wall: elapsed time; cpu: this process's CPU time (with --threads 1, robust to other "
                   "processes on a shared machine)")
    cli.add_kernel_args(p)
    args = p.parse_args(argv)
    if args.real_size:
        args.channels, args.latent = 320, 128
    if args.channels % 32 or args.latent % 4:
        p.error(f"--channels={args.channels} must be a multiple of 32 and --latent={args.latent} a multiple of 4")
    return args


def unet_config(args: argparse.Namespace) -> dict:
    """SDXL's unet config with model_channels and the context width scaled together."""
    context = max(64, int(round(args.channels * SDXL_CONTEXT_PER_CHANNEL / 64)) * 64)
    return {
        "use_checkpoint": False, "image_size": 32, "in_channels": 4, "out_channels": 4,
        "model_channels": args.channels, "num_res_blocks": [2, 2, 2], "channel_mult": [1, 2, 4],
        "transformer_depth": [0, 0, 2, 2, 10, 10], "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
        "transformer_depth_middle": 10, "use_spatial_transformer": True, "use_linear_in_transformer": True,
        "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816, "context_dim": context,
        "num_heads": -1, "num_head_channels": 64, "use_temporal_attention": False, "use_temporal_resblock": False,
    }


def build_model(args: argparse.Namespace):
    """An SDXL-shaped comfy.model_base.SDXL with random weights, in a ModelPatcher on the device."""
    import comfy.supported_models

    return sampling.build_patcher(comfy.supported_models.SDXL, unet_config(args), args)


def make_call(patcher, args: argparse.Namespace, x: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """One model call as a sampler makes it with CFG (BaseModel.apply_model, the patcher's
    wrappers and patches, cond + uncond in one batch).

    x: the noisy latent (B, 4, H, W); default seeded noise of --batch x --latent^2.
    """
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn((args.batch, 4, args.latent, args.latent), generator=gen)
    x = (noise if x is None else x).to(device)
    b = x.shape[0]
    context = torch.randn((b, 77, unet_config(args)["context_dim"]), generator=gen).to(device, dtype)
    y = torch.randn((b, 2816), generator=gen).to(device, dtype)
    model_sampling = patcher.get_model_object("model_sampling")
    sigmas = torch.tensor([float(model_sampling.sigma_max), 1.0, 0.0], device=device)
    cond_or_uncond = [0, 1][:b] + [0] * max(0, b - 2)
    return sampling.model_call(patcher, x, sigmas, cond_or_uncond, ["bench"] * b, c_crossattn=context, y=y)


def configurations(base, args: argparse.Namespace) -> dict[str, object]:
    """Name -> ModelPatcher for every configuration of the table."""
    from ..harness.pack import pack_module

    settings = pack_module("nodes.settings")
    patching = pack_module("nodes.patching")

    def toma(ratio: float, scope: str):
        return patching.patch_model(base, settings.ToMASettings(ratio=ratio, tile_size=args.tile_size, scope=scope))

    configs: dict[str, object] = {"unpatched": base}
    configs.update({f"ToMA {r:g}": toma(r, "block") for r in args.ratios})
    configs.update({f"ToMA-attn {r:g}": toma(r, "attention") for r in args.attention_ratios})
    if args.tome:
        from comfy_extras.nodes_tomesd import TomePatchModel

        configs.update({f"ToMe {r:g}": TomePatchModel.execute(base, r).result[0] for r in args.ratios})
    return configs


def time_calls(patcher, call: Callable[[], torch.Tensor], args: argparse.Namespace) -> list[float]:
    """Load the patcher (applies its object patches), one warm-up call, then --calls timed calls (ms)."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    out = call()
    if not torch.isfinite(out).all():
        print("warning: non-finite model output", file=sys.stderr)
    return [timing.timed_ms(call, args.device, timing.CLOCKS[args.clock]) for _ in range(args.calls)]


def round_robin(configs: dict[str, object], calls: dict[str, Callable[[], torch.Tensor]],
                args: argparse.Namespace) -> dict[str, list[float]]:
    """ms of every timed call per configuration: --rounds rounds in which the configurations take
    turns (time_calls each), so that load drift on a shared machine hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, patcher in configs.items():
            times[name] += time_calls(patcher, calls[name], args)
    return times


def level_tokens(args: argparse.Namespace, ratio: float) -> str:
    """N -> D of the two transformer levels, e.g. "784->392, 196->98"."""
    from ..harness.pack import pack_module

    core = pack_module("toma_core")
    parts = []
    for down in (2, 4):
        side = -(-args.latent // down)
        grid = core.TileGrid(side, side, args.tile_size, ratio)
        parts.append(f"{side * side}->{grid.num_kept}")
    return ", ".join(parts)


def profile_call(patcher, call: Callable[[], torch.Tensor], args: argparse.Namespace) -> None:
    """Top operators of one ToMA call (torch.profiler), to see where the time goes."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    timing.profile_call(call, args.device, row_limit=20)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = import_comfy(args)
    base = build_model(args)
    configs = configurations(base, args)
    calls = {name: make_call(patcher, args) for name, patcher in configs.items()}
    times = round_robin(configs, calls, args)
    config = unet_config(args)
    print(cli.run_header(root, args) + f"SDXL topology, model_channels {config['model_channels']}, context "
          f"{config['context_dim']}, latent {args.latent}x{args.latent}, batch {args.batch}, tile {args.tile_size}; "
          f"{args.clock} clock, median of {args.rounds} rounds x {args.calls} calls")
    plain = statistics.median(times["unpatched"])
    print(f"{'config':<16}{'tokens (1/2, 1/4)':>22}{'ms/call':>10}{'speed-up':>10}{'min ms':>10}")
    for name, values in times.items():
        ratio = float(name.split()[-1]) if name != "unpatched" else 0.0
        tokens = level_tokens(args, ratio) if name.startswith("ToMA") else level_tokens(args, 0.0)
        ms = statistics.median(values)
        print(f"{name:<16}{tokens:>22}{ms:>10.1f}{plain / ms:>10.2f}{min(values):>10.1f}")
    if args.profile:
        first = f"ToMA {args.ratios[0]:g}"
        profile_call(configs[first], calls[first], args)


if __name__ == "__main__":
    main()
