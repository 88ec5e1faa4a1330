"""ToMA for HunyuanVideo and HunyuanImage 2.1 (`comfy.ldm.hunyuan_video.model.HunyuanVideo`).

Flux layers with the image first (HunyuanVideo.forward_orig): double blocks get args img
(B, R+N, C), txt, vec, pe (B, 1, R+N+T, hd/2, 2, 2) and an optional additive key mask
`attention_mask` (1, 1, R+N+T); single blocks get img = [ref; video; txt]. R reference tokens
(the "custom" image-to-video `ref_latent`) are prepended and pass through unmerged, so the N
video tokens start at R in every sequence, rope table and mask. Merged tokens take their
destinations' pe rows and mask columns; the text and its mask pass through.

Video latents (B, C, T, H, W) give N = T * ceil(H / 2) * ceil(W / 2) tokens, t-major. They are
merged with spatio-temporal plans (toma_core.video): frame 0 alone (the causal VAE
encodes it from the first picture by itself), the frames after it in t x h x w tiles of
`tile_frames` frames (the setting Wan reads too). Modulation is per sample, so tiles may span frames.
Both block kinds write into their inputs in place (double: txt; single: the sequence):
the merged sequence is a fresh tensor and the delta is taken against our own copy.

Image-to-video "v2 (replace)" guidance (`guiding_frame_index`) modulates frame 0 apart from the
rest through `modulation_dims` [(0, h*w, 0), (h*w, None, 1)]: frame 0 is merged on its own, so the
boundary moves to its merged count D0 ([(0, D0, 0), (D0, None, 1)]). A boundary inside a merged
segment runs the block unmerged, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ...toma_core import MergePlan
from ...toma_core.video import Segment, SegmentPlan
from ..contract import TOKENS_DIFFER, CallGeometry, Unmerged
from ..machinery.dit_blocks import parse_flux_blocks
from ..machinery.dit_runner import ImageSpan, Rows, merged_dit_block
from ..machinery.geometry import DitAdapter, text_length
from ..machinery.hooks import install_dit_hooks
from ..machinery.scope import require_block_scope
from ..runtime import CallContext
from ..settings import NODE_TILE_FRAMES, ToMASettings

SLOT = "hunyuan_video"
DIMS_KEYS = ("modulation_dims_img", "modulation_dims")
"""Block arguments whose (start, end, index) spans cover the image tokens (double: img; single: [img; txt])."""


@dataclasses.dataclass(frozen=True)
class HunyuanAdapter(DitAdapter):
    """Geometry of a HunyuanVideo call: frames x h x w video tokens, R reference tokens before them.
    tile_frames: frames one tile spans after frame 0."""

    tile_frames: int = NODE_TILE_FRAMES

    def segments(self, frames: int) -> tuple[Segment, ...]:
        """Frame 0 alone, then the other frames (t x h x w tiles)."""
        rest = (Segment(frames - 1, tile_frames=self.tile_frames),) if frames > 1 else ()
        return (Segment(1), *rest)

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """x (B, C, T, H, W) or (B, C, H, W) (HunyuanImage 2.1); ref_latent (b, C, T', H', W')."""
        text_len, p = text_length(context), self.patch_size
        if x.ndim not in (4, 5):
            return CallGeometry(1, 1, text_len, 0, f"latent of shape {tuple(x.shape)} is not (B, C[, T], H, W)")
        frames = int(x.shape[2]) if x.ndim == 5 else 1
        ref = kwargs.get("ref_latent")
        refs = math.prod(ref.shape[2:-2]) * math.ceil(ref.shape[-2] / p) * math.ceil(ref.shape[-1] / p) if torch.is_tensor(ref) else 0
        return CallGeometry(math.ceil(x.shape[-2] / p), math.ceil(x.shape[-1] / p), text_len, refs, None, frames)


def apply(model, settings: ToMASettings) -> HunyuanAdapter:
    """Hook the selected double and single blocks of a ModelPatcher clone of a HunyuanVideo model."""
    require_block_scope(settings, "HunyuanVideo")
    dm = model.get_model_object("diffusion_model")
    sizes = {"double": len(dm.double_blocks), "single": len(dm.single_blocks)}
    blocks = parse_flux_blocks(settings.blocks, sizes["double"], sizes["single"])
    install_dit_hooks(model, sizes, blocks, {"double": merged_double, "single": merged_single})
    return HunyuanAdapter("hunyuan_video", blocks.describe(), blocks.count, int(dm.patch_size[-1]), None, settings.tile_frames)


def _tables(start: int) -> tuple[Rows, ...]:
    """pe rows and key-mask columns of the N video tokens, which start at R in both."""
    return Rows("pe", 2, start), Rows("attention_mask", 2, start, key_mask=True)


def double_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Double block: img [ref (R); video (N)] -> [ref; M video]; txt (B, T, C) passes through."""
    g, img = ctx.geometry, args["img"]
    if img.shape[1] != g.extra_tokens + g.tokens:
        return TOKENS_DIFFER
    return _span(args, ctx, img.shape[1] + args["txt"].shape[1])


def single_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Single block: img [ref (R); video (N); txt (T)] -> [ref; M video; txt]."""
    g, seq = ctx.geometry, args["img"]
    if seq.shape[1] < g.extra_tokens + g.tokens:
        return TOKENS_DIFFER
    return _span(args, ctx, seq.shape[1])


def _span(args: dict, ctx: CallContext, length: int) -> ImageSpan:
    """[ref; M video; rest]: pe rows and key-mask columns at R, the call's segments, and the
    modulation spans moved to the merged positions."""
    g, adapter = ctx.geometry, ctx.state.config.adapter

    def dims(plan: MergePlan) -> dict | Unmerged:
        moved = {key: merged_dims(args[key], plan, g.extra_tokens) for key in DIMS_KEYS if args.get(key) is not None}
        why = next((value for value in moved.values() if isinstance(value, Unmerged)), None)
        return why or moved

    return ImageSpan(g.extra_tokens, _tables(g.extra_tokens), length, adapter.segments(g.frames), dims)


merged_double = merged_dit_block(SLOT, double_span)
merged_single = merged_dit_block(SLOT, single_span)


def merged_dims(dims: list[tuple], plan: MergePlan, start: int) -> list[tuple] | Unmerged:
    """modulation_dims spans (start, end|None, index) over a sequence whose image tokens [start,
    start+N) merge with `plan` (a SegmentPlan): each boundary moves to the merged position. A
    boundary inside a merged segment has none: Unmerged."""
    n, d = plan.num_tokens, plan.num_kept
    parts = plan.parts if isinstance(plan, SegmentPlan) else [plan]
    bounds, tokens, kept = {start: start}, start, start
    for part in parts:
        tokens, kept = tokens + part.num_tokens, kept + part.num_kept
        bounds[tokens] = kept

    def move(b: int | None) -> int | None | Unmerged:
        if b is None or b <= start:
            return b
        if b in bounds:
            return bounds[b]
        return b - n + d if b >= start + n else Unmerged(f"modulation boundary {b} inside a merged frame segment")

    spans = [(move(a), move(b), index) for a, b, index in dims]
    why = next((v for span in spans for v in span[:2] if isinstance(v, Unmerged)), None)
    return why or spans
