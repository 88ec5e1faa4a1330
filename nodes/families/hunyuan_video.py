"""ToMA for HunyuanVideo 1.0 and 1.5 and HunyuanImage 2.1 (`comfy.ldm.hunyuan_video.model.HunyuanVideo`).

Flux layers. Double blocks get args img (B, R+N, C), txt (B, T', C), vec, pe (B, 1, L, hd/2, 2, 2)
and an optional additive key mask `attention_mask` (1, 1, L) over L = R+N+T' tokens; single blocks
get one sequence img (B, L, C). R reference tokens (the "custom" image-to-video `ref_latent`) sit
just before the N video tokens and pass through unmerged. T' text tokens: the refined prompt, plus
byT5 glyph tokens and (HunyuanVideo 1.5) vision tokens (`vision_in`); they pass through too.

Where the text sits in the sequence, the rope table and the mask differs between ComfyUI trees
(`HunyuanVideo.forward_orig`: [ref; video; txt] in 0.3.64, [txt; ref; video] in 0.33), so every
block reads it from the pe it receives (`image_offset`): the text tokens' position ids are 0, so
their rope rows are the identity rotation, which no image layout but the true one shows. A pe
that fits neither order runs the block unmerged (`contract.layout_changed`). Merged tokens take
their destinations' pe rows and mask columns; the text and its mask pass through.

Video latents (B, C, T, H, W) give N = T * ceil(H / 2) * ceil(W / 2) tokens, t-major. They are
merged with spatio-temporal plans (toma_core.video): frame 0 alone (the causal VAE
encodes it from the first picture by itself), the frames after it in t x h x w tiles of
`tile_frames` frames (the setting Wan reads too). Modulation is per sample, so tiles may span frames.
Both block kinds write into their inputs in place (double: txt; single: the sequence):
the merged sequence is a fresh tensor and the delta is taken against our own copy.

Image-to-video "v2 (replace)" guidance (`guiding_frame_index`) modulates tokens [0, h*w) of a
block's sequence apart from the rest through `modulation_dims` [(0, h*w, 0), (h*w, None, 1)]
(double: over img; single: over the whole sequence, text included). Each boundary moves to the
merged position before merging (machinery/spans.py): the end of frame 0, merged on its own, to its
merged count D0; a boundary before the video stays. A boundary inside a merged segment runs the
block unmerged, with the layout reason.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ...toma_core import MergePlan
from ...toma_core.video import Segment
from ..contract import TOKENS_DIFFER, CallGeometry, Unmerged, layout_changed
from ..machinery.dit_blocks import parse_flux_blocks
from ..machinery.geometry import DitAdapter, text_length
from ..machinery.hooks import install_dit_hooks
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, Rows, merged_dit_block
from ..machinery.scope import require_block_scope
from ..machinery.spans import RowMove, moved_spans
from ..run.runtime import CallContext
from ..settings import NODE_TILE_FRAMES, ToMASettings

SLOT = "hunyuan_video"
DIMS_KEYS = ("modulation_dims_img", "modulation_dims")
"""Block arguments whose (start, end, index) spans cover args["img"] (double: [ref; video]; single: the whole sequence)."""


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
    blocks = parse_flux_blocks(settings.blocks, sizes["double"], sizes["single"], video=True)
    install_dit_hooks(model, sizes, blocks, {"double": merged_double, "single": merged_single})
    return HunyuanAdapter("hunyuan_video", blocks.describe(), blocks.count, int(dm.patch_size[-1]), None, settings.tile_frames)


def _tables(start: int) -> tuple[Rows, ...]:
    """pe rows and key-mask columns of the N video tokens, which start at `start` in both."""
    return Rows("pe", 2, start), Rows("attention_mask", 2, start, key_mask=True)


def image_offset(pe: torch.Tensor | None, images: int, texts: int) -> int | Unmerged:
    """Where the `images` image rows (R reference + N video) start among the images + texts rows of
    a rope table pe (B, 1, L, hd/2, 2, 2): 0 (image first) or `texts` (text first).

    Text tokens have position ids 0 (HunyuanVideo._forward's txt_ids, forward_orig's byT5 and
    vision ids), so their pe rows are the identity rotation; the image's last token has a nonzero
    position. The order is the one whose text rows are all identity and whose last image row is
    not; a pe that fits neither (or both) cannot be placed: layout_changed.
    """
    length = images + texts
    if pe is None or pe.ndim != 6 or pe.shape[2] != length or pe.shape[-2:] != (2, 2):
        shape = None if pe is None else tuple(pe.shape)
        return layout_changed(f"pe of shape {shape} is not a (B, 1, {length}, hd/2, 2, 2) rope table")
    if texts == 0:
        return 0
    orders = ((0, images), (texts, 0))  # (image start, text start): image first, text first
    fits = torch.stack([
        _identity(pe.narrow(2, text, texts)) & ~_identity(pe.narrow(2, start + images - 1, 1)) for start, text in orders
    ]).tolist()
    if fits.count(True) != 1:
        return layout_changed("the text's rope rows (position 0) are neither before nor after the image tokens")
    return orders[fits.index(True)][0]


def _identity(rows: torch.Tensor) -> torch.Tensor:
    """Whether every rotation of rope rows (..., 2, 2) is the identity: a 0-d bool tensor."""
    return (rows == torch.eye(2, dtype=rows.dtype, device=rows.device)).all()


def double_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Double block: img [ref (R); video (N)] -> [ref; M video]; txt (B, T', C) passes through.
    pe and the key mask hold the L = R+N+T' tokens with the text before or after img."""
    g, img, texts = ctx.geometry, args["img"], args["txt"].shape[1]
    if img.shape[1] != g.extra_tokens + g.tokens:
        return TOKENS_DIFFER
    offset = image_offset(args.get("pe"), img.shape[1], texts)
    if isinstance(offset, Unmerged):
        return offset
    return _span(args, ctx, g.extra_tokens, offset + g.extra_tokens, img.shape[1] + texts)


def single_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Single block: img [ref (R); video (N); txt (T')] or [txt; ref; video] -> the video merged
    to M video; the order is read from pe (image_offset)."""
    g, seq = ctx.geometry, args["img"]
    images = g.extra_tokens + g.tokens
    if seq.shape[1] < images:
        return TOKENS_DIFFER
    offset = image_offset(args.get("pe"), images, seq.shape[1] - images)
    if isinstance(offset, Unmerged):
        return offset
    start = offset + g.extra_tokens
    return _span(args, ctx, start, start, seq.shape[1])


def _span(args: dict, ctx: CallContext, start: int, rows: int, length: int) -> ImageSpan:
    """The video tokens at `start` of args["img"] and at `rows` of pe and the key mask (over
    `length` tokens), the call's segments, and the modulation spans (over args["img"]) moved to
    the merged positions."""
    g, adapter = ctx.geometry, ctx.state.config.adapter

    def dims(plan: MergePlan) -> dict | Unmerged:
        moved = {key: merged_dims(args[key], plan, start) for key in DIMS_KEYS if args.get(key) is not None}
        why = next((value for value in moved.values() if isinstance(value, Unmerged)), None)
        return why or moved

    return ImageSpan(start, _tables(rows), length, adapter.segments(g.frames), dims, keys=Keys(rows, length))


merged_double = merged_dit_block(SLOT, double_span)
merged_single = merged_dit_block(SLOT, single_span)


def merged_dims(dims: list[tuple], plan: MergePlan, start: int) -> list[tuple] | Unmerged:
    """modulation_dims spans (start, end|None, index) over a sequence whose image tokens [start,
    start+N) merge with `plan` (a SegmentPlan): each boundary moves to the merged position
    (machinery/spans.py). A boundary inside a merged segment has none: layout_changed."""
    return moved_spans(dims, RowMove.of(plan, start), "modulation")
