"""Model-level speed of ToMA on the DiT families beyond Flux, SDXL and Wan, each a family-shaped model built
from ComfyUI's own classes with random weights (CPU sizes: hidden 768, 12 heads of 64, a 32 x 32
image-token grid (HunyuanVideo: 4 frames of 16 x 16), the family's usual text length, a few
blocks).

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.bench_families --threads 1 --clock cpu   # every family
    python -m bench.speed.bench_families --family qwen_image --ratios 0.25 0.5 0.75

For each family and ratio, in one round-robin (interleaved medians of ms per model call; each
model is loaded before its turn, untimed, so object patches apply as in sampling): the unpatched model, ToMA on every block (a plan built in every call), and the
ideal, the unpatched model on a grid of D tokens, the physical limit of merging. Speed-ups are
against the unpatched model of the same round; "vs ideal" is ToMA's time over the ideal's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..harness import cli, sampling, timing
from .bench_flux import ideal_grid, kept_tokens, patch


@dataclass(frozen=True)
class Shape:
    """A family-shaped model: its ComfyUI config class, unet config, latent channels and extra
    per-call conditioning (besides the text context of `text` tokens x `context_dim`)."""

    config_cls: str
    unet_config: dict
    channels: int
    text: int
    context_dim: int
    video_axis: bool = False
    pooled: int = 0
    extra: Callable[[int, int], dict] | None = None
    frames: int = 1
    """Latent frames of a video family (each frame a grid of --grid**2 / frames tokens)."""


SHAPES = {
    "sd3": Shape(
        "SD3", {"in_channels": 16, "patch_size": 2, "depth": 12, "num_blocks": 4, "adm_in_channels": 256,
                "pos_embed_scaling_factor": None, "num_patches": 64 * 64, "pos_embed_max_size": 64,
                "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 256, "out_features": 768}},
                "qk_norm": "rms"},
        16, 154, 256, pooled=256,
    ),
    "qwen_image": Shape(
        "QwenImage", {"image_model": "qwen_image", "in_channels": 64, "out_channels": 16, "patch_size": 2, "num_layers": 4,
                      "attention_head_dim": 64, "num_attention_heads": 12, "joint_attention_dim": 256, "axes_dims_rope": (8, 28, 28)},
        16, 128, 256, video_axis=True,
    ),
    "lumina2": Shape(
        "Lumina2", {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 768, "n_layers": 4, "n_refiner_layers": 1,
                    "n_heads": 12, "n_kv_heads": 4, "multiple_of": 256, "ffn_dim_multiplier": None, "norm_eps": 1e-5,
                    "qk_norm": True, "cap_feat_dim": 256, "axes_dims": [16, 24, 24], "axes_lens": [300, 512, 512]},
        16, 128, 256, extra=lambda batch, text: {"num_tokens": text},
    ),
    "hunyuan_video": Shape(
        "HunyuanVideo", {"image_model": "hunyuan_video", "in_channels": 16, "out_channels": 16, "vec_in_dim": 256,
                         "context_in_dim": 256, "hidden_size": 768, "mlp_ratio": 4.0, "num_heads": 12, "depth": 2,
                         "depth_single_blocks": 4, "axes_dim": [16, 24, 24], "theta": 256, "patch_size": [1, 2, 2],
                         "qkv_bias": True, "guidance_embed": True, "byt5": False, "meanflow": False},
        16, 128, 256, video_axis=True, pooled=256, frames=4,
        extra=lambda batch, text: {"guidance": torch.full((batch,), 6.0)},
    ),
    "hidream": Shape(
        "HiDream", {"image_model": "hidream", "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 2,
                    "num_single_layers": 4, "attention_head_dim": 64, "num_attention_heads": 12, "caption_channels": [256, 256],
                    "text_emb_dim": 256, "num_routed_experts": 4, "num_activated_experts": 2, "axes_dims_rope": (16, 24, 24),
                    "max_resolution": (128, 128), "llama_layers": list(range(6))},
        16, 128, 256, pooled=256,
        extra=lambda batch, text: {"encoder_hidden_states_llama3": torch.randn((batch, 6, text, 256), generator=torch.Generator().manual_seed(1))},
    ),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_device_args(p)
    p.add_argument("--family", choices=sorted(SHAPES), action="append", help="repeat for several (default: all)")
    p.add_argument("--grid", type=int, default=32, help="image tokens per side")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.5])
    p.add_argument("--tile-size", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--clock", default="wall", choices=list(timing.CLOCKS),
                   help="cpu: this process's CPU time (with --threads 1, robust to other jobs on a shared machine)")
    cli.add_kernel_args(p)
    args = p.parse_args(argv)
    args.batch = 1
    return args


def build(shape: Shape, args: argparse.Namespace):
    """The family-shaped model in a ModelPatcher (SD3's pos_embed buffer, torch.empty in ComfyUI, filled)."""
    import comfy.supported_models

    patcher = sampling.build_patcher(getattr(comfy.supported_models, shape.config_cls), shape.unet_config, args)
    pos_embed = getattr(patcher.model.diffusion_model, "pos_embed", None)
    if isinstance(pos_embed, torch.Tensor):
        with torch.no_grad():
            pos_embed.normal_(0.0, 0.1)
    return patcher


def make_call(patcher, shape: Shape, args: argparse.Namespace, grid_hw: tuple[int, int]) -> Callable[[], torch.Tensor]:
    """One sampler-like model call on an h x w token grid (latent 2h x 2w) per frame."""
    device, dtype = torch.device(args.device), cli.DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    frames = (shape.frames,) if shape.video_axis else ()
    x = torch.randn((1, shape.channels, *frames, 2 * grid_hw[0], 2 * grid_hw[1]), generator=gen).to(device)
    kwargs = {"c_crossattn": torch.randn((1, shape.text, shape.context_dim), generator=gen).to(device, dtype)}
    if shape.pooled:
        kwargs["y"] = torch.randn((1, shape.pooled), generator=gen).to(device, dtype)
    if shape.extra:
        kwargs |= shape.extra(1, shape.text)
    sigmas = torch.tensor([1.0, 0.5, 0.0], device=device)
    return sampling.model_call(patcher, x, sigmas, [0], ["bench"], **kwargs)


def timed_round_robin(calls: dict[str, tuple[object, Callable[[], torch.Tensor]]],
                      args: argparse.Namespace) -> dict[str, float]:
    """Median ms per call of each (patcher, call), timed round-robin. Each patcher is loaded before
    its turn (untimed): loading applies its object patches (Lumina2, HiDream) and takes the other
    clones' off, as sampling does."""
    import comfy.model_management

    def loader(patcher: object) -> Callable[[], None]:
        return lambda: comfy.model_management.load_models_gpu([patcher])

    return timing.median_ms({name: fn for name, (_, fn) in calls.items()}, args.device, warmup=args.warmup,
                            repeats=args.repeats, clock=timing.CLOCKS[args.clock],
                            before={name: loader(patcher) for name, (patcher, _) in calls.items()})


def bench_family(name: str, args: argparse.Namespace) -> list[str]:
    """Table rows of one family: unpatched, then ToMA and the ideal at each ratio."""
    shape = SHAPES[name]
    base = build(shape, args)
    side = int(round((args.grid ** 2 / shape.frames) ** 0.5))
    full = (side, side)
    frame_args = argparse.Namespace(**vars(args) | {"grid": side})
    rows = []
    for ratio in args.ratios:
        d = kept_tokens(ratio, frame_args)
        toma = patch(base, ratio, args)
        ms = timed_round_robin({
            "plain": (base, make_call(base, shape, args, full)),
            "toma": (toma, make_call(toma, shape, args, full)),
            "ideal": (base, make_call(base, shape, args, ideal_grid(d, full))),
        }, args)
        plain, toma, ideal = ms["plain"], ms["toma"], ms["ideal"]
        rows.append(f"{name:<14}{ratio:>6g}{shape.frames * side ** 2:>7}{shape.frames * d:>6}{plain:>10.1f}{toma:>10.1f}{plain / toma:>9.2f}"
                    f"{ideal:>10.1f}{plain / ideal:>9.2f}{(toma / ideal - 1) * 100:>9.1f}%")
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = cli.import_comfy(args)
    print(cli.run_header(root, args) + f"{args.grid}x{args.grid} image tokens, tile {args.tile_size}, "
          f"{args.clock} clock, median of {args.repeats} interleaved calls")
    print(f"{'family':<14}{'ratio':>6}{'N':>7}{'D':>6}{'plain ms':>10}{'ToMA ms':>10}{'speed-up':>9}{'ideal ms':>10}{'ideal x':>9}{'vs ideal':>10}")
    for name in args.family or list(SHAPES):
        for row in bench_family(name, args):
            print(row, flush=True)


if __name__ == "__main__":
    main()
