"""Model-level speed of ToMA on the DiT families beyond Flux, SDXL and Wan, each a family-shaped model built
from ComfyUI's own classes with random weights (CPU sizes: hidden 768, 12 heads of 64, a 32 x 32
image-token grid (HunyuanVideo: 4 frames of 16 x 16), the family's usual text length, a few
blocks).

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.bench_families --threads 1 --clock cpu   # every family
    python -m bench.speed.bench_families --family qwen_image --ratios 0.25 0.5 0.75

For each family and ratio, in one round-robin (interleaved medians of ms per model call; each
model is loaded before its turn, untimed, so object patches apply as in sampling; bench/speed/model_speed.py,
the skeleton the speed benches share): the unpatched model, ToMA on every block (a plan built in every call), and the
ideal, the unpatched model on a grid of D tokens, the physical limit of merging. Speed-ups are
against the unpatched model of the same round; "vs ideal" is ToMA's time over the ideal's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import cli, sampling
from . import model_speed
from .model_speed import ideal_grid


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
    p.add_argument("--family", choices=sorted(SHAPES), action="append", help="repeat for several (default: all)")
    p.add_argument("--grid", type=int, default=32, help="image tokens per side")
    model_speed.add_args(p, ratios=[0.5], repeats=7, warmup=2)
    return p.parse_args(argv)


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
    frames = (shape.frames,) if shape.video_axis else ()
    extra = shape.extra(1, shape.text) if shape.extra else {}
    return model_speed.seeded_call(patcher, args, (1, shape.channels, *frames, 2 * grid_hw[0], 2 * grid_hw[1]),
                                   (shape.text, shape.context_dim), pooled=shape.pooled, **extra)


def bench_family(name: str, args: argparse.Namespace) -> list[str]:
    """Table rows of one family: unpatched, then ToMA and the ideal at each ratio."""
    shape = SHAPES[name]
    base = build(shape, args)
    side = round((args.grid ** 2 / shape.frames) ** 0.5)
    full = (side, side)
    rows = []
    for ratio in args.ratios:
        d = model_speed.kept_tokens(side, side, ratio, args)
        toma = model_speed.toma_every_block(base, ratio, args)
        ms = model_speed.median_ms({
            "plain": (base, make_call(base, shape, args, full)),
            "toma": (toma, make_call(toma, shape, args, full)),
            "ideal": (base, make_call(base, shape, args, ideal_grid(d, full))),
        }, args)
        plain, toma_ms, ideal = ms["plain"], ms["toma"], ms["ideal"]
        rows.append(f"{name:<14}{ratio:>6g}{shape.frames * side ** 2:>7}{shape.frames * d:>6}{plain:>10.1f}{toma_ms:>10.1f}"
                    f"{plain / toma_ms:>9.2f}{ideal:>10.1f}{plain / ideal:>9.2f}{(toma_ms / ideal - 1) * 100:>9.1f}%")
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = model_speed.start(args)
    print(cli.run_header(root, args) + f"{args.grid}x{args.grid} image tokens, tile {args.tile_size}, "
          f"{args.clock} clock, median of {args.repeats} interleaved calls")
    print(f"{'family':<14}{'ratio':>6}{'N':>7}{'D':>6}{'plain ms':>10}{'ToMA ms':>10}{'speed-up':>9}{'ideal ms':>10}{'ideal x':>9}{'vs ideal':>10}")
    for name in args.family or list(SHAPES):
        for row in bench_family(name, args):
            print(row, flush=True)


if __name__ == "__main__":
    main()
