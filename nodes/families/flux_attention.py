"""Flux scope "attention": a double block merges its attention only.

The reference ToMA Flux code merges a double block's normed image tokens before the q/k/v
projections and unmerges the attention output before the output projection; norms, gates,
projections and the MLP stay at N tokens (the ToMA authors' released Flux code does this).
ComfyUI's DoubleStreamBlock offers no hook between those layers, but every attention call goes
through `transformer_options["optimized_attention_override"]`. So for one block call this module
puts an override there that, given the block's q, k, v (B, H, L, hd) after qk-norm and rope
(L = T + N [+ R], text first):

    q_m, k_m, v_m = [txt; M·img; ref] of each               (B, H, T + D [+ R], hd)
    out = attention(q_m, k_m, v_m, merged mask)              (B, T + D [+ R], H·hd)
    return [txt; U·out_img; ref]                             (B, L, H·hd)

Merging is linear and M's rows sum to 1, so M·(x W + b) = (M·x) W + b: merging q/k/v equals the
reference's merge before the projections, except that qk-norm and rope act per token before the
merge (a merged key averages its tokens' rotated keys instead of taking its destination's
position). Only the attention itself gets cheaper, so this scope trades speed for quality.
Single blocks keep merging whole, as in the reference. Another pack's override on the model
stays in charge of the kernel: it receives the merged q, k, v.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...toma_core import MergePlan
from ...toma_core.keys_values import merge_key_rows

Override = Callable[..., torch.Tensor]


def attention_options(options: dict | None, plan: MergePlan, text_len: int, mask: torch.Tensor | None) -> dict:
    """A copy of a block call's transformer_options whose attention runs on merged image tokens.

    plan: this call's plan over the N image tokens at [text_len, text_len + N) of the attention
    sequence. mask: the attention mask already merged to the T + D [+ R] layout (or None).
    """
    options = dict(options or {})
    options["optimized_attention_override"] = merged_attention(
        plan, text_len, mask, options.get("optimized_attention_override"),
    )
    return options


def merged_attention(plan: MergePlan, text_len: int, mask: torch.Tensor | None, inner: Override | None) -> Override:
    """An optimized_attention_override running `func` on q/k/v with the image span merged."""
    n = plan.num_tokens

    def override(func, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not kwargs.get("skip_reshape") or kwargs.get("skip_output_reshape") or q.shape[2] < text_len + n:
            raise ValueError(
                f"ToMA scope 'attention' expected Flux's (B, H, L, hd) attention with L >= {text_len + n} and a "
                f"(B, L, H*hd) output, got q of shape {tuple(q.shape)}; use scope 'block' for this model"
            )
        merged = [merge_key_rows(t, plan, text_len) for t in (q, k, v)]
        kwargs["mask"] = mask
        call = func if inner is None else lambda *a, **kw: inner(func, *a, **kw)
        out = call(*merged, heads, *args, **kwargs)
        return unmerge_rows(out, plan, text_len)

    return override


def unmerge_rows(out: torch.Tensor, plan: MergePlan, start: int) -> torch.Tensor:
    """Attention output (B, L - N + D, H·hd) back to L rows: the D merged rows at `start` become
    U·rows (N)."""
    d = plan.num_kept
    span = plan.unmerge(out[:, start:start + d])
    return torch.cat([out[:, :start], span, out[:, start + d:]], dim=1)
