"""Where a UNet's transformer blocks are (SDXL, SD1.x, SD2.x): module paths, ComfyUI block ids
and resolution levels, and what both scopes of the UNet family (unet.py, unet_attention.py) ask
of a block run at its level: whether it merges (`level_veto`) and with which plan (`level_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...toma_core import MergePlan
from ..contract import Unmerged
from ..machinery.runner import features
from ..run.runtime import CallContext
from .unet_blocks import BlockId

PLAN_SLOT = "unet"
"""Plan cache slot; the cache key adds the level's h x w, so this is one plan per level."""


@dataclass(frozen=True)
class TransformerSite:
    """One BasicTransformerBlock of the UNet.

    path: module path below the diffusion model, e.g. "input_blocks.4.1.transformer_blocks.0".
    block: ComfyUI's block id ("input", 4) as in transformer_options["block"]; depth: index in
    its SpatialTransformer stack (transformer_options["block_index"]); downsample: how many times
    smaller than the latent its level is (1, 2, 4, ...).
    """

    path: str
    block: BlockId
    depth: int
    downsample: int
    module: torch.nn.Module


def find_sites(unet: torch.nn.Module) -> list[TransformerSite]:
    """Every BasicTransformerBlock of a UNetModel with its block id and resolution level (`levels`).
    Video UNets (SpatialVideoTransformer) are refused."""
    from comfy.ldm.modules.attention import SpatialTransformer, SpatialVideoTransformer

    sites: list[TransformerSite] = []
    for block, path, layer, downsample in levels(unet):
        if isinstance(layer, SpatialVideoTransformer):
            raise ValueError("ToMA does not support video UNets (SpatialVideoTransformer, e.g. SVD)")
        if isinstance(layer, SpatialTransformer):
            sites += _stack_sites(layer, path, block, downsample)
    return sites


def levels(unet: torch.nn.Module):
    """(block id, module path, layer, downsample) of every layer of a UNetModel's blocks in execution
    order, downsample being how many times smaller than the latent the layer's input grid is: each
    downsampling layer halves the grid for the layers after it, each upsampling layer doubles it.
    The one walk of a UNet's levels (the sites here, the ResBlocks priced in unet_cost.py)."""
    downsample = 1
    for group, prefix, index, block in _unet_blocks(unet):
        for layer_index, layer in enumerate(block):
            yield (group, index), f"{prefix}.{layer_index}", layer, downsample
            downsample = max(1, int(downsample * _scale_change(layer)))


def _unet_blocks(unet: torch.nn.Module):
    """(group, module path, index, TimestepEmbedSequential) of every UNet block in execution order."""
    for index, block in enumerate(unet.input_blocks):
        yield "input", f"input_blocks.{index}", index, block
    if getattr(unet, "middle_block", None) is not None:
        yield "middle", "middle_block", 0, unet.middle_block
    for index, block in enumerate(unet.output_blocks):
        yield "output", f"output_blocks.{index}", index, block


def _scale_change(layer: torch.nn.Module) -> float:
    """2 after a downsampling layer (Downsample, or a ResBlock with down=True), 0.5 after an
    upsampling one, else 1."""
    from comfy.ldm.modules.diffusionmodules.openaimodel import Downsample, Upsample

    if getattr(layer, "updown", False):
        layer = getattr(layer, "h_upd", layer)
    if isinstance(layer, Downsample):
        return 2.0
    if isinstance(layer, Upsample):
        return 0.5
    return 1.0


def _stack_sites(stack: torch.nn.Module, path: str, block: BlockId, downsample: int) -> list[TransformerSite]:
    return [
        TransformerSite(f"{path}.transformer_blocks.{j}", block, j, downsample, module)
        for j, module in enumerate(stack.transformer_blocks)
    ]


def describe_blocks(sites: list[TransformerSite]) -> str:
    """E.g. "input 4,5 (1/2), input 7,8 (1/4), middle 0 (1/4), output 0-5 ..." for error messages."""
    seen: dict[tuple[str, int], int] = {}
    for site in sites:
        seen.setdefault(site.block, site.downsample)
    text = ", ".join(f"{g} {i} (1/{d})" for (g, i), d in seen.items())
    return f"transformer blocks {text}" if text else "no transformer blocks"


def has_attention_replace(replace: dict | None, block: Any, block_index: int) -> bool:
    """True when patches_replace has an attn1/attn2 entry for this block, keyed as ComfyUI's
    BasicTransformerBlock looks it up: (group, index, depth) first, then (group, index)."""
    if not replace or block is None:
        return False
    keys = ((block[0], block[1], block_index), tuple(block))
    return any(key in replace.get(name, {}) for name in ("attn1", "attn2") for key in keys)


def level_veto(ctx: CallContext, x: torch.Tensor, options: dict, replace: dict | None) -> Unmerged | None:
    """Why this block run stays unmerged, or None; options: the block's transformer_options (or
    its attention patches' extra_options), replace: the call's attn1/attn2 replace patches.

    x (B, N, C) must match the level grid (activations_shape); a level below min_tokens, or a block
    whose attention another node replaced (SAG, PAG: comfy_extras/nodes_sag.py, nodes_pag.py),
    runs unmerged.
    """
    shape = options.get("activations_shape")
    if shape is None or len(shape) != 4:
        return Unmerged("no activations_shape")
    h, w = int(shape[-2]), int(shape[-1])
    if x.ndim != 3 or x.shape[1] != h * w or x.shape[0] != ctx.batch:
        return Unmerged("tokens differ from activations_shape")
    if h * w < ctx.settings.token_floor:
        return Unmerged(f"level below min_tokens={ctx.settings.min_tokens}")
    if has_attention_replace(replace, options.get("block"), options.get("block_index", 0)):
        return Unmerged("attn1/attn2 replace patch present")
    return None


def level_plan(ctx: CallContext, x: torch.Tensor, options: dict) -> MergePlan:
    """The plan of this block's level (h x w from activations_shape), built from x (B, N, C) once."""
    h, w = int(options["activations_shape"][-2]), int(options["activations_shape"][-1])
    return ctx.plan(PLAN_SLOT, h, w, lambda: features(x))
