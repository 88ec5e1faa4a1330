"""ToMA for Kandinsky 5 (ComfyUI 0.33): Video Lite and Pro (T2V, I2V) and Image Lite, one class,
`comfy.ldm.kandinsky5.model.Kandinsky5`.

Each selected visual block (`visual_transformer_blocks.{i}`, a `TransformerDecoderBlock`) gets an object
patch of its `forward`, called as Kandinsky5.forward_orig calls it: visual_embed (B, N, C) visual
tokens only, text_embed (B, T, C) text, time_embed (B, C_t) per sample, freqs (1, N, 1, hd/2, 2, 2)
the 3-D rope table, transformer_options. Not the dit replace key ("double_block", i): on ComfyUI 0.33
its `original_block` calls the block with keywords the block does not take (x=, context=), so any
replace patch there fails. Text enters by cross-attention and is never merged; the text blocks
(`text_transformer_blocks`) run on text alone and are left as they are. For a merged call:

    x_m = plan.merge(x)                                      (B, D, C)
    out = block(x_m, freqs=freqs rows of the destinations)
    y = plan.unmerge_residual(x, x_m, out)                   (B, N, C) = x + U(block(Mx) - Mx)

Tokens are t-major (frame, row, column) after a (1, 2, 2) patchify: N = F x ceil(H/2) x ceil(W/2).
Tiles span `tile_frames` frames and tile_size x tile_size tokens (toma_core.video); frame 0 stands
alone, because the HunyuanVideo causal VAE Kandinsky 5 uses encodes it from the first picture alone
and image-to-video replaces it with the input image (Kandinsky5._forward's `time_dim_replace`).
The image model gets 4-D latents: one frame, spatial tiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...toma_core.video import Segment, frame_runs
from ..contract import TOKENS_DIFFER, CallGeometry, Unmerged
from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.geometry import VideoGeometry, text_length
from ..machinery.hooks import install_forward_patches, module_forward
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, Rows, run_hook, run_merged
from ..machinery.scope import require_block_scope
from ..run.runtime import CallContext
from ..settings import ToMASettings

PLAN_SLOT = "kandinsky5"


@dataclass(frozen=True)
class Kandinsky5Adapter:
    """The runtime's view of a patched Kandinsky 5 model (a contract.FamilyAdapter)."""

    family: str
    blocks: str
    num_blocks: int
    patch_size: tuple[int, int, int]
    tile_frames: int

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Token layout from x (B, C, F, H, W) (video) or (B, C, H, W) (image)."""
        text_len = text_length(context)
        if x.ndim not in (4, 5):
            return VideoGeometry(1, 1, text_len, reason=f"latent of shape {tuple(x.shape)} is not (B, C[, F], H, W)")
        pt, ph, pw = self.patch_size
        frames = math.ceil(x.shape[2] / pt) if x.ndim == 5 else 1
        height, width = math.ceil(x.shape[-2] / ph), math.ceil(x.shape[-1] / pw)
        segments = tuple(Segment(n, tile_frames=self.tile_frames) for _, n in frame_runs([[0.0] * frames]))
        return VideoGeometry(height, width, text_len, frames=frames, segments=segments)


def apply(model, settings: ToMASettings) -> Kandinsky5Adapter:
    """Object-patch the selected visual blocks of `model` (a ModelPatcher clone); return the runtime
    adapter. Earlier ToMA patches are replaced; another pack's object patch stays inside ToMA's."""
    require_block_scope(settings, "Kandinsky 5")
    dm = model.get_model_object("diffusion_model")
    count = len(dm.visual_transformer_blocks)
    chosen = parse_dit_blocks(settings.blocks, {"blocks": count}, video=True)
    paths = {f"visual_transformer_blocks.{i}": i in chosen.blocks for i in range(count)}
    install_forward_patches(model, paths, lambda path, foreign: make_forward(dm.get_submodule(path), foreign))
    return Kandinsky5Adapter("kandinsky5", chosen.describe(), chosen.count, tuple(dm.patch_size), settings.tile_frames)


def image_span(x: torch.Tensor, ctx: CallContext) -> ImageSpan | Unmerged:
    """x (B, N, C) holds every frame's tokens; freqs rows gathered to the destinations."""
    g: VideoGeometry = ctx.geometry
    if x.shape[1] != g.all_frames * g.height * g.width:
        return TOKENS_DIFFER
    return ImageSpan(0, (Rows("freqs", 1, 0),), x.shape[1], g.segments, tokens=x.shape[1], keys=Keys(0, x.shape[1]))


def make_forward(block: torch.nn.Module, foreign: Callable | None) -> Callable:
    """The object patch of one TransformerDecoderBlock's forward: the block on merged visual tokens,
    its change unmerged (see the module docstring)."""
    run = module_forward(block, foreign)

    def toma_forward(visual_embed, text_embed, time_embed, freqs, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
        def call(x: torch.Tensor, rows: torch.Tensor, options: dict = transformer_options) -> torch.Tensor:
            return run(x, text_embed, time_embed, freqs=rows, transformer_options=options)

        def merged(ctx: CallContext) -> torch.Tensor | Unmerged:
            span = image_span(visual_embed, ctx)
            if isinstance(span, Unmerged):
                return span
            return run_merged(
                ctx, PLAN_SLOT, visual_embed, span, {"freqs": freqs, "transformer_options": transformer_options},
                call=lambda x_m, tables: call(x_m, tables["freqs"], tables.get("transformer_options", transformer_options)),
                output=lambda out: out,
                rebuild=lambda out, x: x,
            )

        return run_hook({"transformer_options": transformer_options}, None, lambda: call(visual_embed, freqs), merged)

    return toma_forward
