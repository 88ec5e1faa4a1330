"""The cost model's view of a patched model (toma_core.cost), and `min_tokens = "auto"`: a model
call merges only where the model predicts a gain of at least AUTO_MIN_SPEEDUP for that family's
width, that call's token count and the plan's tile (tile_size^2 x tile_frames tokens). A predicted
gain is then checked by measurement during the run (call_timing.CallTimer.auto_stop, wrappers.py):
the model is calibrated on a CPU only.

The profile is read once, when the node runs, from the diffusion model's own modules:
- a DiT (Flux, Chroma, SD3, Qwen-Image, Lumina2, HiDream, HunyuanVideo, Wan): its width (the
  `hidden_size`, `dim` or `inner_dim` of ComfyUI's model class) and its block lists; the family's
  adapter says how many blocks the setting merges. Text joins the attention except in Wan
  (cross-attention).
- a UNet (SDXL, SD1.x): every BasicTransformerBlock at its level (unet_sites.find_sites), merged
  when the setting selects it, and every ResBlock, which runs at full N (convolutions priced at
  2 flops per parameter and output position; the stacks' proj_in/proj_out are left out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..toma_core.cost import LINEAR_UNET, TILE_TOKENS, BlockCost, call_speedup
from .contract import CallGeometry
from .settings import ToMASettings

AUTO_MIN_SPEEDUP = 1.05
"""min_tokens "auto": a call merges only when its predicted speed-up is at least this (a few percent)."""

WIDTH_ATTRIBUTES = ("hidden_size", "dim", "inner_dim", "model_dim")
"""Attributes of ComfyUI's DiT classes holding the block width C (Flux/SD3/HunyuanVideo, Wan/Lumina2,
Qwen-Image/HiDream, Kandinsky 5)."""

BLOCK_LISTS = (
    "double_blocks", "single_blocks", "joint_blocks", "transformer_blocks", "layers", "noise_refiner",
    "blocks", "double_stream_blocks", "single_stream_blocks", "visual_transformer_blocks",
)
"""ModuleList attributes of ComfyUI's DiT classes holding their transformer blocks on image tokens."""

CROSS_ATTENTION_FAMILIES = frozenset({"wan", "kandinsky5"})
"""DiT families whose text is cross-attention (not in the blocks' self-attention)."""


@dataclass
class CostProfile:
    """The blocks of one patched model for the cost model, with a per-geometry cache of predictions.

    width: the width reported in log lines (a UNet's first transformer level). tile_tokens: tokens
    per plan tile, tile_size^2 (x tile_frames in a video family): the plan's cost grows with it.
    """

    blocks: tuple[BlockCost, ...]
    width: int
    kept: float
    tile_tokens: int = TILE_TOKENS
    _cache: dict[tuple[int, int, str, int], float] = field(default_factory=dict, repr=False)

    def speedup(self, tokens: int, others: int, device: str = "cpu", batch: int = 1) -> float:
        """Predicted unmerged / merged time of a call of batch `batch`, N = `tokens` image tokens and
        `others` text and pass-through tokens, on a device of type `device` ("cpu", "cuda", ...)."""
        key = (tokens, others, device, batch)
        if key not in self._cache:
            self._cache[key] = call_speedup(self.blocks, tokens, others, self.kept, device, batch, self.tile_tokens)
        return self._cache[key]

    def auto_veto(self, geometry: CallGeometry, device: str, batch: int) -> str | None:
        """min_tokens "auto": why this call runs unmerged on `device`, or None when merging is predicted to pay."""
        predicted = self.speedup(geometry.tokens, (geometry.text_len or 0) + geometry.extra_tokens, device, batch)
        if predicted >= AUTO_MIN_SPEEDUP:
            return None
        return (
            f"min_tokens auto: merging {geometry.tokens} image tokens at width {self.width} on {device} is predicted "
            f"{predicted:.2f}x (needs {AUTO_MIN_SPEEDUP:g}x; a number in min_tokens forces merging)"
        )


def build_profile(
    family: str, diffusion_model: torch.nn.Module, merged_blocks: int, settings: ToMASettings, video: bool = False,
) -> CostProfile:
    """The CostProfile of a patched model: `merged_blocks` of its blocks merge (DiT families); a
    `video` family's tiles span settings.tile_frames frames."""
    kept = 1.0 - settings.effective_ratio
    whole = settings.scope == "block"
    tile_tokens = settings.tile_size ** 2 * (settings.tile_frames if video else 1)
    if family == "unet":
        blocks, width = unet_blocks(diffusion_model, settings, whole)
        return CostProfile(blocks, width, kept, tile_tokens)
    width = dit_width(diffusion_model)
    total = sum(len(getattr(diffusion_model, name)) for name in BLOCK_LISTS if isinstance(getattr(diffusion_model, name, None), torch.nn.ModuleList))
    joint = family not in CROSS_ATTENTION_FAMILIES
    merged = min(merged_blocks, total)
    blocks = (
        BlockCost(width, merged, joint=joint, merged=True, whole=whole),
        BlockCost(width, max(0, total - merged), joint=joint),
    )
    return CostProfile(blocks, width, kept, tile_tokens)


def dit_width(diffusion_model: torch.nn.Module) -> int:
    """C of a DiT, from its class's width attribute (0 when it has none: then nothing is predicted to pay)."""
    for name in WIDTH_ATTRIBUTES:
        value = getattr(diffusion_model, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def unet_blocks(unet: torch.nn.Module, settings: ToMASettings, whole: bool) -> tuple[tuple[BlockCost, ...], int]:
    """BlockCosts of a UNet's transformer blocks (merged when selected) and of its other per-position
    layers; the width of its first transformer level."""
    from comfy.ldm.modules.diffusionmodules.openaimodel import ResBlock

    from .families.unet_blocks import parse_unet_blocks
    from .families.unet_sites import find_sites

    spec = parse_unet_blocks(settings.blocks)
    sites = find_sites(unet)
    blocks = [
        BlockCost(_site_width(s.module), share=1.0 / s.downsample ** 2, linear=LINEAR_UNET, joint=False,
                  merged=spec.selects(s.block, s.downsample), whole=whole)
        for s in sites
    ]
    blocks += [_conv_cost(m, share) for m, share in _resblocks(unet, ResBlock)]
    width = _site_width(sites[0].module) if sites else 0
    return tuple(blocks), width


def _site_width(block: torch.nn.Module) -> int:
    norm = getattr(block, "norm1", None)
    shape = getattr(norm, "normalized_shape", None)
    return int(shape[0]) if shape else 0


def _conv_cost(module: torch.nn.Module, share: float) -> BlockCost:
    """A convolution block at full N: 2 flops per parameter and output position (width 1)."""
    params = sum(p.numel() for p in module.parameters())
    return BlockCost(1, share=share, linear=2.0 * params, attention=False, joint=False)


def _resblocks(unet: torch.nn.Module, resblock: type) -> list[tuple[torch.nn.Module, float]]:
    """(ResBlock, token share) of every ResBlock of a UNet, its level tracked in execution order
    as unet_sites.find_sites does (a block's output is at the level after it)."""
    found: list[tuple[torch.nn.Module, float]] = []
    downsample = 1
    groups = [*unet.input_blocks, *([unet.middle_block] if getattr(unet, "middle_block", None) is not None else []), *unet.output_blocks]
    for block in groups:
        for layer in block:
            if isinstance(layer, resblock):
                found.append((layer, 1.0 / downsample ** 2))
            downsample = _level_after(layer, downsample)
    return found


def _level_after(layer: torch.nn.Module, downsample: int) -> int:
    from comfy.ldm.modules.diffusionmodules.openaimodel import Downsample, Upsample

    inner = getattr(layer, "h_upd", layer) if getattr(layer, "updown", False) else layer
    if isinstance(inner, Downsample):
        return downsample * 2
    if isinstance(inner, Upsample):
        return max(1, downsample // 2)
    return downsample
