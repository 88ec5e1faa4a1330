"""Sparse and radial attentions that need a self-attention's every key, found in the attention chain
of a call scope keys_values would merge (attention_interface.py `enter`). Each runs only on calls
whose q, k and v have one shape, so merged keys would turn it off without a word; in the blocks where
it would run, ToMA merges nothing and says so on the run line, and everywhere else both apply (the
sparse method hands ToMA's merged call on to the dense kernel, as it does cross-attention).

- ComfyUI's "Model Sparse Attention" (comfy_extras/nodes_sparse_attention.py, BlockSparseAttention,
  Comfy-Org/ComfyUI@01dafad): an optimized_attention_override, `make_attention_override.<locals>.override`,
  chained over the previous one (its closure's `previous`) and re-installed each step. It goes sparse
  unless a mask is set, in VSA mode, when its `SparseAttnPatch.dense_reason` (sigma window,
  min_tokens, dense_blocks) names a reason, or when its `_ineligible` does (CUDA and kernel, dtype,
  head size 128, q / k / v of one shape); ToMA asks those, and without them reads the published
  contract (head 128, one shape, >= 12,288 tokens).
- ComfyUI-RadialAttn (woct0rdho/ComfyUI-RadialAttn@effd401 nodes.py): no override; inside its step
  window its model-function wrapper puts `maybe_radial_attn` in place of comfy.ldm.wan.model's
  optimized_attention, which from block `dense_block` on calls `get_radial_attn_func.<locals>.radial_attn_func`,
  a wrap_attn function: wrap_attn hands it to the override as the kernel. It treats q.shape != k.shape
  as cross-attention and runs ComfyUI's dense attention then.

Both are recognised by the qualified name of the function (and the module's last name for the
sparse node, loaded by ComfyUI under a path-derived module name), never by their objects.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..contract import Unmerged
from ..run.runtime import compiling

SPARSE_MODULE = "nodes_sparse_attention"
SPARSE_QUALNAME = "make_attention_override.<locals>.override"
RADIAL_QUALNAME = "get_radial_attn_func.<locals>.radial_attn_func"

SPARSE_HEAD = 128
SPARSE_MIN_TOKENS = 12288
"""Model Sparse Attention's head size and default min_tokens (nodes_sparse_attention.py HEAD_DIM, the node's input)."""

SPARSE_ASIDE = Unmerged("Model Sparse Attention runs this self-attention sparse on every key: ToMA keys_values steps aside")
RADIAL_ASIDE = Unmerged("RadialAttn runs this self-attention on every key: ToMA keys_values steps aside")
RADIAL_BLOCK = Unmerged("RadialAttn runs this block's attention on the video's own token layout: ToMA's block merge steps aside")
RADIAL_SWAP = "maybe_radial_attn"
"""The function RadialAttn puts in place of comfy.ldm.wan.model.optimized_attention inside its step window."""

LINKS = ("inner", "previous")
"""Where a chained override keeps the one it hands calls on to: ToMA's `inner` attribute, the sparse
node's closure variable `previous`."""


def _module_name(obj: Any) -> str:
    return re.split(r"[./\\]", getattr(obj, "__module__", None) or "")[-1]


def is_sparse_override(obj: Any) -> bool:
    return getattr(obj, "__qualname__", None) == SPARSE_QUALNAME and _module_name(obj) == SPARSE_MODULE


def is_radial_kernel(func: Any) -> bool:
    return getattr(func, "__qualname__", None) == RADIAL_QUALNAME


def _closure(func: Any) -> dict[str, Any]:
    """A function's closure variables by name; none while torch.compile traces (Dynamo cannot trace a
    read of another function's cells): the sparse node is then found only as ToMA's own `inner` and
    judged by its published contract."""
    if compiling():
        return {}
    code, cells = getattr(func, "__code__", None), getattr(func, "__closure__", None) or ()
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in cells))) if code is not None else {}


def chain(override: Any) -> Iterator[Any]:
    """`override` and the overrides it hands calls on to, as far as their links (LINKS) tell."""
    for _ in range(16):
        if override is None:
            return
        yield override
        links = {name: getattr(override, name, None) for name in LINKS} | _closure(override)
        override = next((links[name] for name in LINKS if links.get(name) is not None), None)


def sparse_would_run(override: Callable, q, k, v, heads: int, kwargs: dict) -> bool:
    """Whether Model Sparse Attention's `override` would run this unmerged call sparse, by its own
    tests where it has them (see the module docstring)."""
    patch = _closure(override).get("patch")
    if kwargs.get("mask") is not None or getattr(patch, "vsa", False):
        return False
    heads_first = bool(kwargs.get("skip_reshape"))
    tokens = q.shape[2] if heads_first else q.shape[1]
    options = kwargs.get("transformer_options") or {}
    dense_reason = getattr(patch, "dense_reason", None)
    if dense_reason is not None and dense_reason(options, tokens, options.get("block_index")) is not None:
        return False
    if dense_reason is None and tokens < SPARSE_MIN_TOKENS:
        return False
    qs, ks, vs = (t.transpose(1, 2) if heads_first else t.unflatten(-1, (heads, -1)) for t in (q, k, v))
    ineligible = getattr(override, "__globals__", {}).get("_ineligible")
    if ineligible is not None:
        return ineligible(qs, ks, vs, qs.shape[-1]) is None
    return qs.shape[-1] == SPARSE_HEAD and q.shape == k.shape == v.shape


def step_aside_reason(kernel: Callable, inner: Any, q, k, v, heads: int, kwargs: dict) -> Unmerged | None:
    """Why ToMA leaves this self-attention's keys whole (a sparse or radial attention runs it on
    every key), or None: it merges."""
    if is_radial_kernel(kernel):
        return RADIAL_ASIDE
    if any(is_sparse_override(o) and sparse_would_run(o, q, k, v, heads, kwargs) for o in chain(inner)):
        return SPARSE_ASIDE
    return None


def radial_runs_block(options: dict | None) -> bool:
    """Whether RadialAttn runs this Wan block's self-attention radial (for scope block, whose merged
    tokens its radial mask, laid out over the video's frames, cannot take): its options are in the
    block's transformer_options ("radial_attn"), comfy.ldm.wan.model's optimized_attention is its
    `maybe_radial_attn` (inside its step window), and the block is at or past its `dense_block`."""
    radial = (options or {}).get("radial_attn")
    if not isinstance(radial, dict):
        return False
    current = getattr(sys.modules.get("comfy.ldm.wan.model"), "optimized_attention", None)
    if getattr(current, "__qualname__", "").rsplit(".", 1)[-1] != RADIAL_SWAP:
        return False
    return options.get("block_index", -1) >= radial.get("dense_block", 0)
