"""A CPU stand-in for ComfyUI's "Model Sparse Attention" node, written from its published source
(Comfy-Org/ComfyUI@01dafad3aa6ccf46e7b6f8b7b61a8138cd8b0261 comfy_extras/nodes_sparse_attention.py),
under the same module name so that the pack recognises it as it does the real one (by the module's
last name and the override's qualified name, nodes/machinery/foreign_attention.py).

Kept from the source: an optimized_attention_override made by `make_attention_override(patch,
previous)` that hands every call it declines to `previous` (or ComfyUI's kernel); `install_override`
puts it on top of whatever override is in the transformer_options, at patch time and again from
ON_PREPARE_STATE each step; it stays dense for a mask, in VSA mode, outside its sigma window, under
min_tokens, on a dense block (`SparseAttnPatch.dense_reason`), and unless q, k and v are of one shape
with head size 128 (`_ineligible`). Left out: the sol_attn kernel (CUDA only; here the sparse path
runs exact attention and counts the call) and its CUDA and kernel-availability tests (this machine
has no GPU), MiniMax-H3's block patches and sinks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

HEAD_DIM = 128


class SparseAttnPatch:
    """The node's options and a record of each call: "sparse" (the kernel ran) or the dense reason."""

    def __init__(self, sigma_start: float, sigma_end: float, min_tokens: int, dense_blocks: frozenset = frozenset(), vsa: bool = False) -> None:
        self.sigma_start, self.sigma_end = sigma_start, sigma_end
        self.min_tokens, self.dense_blocks, self.vsa = min_tokens, dense_blocks, vsa
        self.installed: set = set()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def dense_reason(self, transformer_options: dict, tokens: int, block_index: int | None) -> str | None:
        sigmas = transformer_options.get("sigmas")
        if sigmas is not None:
            sigma = float(sigmas[0])
            if sigma > self.sigma_start or sigma < self.sigma_end:
                return "sigma outside the window"
        if tokens < self.min_tokens:
            return "under min_tokens"
        if block_index is not None and block_index in self.dense_blocks:
            return "dense block"
        return None


def _ineligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dim_head: int) -> str | None:
    """q / k / v (B, L, H, e): the source's tests less the CUDA and kernel ones."""
    if dim_head != HEAD_DIM:
        return "head_dim"
    if q.shape != k.shape or q.shape != v.shape:
        return "cross-attention or GQA (kept dense)"
    return None


def make_attention_override(patch: SparseAttnPatch, previous: Any):
    def override(func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs):
        transformer_options = kwargs.get("transformer_options") or {}

        def dense(reason: str):
            patch.calls.append((reason, tuple(k.shape)))
            kw = dict(mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape, **kwargs)
            return func(q, k, v, heads, **kw) if previous is None else previous(func, q, k, v, heads, **kw)

        if mask is not None or patch.vsa:
            return dense("mask or vsa")
        tokens = q.shape[2] if skip_reshape else q.shape[1]
        reason = patch.dense_reason(transformer_options, tokens, transformer_options.get("block_index"))
        if reason is not None:
            return dense(reason)
        if skip_reshape:
            b, _, _, dim_head = q.shape
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
        else:
            b, _, dim_head = q.shape
            dim_head //= heads
            qs, ks, vs = (t.view(b, -1, heads, dim_head) for t in (q, k, v))
        reason = _ineligible(qs, ks, vs, dim_head)
        if reason is not None:
            return dense(reason)
        patch.calls.append(("sparse", tuple(k.shape)))
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (qs, ks, vs)), scale=kwargs.get("scale"))
        return out if skip_output_reshape else out.transpose(1, 2).reshape(b, -1, heads * dim_head)

    return override


def install_override(patch: SparseAttnPatch, transformer_options: dict) -> None:
    current = transformer_options.get("optimized_attention_override")
    if current in patch.installed:
        return
    override = make_attention_override(patch, current)
    patch.installed.add(override)
    transformer_options["optimized_attention_override"] = override


def apply_block_sparse_attention(model: Any, start_percent: float, end_percent: float, min_tokens: int) -> tuple[Any, SparseAttnPatch]:
    import comfy.patcher_extension

    sampling = model.get_model_object("model_sampling")
    patch = SparseAttnPatch(float(sampling.percent_to_sigma(start_percent)), float(sampling.percent_to_sigma(end_percent)), min_tokens)
    m = model.clone()
    install_override(patch, m.model_options["transformer_options"])

    def reinstall(model_patcher: Any, timestep: Any, model_options: dict | None = None) -> None:
        if model_options is not None:  # ComfyUI 0.3.64's prepare_state passes none: the patch-time install stands
            install_override(patch, model_options["transformer_options"])

    m.add_callback_with_key(comfy.patcher_extension.CallbacksMP.ON_PREPARE_STATE, "block_sparse_attention", reinstall)
    return m, patch
