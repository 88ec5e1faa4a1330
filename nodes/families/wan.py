"""ToMA for Wan 2.1 / 2.2 video models: T2V and I2V (1.3B, 14B), Wan 2.2 A14B (each
expert is its own MODEL: patch both), Wan 2.2-5B TI2V, Fun reference frames, Phantom, Bernini
in-context latents, VACE.

Each selected `WanAttentionBlock` gets a `patches_replace["dit"][("double_block", i)]` entry
(args img (B, N, C), txt (B, T, C), vec (B, 1|F, 6, C) or (B, 6, C), pe (1, N, 1, hd/2, 2, 2)).
Text is cross-attention only and never merged. For a merged call:

    x_m = plan.merge(img)                                    (B, D, C)
    out = block(img=x_m, pe=pe rows of the destinations, vec per frame or per merged token)
    y = plan.unmerge_residual(img, x_m, out)                 (B, N, C) = x + U(block(Mx) - Mx)

Tokens are t-major (frame, row, column). Tiles span `tile_frames` frames and tile_size x
tile_size tokens, inside frame segments that never merge with each other (toma_core.video):
- frame 0 always stands alone: Wan's causal VAE encodes it from the first picture alone, I2V
  conditions it, and Wan 2.2-5B runs it at timestep 0 under a noise mask;
- frames of different per-frame timesteps (5B noise masks) are separate segments;
- Fun reference frames (prepended) and Phantom frames (appended) pass through with their pe rows.

Wan 2.2's Bernini in-context latents (`context_latents`, comfy_extras/nodes_bernini.py: a source
video, reference video or images, each at its own size) are patch-embedded after every frame
(WanModel.forward_orig) with rope rows of their own: a tail after the merged span that passes
through, tokens and pe rows, like text.

Wan 2.2-5B modulates per frame: vec (B, F, 6, C), expanded per frame inside the block by
`repeat_e`, which assumes frame-major tokens with an equal count per frame. With spatial tiles
(tile_frames 1) the merged tokens are exactly that and vec passes unchanged; otherwise each merged
token gets its destination frame's row, vec (B, D, 6, C), which the block uses as is.

Variants: Bernini in-context latents pass through (above; beside a per-frame vec their blocks run
unmerged, see `merged_vec`). VACE's vace blocks run outside the block keys at full N and stay
unmerged (the main blocks merge). S2V blocks get no transformer_options and a per-segment
modulation: its calls run unmerged and the run's log line says so. Camera, HuMo, Animate and
unknown subclasses are refused with their class name. Under ComfyUI-RadialAttn, whose radial mask
is laid out over the video's own tokens, scope block leaves the blocks it runs radial unmerged, with
the reason (machinery/foreign_attention.py `radial_runs_block`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from ...toma_core.video import Segment, SegmentPlan, frame_runs
from ..contract import NOTHING_TO_MERGE, TOKENS_DIFFER, Unmerged
from ..machinery.dit_blocks import DitBlocks, parse_dit_blocks
from ..machinery.foreign_attention import RADIAL_BLOCK, radial_runs_block
from ..machinery.geometry import VideoGeometry, text_length
from ..machinery.hooks import install_dit_hooks
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, Rows, merged_dit_block
from ..machinery.scope import require_block_scope
from ..run.runtime import CallContext
from ..settings import KEYS_VALUES, ToMASettings

log = logging.getLogger(__name__)

PLAN_SLOT = "wan"

S2V_REASON = "Wan S2V (WanModel_S2V): blocks get no transformer_options and a per-segment modulation"


@dataclass(frozen=True)
class WanAdapter:
    """The runtime's view of a patched Wan model (a contract.FamilyAdapter)."""

    family: str
    blocks: str
    num_blocks: int
    patch_size: tuple[int, int, int]
    variant: str
    has_ref_conv: bool
    tile_frames: int

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> VideoGeometry:
        """Token layout from x (B, C, F, H, W), the extra conds reference_latent (B, C, H, W),
        time_dim_concat (B, C, F', H, W), denoise_mask (B|1, 1, F, H, W) and context_latents
        (a list of (B, C, F', H', W'), the tail)."""
        text_len = text_length(context)
        if x.ndim != 5:
            return VideoGeometry(1, 1, text_len, reason=f"latent of shape {tuple(x.shape)} is not (B, C, F, H, W)")
        pt, ph, pw = self.patch_size
        frames, height, width = (math.ceil(x.shape[2 + i] / p) for i, p in enumerate((pt, ph, pw)))
        if self.variant == "s2v":
            return VideoGeometry(height, width, text_len, reason=S2V_REASON, frames=frames)
        runs, why = _frame_runs(kwargs.get("denoise_mask"), frames)
        segments = [Segment(n, tile_frames=self.tile_frames) for _, n in runs]
        if self.has_ref_conv and kwargs.get("reference_latent") is not None:
            segments.insert(0, Segment(1, merge=False))
        extra = kwargs.get("time_dim_concat")
        if torch.is_tensor(extra) and extra.ndim == 5:
            segments.append(Segment(math.ceil(extra.shape[2] / pt), merge=False))
        passing = sum(s.frames for s in segments if not s.merge) * height * width
        tail = _in_context_tokens(kwargs.get("context_latents"), self.patch_size)
        return VideoGeometry(
            height, width, text_len, passing + tail, why, frames=frames, segments=tuple(segments), tail=tail,
        )


def _in_context_tokens(latents: Any, patch: tuple[int, int, int]) -> int:
    """Tokens of Bernini's context_latents (each (B, C, F', H', W'), padded up to the patch size by
    WanModel._forward before its patch embedding); 0 without them."""
    if not isinstance(latents, (list, tuple)):
        return 0
    return sum(math.prod(math.ceil(lat.shape[2 + i] / p) for i, p in enumerate(patch)) for lat in latents)


def _frame_runs(mask: Any, frames: int) -> tuple[list[tuple[int, int]], str | None]:
    """Runs of frames with equal noise-mask means (Wan 2.2-5B's per-frame timesteps), frame 0 alone."""
    if not torch.is_tensor(mask) or mask.ndim != 5:
        return frame_runs([[0.0] * frames]), None
    if mask.shape[2] != frames:
        return [(0, frames)], f"noise mask of {mask.shape[2]} frames for {frames} latent frames"
    return frame_runs(mask.float().mean(dim=(1, 3, 4)).tolist()), None


def _variant(diffusion_model) -> str:
    """"wan", "vace" or "s2v"; ValueError naming any other class (Camera, HuMo, Animate, ...)."""
    import comfy.ldm.wan.model as wan

    variants = {wan.WanModel: "wan", wan.VaceWanModel: "vace", wan.WanModel_S2V: "s2v"}
    cls = type(diffusion_model)
    if cls not in variants:
        raise ValueError(
            f"ToMA does not support the Wan model class {cls.__module__}.{cls.__qualname__}; supported: "
            "WanModel (Wan 2.1/2.2 T2V, I2V, TI2V 5B, Fun, Phantom), VaceWanModel, WanModel_S2V (runs unmerged)"
        )
    return variants[cls]


def apply(model, settings: ToMASettings) -> WanAdapter:
    """Install the block hooks on `model` (a ModelPatcher clone); return the runtime adapter.

    Earlier ToMA hooks are replaced; another pack's replacement on the same key stays outermost.
    """
    require_block_scope(settings, "Wan")
    dm = model.get_model_object("diffusion_model")
    variant = _variant(dm)
    chosen = parse_dit_blocks(settings.blocks, {"blocks": len(dm.blocks)}, video=True)
    # ComfyUI's key for Wan blocks is ("double_block", i) (WanModel.forward_orig); users name them blocks:5-39
    install_dit_hooks(model, {"double": len(dm.blocks)}, DitBlocks((("double", chosen.blocks),)), {"double": merged_block})
    blocks = chosen.describe()
    if variant == "vace":
        blocks += " (VACE blocks unmerged)"
        log.info("ToMA [wan]: VACE blocks run outside the block keys at full token count and stay unmerged")
    return WanAdapter(
        "wan", blocks, chosen.count, tuple(dm.patch_size), variant, getattr(dm, "ref_conv", None) is not None,
        settings.tile_frames,
    )


def image_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """img (B, N + tail, C) with N = every frame's tokens, pass-through frames included, then the
    Bernini tail: the call's frame segments, pe rows gathered to the destinations (the tail's rows
    kept), vec per frame or per merged token."""
    g: VideoGeometry = ctx.geometry
    img = args["img"]
    if ctx.settings.scope != KEYS_VALUES and radial_runs_block(args.get("transformer_options")):
        return RADIAL_BLOCK
    frame_tokens = g.all_frames * g.height * g.width
    if img.shape[1] != frame_tokens + g.tail:
        return TOKENS_DIFFER

    def vec(plan: SegmentPlan) -> dict | Unmerged:
        if not plan.merges:
            return NOTHING_TO_MERGE
        merged = merged_vec(args["vec"], plan, g)
        return merged if isinstance(merged, Unmerged) else {"vec": merged}

    return ImageSpan(0, (Rows("pe", 1, 0),), img.shape[1], g.segments, vec, tokens=frame_tokens, keys=Keys(0, img.shape[1]))


merged_block = merged_dit_block(PLAN_SLOT, image_span)
"""Run a Wan block on merged image tokens and unmerge its change (see the module docstring)."""


def merged_vec(vec: torch.Tensor, plan: SegmentPlan, g: VideoGeometry) -> torch.Tensor | Unmerged:
    """The block's modulation for the merged tokens: vec (B, 6, C) or (B, 1, 6, C) unchanged
    (per sample); a per-frame vec (B, F, 6, C) unchanged when the merged tokens are frame-major
    with equal counts per frame, else (B, D, 6, C) with each merged token's destination frame.
    Unmerged when vec's frames are not the call's frames, or when a Bernini tail follows them (the
    block's repeat_e spreads F rows over N + tail tokens, which no merged layout reproduces)."""
    if vec.ndim != 4 or vec.shape[1] == 1:
        return vec
    if g.tail:
        return Unmerged(f"per-frame vec of {vec.shape[1]} frames with {g.tail} in-context tokens after the frames")
    counts = plan.frame_counts
    if counts is not None and len(counts) == vec.shape[1] and len(set(counts)) == 1:
        return vec
    if vec.shape[1] != g.all_frames:
        return Unmerged(f"per-frame vec of {vec.shape[1]} frames for {g.all_frames} token frames")
    frame = plan.frame_of_kept(g.height * g.width).to(vec.device)
    index = frame.view(*frame.shape, 1, 1).expand(-1, -1, *vec.shape[2:])
    return vec.expand(plan.batch, *vec.shape[1:]).gather(1, index)
