"""ToMA for the Flux family (Flux.1 dev/schnell, Fill, Kontext; Chroma, Chroma Radiance).

Each selected block gets a `patches_replace["dit"]` entry. Inside, for a merged call:

    x = image tokens (B, N, C) of the block input, N = h * w (the main latent grid only)
    x_m = plan.merge(x)                                   (B, D, C)
    out = block([txt;] x_m [; ref], pe with destination rows, attn_mask with destination rows)
    y = plan.unmerge_residual(x, x_m, out_image_part)     (B, N, C) = x + U(block(Mx) - Mx)

Text tokens and Kontext reference tokens pass through untouched, with their pe rows; merged
tokens take their destination's pe rows (plan.take on the pe token axis). Every hook returns N
image tokens, so ControlNet residuals and step caches keep working. The plan is built by the
first merged block of a forward from a parameter-free LayerNorm of its image tokens and reused
by the other blocks (the per-call plan cache in runtime.CallContext). All per-step decisions are
made eagerly in runtime.apply_model_wrapper; the hooks only read the CallContext.

Single blocks add to their input in place (`x += ...`): the hook always passes a freshly
concatenated tensor and keeps its own merged tokens for the delta.

With scope "attention", double blocks merge only their attention (nodes/flux_attention.py) and
single blocks merge whole, as the reference ToMA Flux code does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..toma_core import MergePlan
from .flux_attention import attention_options
from .flux_blocks import parse_flux_blocks
from .runtime import CallContext, CallGeometry, find_call, note_orphan
from .settings import ToMASettings

log = logging.getLogger(__name__)

PLAN_SLOT = "flux"
"""One plan per forward: every Flux block sees the same h x w image grid."""

Block = Callable[[dict], dict]


@dataclass(frozen=True)
class FluxAdapter:
    """The runtime's view of a patched Flux-family model (see runtime.FamilyAdapter)."""

    family: str
    blocks: str
    num_blocks: int
    patch_size: int

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Grid h = ceil(H / patch), w = ceil(W / patch) of x (B, C, H, W); T from context
        (B, T, C_txt); Kontext reference tokens from kwargs["ref_latents"] (each (b, C, h', w'))."""
        text_len = int(context.shape[1]) if torch.is_tensor(context) and context.ndim == 3 else None
        if x.ndim != 4:
            return CallGeometry(1, 1, text_len, 0, f"latent of shape {tuple(x.shape)} is not (B, C, H, W)")
        p = self.patch_size
        refs = kwargs.get("ref_latents") or []
        extra = sum(math.ceil(r.shape[-2] / p) * math.ceil(r.shape[-1] / p) for r in refs)
        return CallGeometry(math.ceil(x.shape[-2] / p), math.ceil(x.shape[-1] / p), text_len, extra)


def apply(model, settings: ToMASettings) -> FluxAdapter:
    """Install the block hooks on `model` (a ModelPatcher clone); return the runtime adapter.

    Earlier ToMA hooks are replaced; a replacement another pack put on the same key stays
    outermost and ToMA merges only around the real block.
    """
    dm = model.get_model_object("diffusion_model")
    depth, depth_single = len(dm.double_blocks), len(dm.single_blocks)
    blocks = parse_flux_blocks(settings.blocks, depth, depth_single)
    dit = _dit_patches(model)
    for group, count in (("double", depth), ("single", depth_single)):
        for index in range(count):
            key = (f"{group}_block", index)
            foreign = _foreign(dit.get(key))
            if blocks.selects(group, index):
                dit[key] = make_hook(group, foreign)
            elif foreign is not None:
                dit[key] = foreign
            else:
                dit.pop(key, None)
    return FluxAdapter("flux", blocks.describe(), blocks.count, int(getattr(dm, "patch_size", 2)))


def _dit_patches(model) -> dict:
    """model_options["transformer_options"]["patches_replace"]["dit"] of the clone, copied so the
    dicts it shares with the model it was cloned from are never modified."""
    options = model.model_options.setdefault("transformer_options", {})
    replace = dict(options.get("patches_replace", {}))
    replace["dit"] = dict(replace.get("dit", {}))
    options["patches_replace"] = replace
    return replace["dit"]


def _foreign(entry):
    """The non-ToMA function under a key: an earlier ToMA hook is unwrapped to what it wrapped."""
    return getattr(entry, "toma_foreign", entry) if entry is not None else None


def make_hook(group: str, foreign=None):
    """A dit replace function for a double or single block.

    foreign: another pack's replacement already on this key; it stays outermost and its
    `original_block` becomes the ToMA-merged real block.
    """
    merged_block = merged_double if group == "double" else merged_single

    def toma_block(args: dict, extra: dict) -> dict:
        original = extra["original_block"]
        if foreign is None:
            return merged_block(args, extra, original)
        inner = dict(extra, original_block=lambda a: merged_block(a, extra, original))
        return foreign(args, inner)

    toma_block.toma_foreign = foreign
    toma_block.toma_group = group
    return toma_block


def _context(args: dict, extra: dict) -> CallContext | None:
    ctx = find_call(args, extra)
    if ctx is None:
        note_orphan("no ToMA call context")
    return ctx


def merged_double(args: dict, extra: dict, block: Block) -> dict:
    """Double block: args img (B, N[+R], C), txt (B, T, C), pe (B, 1, T+N+R, hd/2, 2, 2)."""
    ctx = _context(args, extra)
    if ctx is None or not ctx.merge:
        return block(args)
    g = ctx.geometry
    img, text_len = args["img"], args["txt"].shape[1]
    if img.shape[1] != g.tokens + g.extra_tokens:
        ctx.record_block(False, "image tokens differ from the latent grid")
        return block(args)
    if ctx.settings.scope == "attention":
        return _merged_attention(args, block, ctx, text_len, text_len + img.shape[1])
    return _merged_block(args, block, ctx, 0, text_len, text_len + img.shape[1])


def merged_single(args: dict, extra: dict, block: Block) -> dict:
    """Single block: args img = [txt; img; ref] (B, T+N+R, C), pe (B, 1, T+N+R, hd/2, 2, 2)."""
    ctx = _context(args, extra)
    if ctx is None or not ctx.merge:
        return block(args)
    g = ctx.geometry
    seq = args["img"]
    text_len = seq.shape[1] - g.tokens - g.extra_tokens
    if text_len < 0:
        ctx.record_block(False, "image tokens differ from the latent grid")
        return block(args)
    return _merged_block(args, block, ctx, text_len, text_len, seq.shape[1])


def _merged_block(args: dict, block: Block, ctx: CallContext, start: int, text_len: int, length: int) -> dict:
    """Run `block` on merged image tokens and unmerge its output.

    The N image tokens sit at [start, start+N) of args img and at [text_len, text_len+N) of the
    block's attention sequence of `length` tokens ([txt; img; ref]: the pe and attn_mask rows).
    A mask of another layout runs the block unmerged.
    """
    seq, n = args["img"], ctx.geometry.tokens
    prepared = _plan_and_mask(args, ctx, seq[:, start:start + n], text_len, length)
    if prepared is None:
        return block(args)
    plan, mask = prepared
    x, x_m, seq_m = merge_span(seq, start, n, plan)
    out = block(dict(args, img=seq_m, pe=merge_rows(args.get("pe"), 2, text_len, n, plan), attn_mask=mask))
    ctx.record_block(True)
    return dict(out, img=unmerge_span(out["img"], start, plan, x, x_m))


def _merged_attention(args: dict, block: Block, ctx: CallContext, text_len: int, length: int) -> dict:
    """Run a double block whose attention alone sees merged image tokens (scope "attention")."""
    prepared = _plan_and_mask(args, ctx, args["img"][:, :ctx.geometry.tokens], text_len, length)
    if prepared is None:
        return block(args)
    plan, mask = prepared
    out = block(dict(args, transformer_options=attention_options(args.get("transformer_options"), plan, text_len, mask)))
    ctx.record_block(True)
    return out


def _plan_and_mask(args: dict, ctx: CallContext, image: torch.Tensor, text_len: int, length: int) -> tuple[MergePlan, torch.Tensor | None] | None:
    """This call's plan (built from `image` (B, N, C) if missing) and the block's attention mask
    merged to the T + D [+ R] layout, with the proportional-attention bias when enabled.
    None (recorded as an unmerged block run) when the mask has another layout."""
    g = ctx.geometry
    plan = ctx.plan(PLAN_SLOT, g.height, g.width, lambda: features(image))
    mask, why = merge_mask(args.get("attn_mask"), plan, text_len, g.tokens, length)
    if why:
        ctx.record_block(False, why)
        return None
    bias = plan.size_bias() if ctx.settings.proportional_attention else None
    return plan, add_key_bias(mask, bias, text_len, length - g.tokens + plan.num_kept, image.dtype)


def features(x: torch.Tensor) -> torch.Tensor:
    """Plan features of image tokens x (B, N, C): parameter-free LayerNorm in fp32 (B, N, C)."""
    return F.layer_norm(x.float(), (x.shape[-1],))


def merge_span(seq: torch.Tensor, start: int, n: int, plan: MergePlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge tokens [start, start+n) of seq (B, L, C).

    Returns x (B, N, C) the original span, x_m (B, D, C) its merge, and a fresh (B, L-N+D, C)
    sequence with x_m in place of the span (fresh, so an in-place block cannot touch x or x_m).
    """
    x = seq[:, start:start + n]
    x_m = plan.merge(x)
    return x, x_m, torch.cat([seq[:, :start], x_m, seq[:, start + n:]], dim=1)


def unmerge_span(out: torch.Tensor, start: int, plan: MergePlan, x: torch.Tensor, x_m: torch.Tensor) -> torch.Tensor:
    """Block output out (B, L-N+D, C) -> (B, L, C): the merged span becomes x + U(out_span - x_m)."""
    d = plan.num_kept
    y = plan.unmerge_residual(x, x_m, out[:, start:start + d])
    return torch.cat([out[:, :start], y, out[:, start + d:]], dim=1)


def merge_rows(rows: torch.Tensor | None, dim: int, start: int, n: int, plan: MergePlan) -> torch.Tensor | None:
    """Per-token rows (pe, mask) along `dim`: rows [start, start+n) -> the D destinations' rows.

    rows has batch 1 or B in dim 0; the other spans are expanded to the plan's batch if needed.
    """
    if rows is None:
        return None
    span = plan.take(rows.narrow(dim, start, n), dim)
    head = rows.narrow(dim, 0, start)
    tail = rows.narrow(dim, start + n, rows.shape[dim] - start - n)
    if span.shape[0] != rows.shape[0]:
        head = head.expand(span.shape[0], *head.shape[1:])
        tail = tail.expand(span.shape[0], *tail.shape[1:])
    return torch.cat([head, span, tail], dim=dim)


def merge_mask(mask: torch.Tensor | None, plan: MergePlan, start: int, n: int, length: int) -> tuple[torch.Tensor | None, str | None]:
    """Merge an attention mask over the L = `length` tokens of the block's attention.

    A (L, L), (B, L, L) or (B, H, L, L) mask keeps the destinations' rows and columns. Returns
    (mask, None), or (None, reason) when the mask has another layout (the block then runs unmerged).
    """
    if mask is None:
        return None, None
    if mask.ndim < 2 or mask.shape[-1] != length or mask.shape[-2] != length:
        return None, f"attn_mask of shape {tuple(mask.shape)} is not (..., {length}, {length})"
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    rows = merge_rows(mask, mask.ndim - 2, start, n, plan)
    return merge_rows(rows, rows.ndim - 1, start, n, plan), None


def add_key_bias(mask: torch.Tensor | None, bias: torch.Tensor | None, start: int, length: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Proportional attention: add bias (B, D), the merged tokens' log cluster sizes, to the
    logits of keys [start, start+D) of a length-L attention ("proportional attention", Bolya et
    al., Token Merging: Your ViT but Faster, ICLR 2023, §3); text and reference keys get 0. An existing merged mask (bool or additive, 2-4
    dims) is kept. Returns an additive (B, H|1, L|1, L) mask in `dtype`, or `mask` when bias is None.
    """
    if bias is None:
        return mask
    b, d = bias.shape
    row = F.pad(bias.to(dtype), (start, length - start - d)).view(b, 1, 1, length)
    if mask is None:
        return row
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    while mask.ndim < 4:
        mask = mask.unsqueeze(-3) if mask.ndim == 3 else mask.unsqueeze(0)
    return mask.to(dtype) + row
