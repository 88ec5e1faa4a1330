"""Keys/values merging: every query kept, attention over merged image keys and values (DESIGN §1.9).

Instead of running a whole block on D merged tokens and spreading its change back to N, keep all
queries and shorten only the context of self-attention: the N image keys and values at
[start, start + N) of the key sequence become D merged ones with the same plan (`MergePlan.merge`,
rows of M summing to 1), text and other keys pass through:

    K_m = [K_head; M K_img; K_tail],  V_m = [V_head; M V_img; V_tail]        (B, H, L - N + D, e)
    out = softmax(Q K_m^T / sqrt(e) + log m) V_m                               (B, H, L_q, e)

m (B, D) is each merged key's mass, the tokens it stands for (plan.cluster_sizes(); log m is
plan.size_bias(), 0 for the keys that pass through). With a hard assignment and a cluster of equal
keys and values this is exactly the unmerged attention: exp(q.k + log m) = m exp(q.k) counts the
cluster's m equal terms (proportional attention, Bolya et al., ToMe, ICLR 2023, §3).

The bias rides in one extra channel instead of an attention mask, so unmasked fast kernels still
run (`with_mass_channel`): queries get a constant 1, keys their log-mass, and the head size is
padded to a multiple of the kernel's (8), zeros elsewhere; the keys are scaled so that the kernel's
1 / sqrt(e') softmax scale of the padded size e' gives back 1 / sqrt(e) on the real channels (the
keys, not the queries: there are only L - N + D of them, and each padded tensor is written once):

    q' = [q, 1, 0...],  k' = [k sqrt(e'/e), sqrt(e') log m, 0...],  v' = [v, 0, 0...]
    q'.k' / sqrt(e') = q.k / sqrt(e) + log m

A caller that passes the softmax scale s itself (ComfyUI's `scale` keyword: attention_pytorch,
attention_sage's sm_scale) gets unscaled keys and the log-mass divided by s instead:
q'.k' s = s q.k + log m.

Three forms of the merged attention (`FORMS`; `choose_form` picks one per kernel):
    channel     the above: exact proportional attention, head e -> e'
    equal_mass  a balanced plan (MergePlan.balanced): every merged key of a tile stands for the same
                number of tokens, so log m is one constant that cancels from a softmax over merged
                image keys only: the same attention at head e (up to the tiles' differing n / k)
    plain       no mass: each merged key counts once, head e

Layout: (B, H, L, e) throughout (heads first, as every ComfyUI attention function takes it with
skip_reshape); `split_heads` / `join_heads` convert from and to (B, L, H e).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange

from .cost import padded_head
from .kernels import Kernel
from .plan import MergePlan

CHANNEL, EQUAL_MASS, PLAIN = "channel", "equal_mass", "plain"
FORMS = (CHANNEL, EQUAL_MASS, PLAIN)
"""The forms of the merged attention, from exact at a wider head to unweighted (module docstring)."""


def choose_form(kernel: Kernel | None, head: int, image_keys_only: bool) -> str:
    """The form a merged call at head size `head` runs on `kernel` (None: a kernel ToMA does not
    know, which never gets another head size). The channel where it costs no dearer bucket: the
    kernel's bucket of e' is e's, or the kernel has no buckets (matmuls: e'/e more work, 1.06x at
    128, for exact weights on every key); else equal_mass where every key of the call is a merged
    image key (the constant log m cancels); else plain."""
    if kernel is not None and (not kernel.buckets or kernel.cost_ratio(head, padded_head(head)) == 1):
        return CHANNEL
    return EQUAL_MASS if image_keys_only else PLAIN


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, H e) -> (B, H, L, e); (B, L, H, e) too, as ComfyUI's attention functions take it
    without skip_reshape (they reshape to (B, L, H, e) first: SD3's values come so, mmdit.split_qkv)."""
    if t.ndim == 4:
        return rearrange(t, "b l h e -> b h l e")
    return rearrange(t, "b l (h e) -> b h l e", h=heads)


def join_heads(t: torch.Tensor) -> torch.Tensor:
    """(B, H, L, e) -> (B, L, H e)."""
    return rearrange(t, "b h l e -> b l (h e)")


def merge_key_rows(t: torch.Tensor, plan: MergePlan, start: int) -> torch.Tensor:
    """Keys or values t (B|1, H, L, e) with the N image rows at [start, start + N) merged to the plan's
    D: (B, H, L - N + D, e). A key batch of 1 (shared keys) is expanded to the plan's batch."""
    n, heads = plan.num_tokens, t.shape[1]
    if t.shape[0] != plan.batch:
        t = t.expand(plan.batch, *t.shape[1:])
    span = plan.merge(rearrange(t[:, :, start:start + n], "b h n e -> b n (h e)"))
    span = rearrange(span, "b d (h e) -> b h d e", h=heads)
    if start == 0 and n == t.shape[2]:
        return span  # only image keys (Wan, Kandinsky 5, the UNet): nothing around them to copy
    return torch.cat([t[:, :, :start], span, t[:, :, start + n:]], dim=2)


def take_span(rows: torch.Tensor, dim: int, start: int, plan: MergePlan) -> torch.Tensor:
    """Per-token rows (rope tables, mask columns) along `dim`, batch 1 or B in dim 0: the N rows at
    [start, start + N) become their D destinations' rows (plan.take), the rows around them stay;
    a batch-1 table is expanded to the plan's batch where the destinations differ per sample."""
    n = plan.num_tokens
    span = plan.take(rows.narrow(dim, start, n), dim)
    head = rows.narrow(dim, 0, start)
    tail = rows.narrow(dim, start + n, rows.shape[dim] - start - n)
    if span.shape[0] != rows.shape[0]:
        head = head.expand(span.shape[0], *head.shape[1:])
        tail = tail.expand(span.shape[0], *tail.shape[1:])
    return torch.cat([head, span, tail], dim=dim)


def key_bias(plan: MergePlan, start: int, keys: int, like: torch.Tensor) -> torch.Tensor | None:
    """(B, L_k) log-mass of every one of the `keys` keys after merging (0 outside the D merged ones at `start`), in
    like's dtype and device; None for the no-op plan (nothing to weigh)."""
    bias = plan.size_bias()
    if bias is None:
        return None
    return F.pad(bias.to(like), (start, keys - start - bias.shape[1]))


def with_mass_channel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B|1, H, L_q, e), k / v (B, H, L_k, e), bias (B, L_k) -> the same with head size e' =
    padded_head(e), carrying bias in one channel (see the module docstring); the attention output's
    first e channels are the biased attention. scale: the softmax scale the caller hands the kernel
    (None: the kernel's own 1 / sqrt(e'))."""
    e = q.shape[-1]
    size = padded_head(e)
    ones = torch.ones(*q.shape[:-1], 1, dtype=q.dtype, device=q.device)
    q = torch.cat([q, ones, q.new_zeros(*q.shape[:-1], size - e - 1)], dim=-1)
    key_scale, mass_scale = (math.sqrt(size / e), math.sqrt(size)) if scale is None else (1.0, 1.0 / scale)
    column = (bias * mass_scale).to(k.dtype)[:, None, :, None].expand(-1, k.shape[1], -1, -1)
    k = torch.cat([k * key_scale if scale is None else k, column, k.new_zeros(*k.shape[:-1], size - e - 1)], dim=-1)
    return q, k, F.pad(v, (0, size - e))
