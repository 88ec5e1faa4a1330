"""Merging around one block, shared by every family: the token span, its per-token rows (rope
tables, attention masks) and the proportional-attention key bias.

A block sees a sequence (B, L, C) in which the N image tokens of the main grid sit at
[start, start + N); text and extra tokens (reference images) around them pass through. The
plan (toma_core.MergePlan) maps the span to D merged tokens and a block's change back:

    x = seq[:, start:start+N]                  (B, N, C)
    seq_m = [head; M x; tail]                  (B, L - N + D, C), a fresh tensor
    out = block(seq_m, rows gathered to the D destinations)
    y = [head'; x + U(out_span - M x); tail']  (B, L, C)

The merged sequence is always a fresh tensor and the delta is taken against our own copy of
M x, so blocks that write into their input in place (`x += ...` in comfy.ldm.flux.layers.
SingleStreamBlock, Chroma's and HunyuanVideo's blocks) cannot zero the delta.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...toma_core import MergePlan
from ..contract import Unmerged, layout_changed


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


def merge_mask(mask: torch.Tensor | None, plan: MergePlan, start: int, n: int, length: int) -> torch.Tensor | None | Unmerged:
    """Merge an attention mask over the L = `length` tokens of the block's attention.

    A (L, L), (B, L, L) or (B, H, L, L) mask keeps the destinations' rows and columns; None stays
    None. Unmerged when the mask has another layout (the block then runs unmerged).
    """
    if mask is None:
        return None
    if mask.ndim < 2 or mask.shape[-1] != length or mask.shape[-2] != length:
        return layout_changed(f"attn_mask of shape {tuple(mask.shape)} is not (..., {length}, {length})")
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    rows = merge_rows(mask, mask.ndim - 2, start, n, plan)
    return merge_rows(rows, rows.ndim - 1, start, n, plan)


def merge_key_mask(mask: torch.Tensor | None, plan: MergePlan, start: int, n: int, length: int) -> torch.Tensor | None | Unmerged:
    """Merge a key mask (B|1, ..., L) over the L = `length` keys (HunyuanVideo's (1, 1, L),
    Lumina2's (B, L)): the destinations' columns. Unmerged for another layout."""
    if mask is None:
        return None
    if mask.ndim < 2 or mask.shape[-1] != length:
        return layout_changed(f"key mask of shape {tuple(mask.shape)} does not end in {length} keys")
    return merge_rows(mask, mask.ndim - 1, start, n, plan)


def add_key_bias(mask: torch.Tensor | None, bias: torch.Tensor | None, start: int, length: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Proportional attention: add bias (B, D), the merged tokens' log cluster sizes, to the
    logits of keys [start, start+D) of a length-L attention ("proportional attention", Bolya et
    al., Token Merging: Your ViT but Faster, ICLR 2023, §3); text and reference keys get 0. An
    existing merged mask (bool or additive, 2-4 dims) is kept. Returns an additive (B, H|1, L|1, L) mask in `dtype`, or `mask` when bias is None.
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
