"""Where scope keys_values' override (keys_values.py `KeysValuesOverride`) meets ComfyUI's attention
dispatch, comfy.ldm.modules.attention `wrap_attn`, as ComfyUI 0.33 and the newest ComfyUI
(Comfy-Org/ComfyUI@05080f6022b2572df36a0aa6bcba413209c3d265) define it:

- preferred_attention (newest only): a layer passes its `ComfyAttention` module
  (`preferred_attention=self.comfy_attention`: UNet CrossAttention, WanSelfAttention, ...; its
  `function` is comfy-kitchen int8 when the checkpoint's metadata asks for it, else None). wrap_attn
  pops it before anything else and runs it only when no override is set: an override is handed the
  default kernel instead. The module lives on only in wrap_attn's own frame, so `preferred_kernel`
  reads it there and the override runs the call (merged or not) on the layer's kernel.
- AttentionTensorContainer: q / k / v may come boxed. wrap_attn hands an override without a
  `container_function` attribute the plain tensors, which the merge needs; `container_function`
  exists on ToMA's override only where the override it chains to has one (ModelPatcher's
  set_model_optimized_attention copies the int8 kernel's prequantizing path there), and sends
  the merged tensors on through it, boxed again.
- scale: the caller's softmax scale stays in the keyword arguments the kernel receives; the log-mass
  channel's math honours it (toma_core/keys_values.py with_mass_channel).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from ..run.runtime import compiling
from .foreign_attention import step_aside_reason

DISPATCH_LOCALS = ("preferred_attention", "optimized_attention_override")
"""Local names of wrap_attn's `wrapper` that tell its frame from any other `wrapper` on the stack."""

DEPTH = 12
"""Frames searched above the override for wrap_attn's: the override itself, chained overrides of other
packs above it (Model Sparse Attention installed after ToMA, a recorder), wrap_attn."""


def dispatch_frame() -> dict[str, Any] | None:
    """The local variables of the nearest comfy.ldm.modules.attention wrap_attn `wrapper` frame
    calling this override (its popped `preferred_attention`, its default kernel `func`); None
    outside one, or while torch.compile traces (a frame read would break its graph)."""
    if compiling():
        return None
    frame = sys._getframe(1)
    for _ in range(DEPTH):
        frame = frame.f_back
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == "wrapper" and all(name in code.co_varnames for name in DISPATCH_LOCALS):
            return frame.f_locals
    return None


def preferred_kernel(func: Callable) -> Callable:
    """The calling layer's preferred kernel (its ComfyAttention's `function`) where wrap_attn popped
    one that is set and `func` is the default kernel wrap_attn handed out (an override above ToMA that
    chose another kernel keeps its choice); else `func` (ComfyUI 0.33 and 0.3.64 have no
    preferred_attention)."""
    frame = dispatch_frame() or {}
    function = getattr(frame.get("preferred_attention"), "function", None)
    return function if function is not None and func is frame.get("func") else func


def enter(override: Any, func: Callable, q, k, v, heads: int, kwargs: dict) -> Callable:
    """What KeysValuesOverride.__call__ does first: the kernel its call runs on (`preferred_kernel`),
    and, for the call it would merge, whether it steps aside for a sparse or radial attention that
    needs every key (foreign_attention.py): then it merges nothing in this block and records why
    (`override.aside`, counted on the run line)."""
    kernel = preferred_kernel(func)
    if override.pending is not None:
        reason = step_aside_reason(kernel, override.inner, q, k, v, heads, kwargs)
        if reason is not None:
            override.aside, override.pending = reason, None
    return kernel


def container_function(override: Any) -> Callable:
    """The `container_function` of ToMA's override (a property: absent, AttributeError, unless the
    override it chains to has one, so that wrap_attn's `hasattr` sends containers here only then)."""
    inner = getattr(override.inner, "container_function", None)
    if inner is None:
        raise AttributeError("container_function")
    return partial(_through_containers, override, inner)


def _through_containers(override: Any, inner: Callable, q, k, v, heads: int, *args, **kwargs):
    """Containers in: the override merges the taken tensors and hands its call to the chained
    override's container path, the merged tensors boxed again in the caller's container class."""
    box = type(q)

    def chained(func, q, k, v, heads, *a, **kw):
        return inner(box(q), box(k), box(v), heads, *a, **kw)

    chained.__wrapped__ = override.inner
    own, override.inner = override.inner, chained
    try:
        func = (dispatch_frame() or {}).get("func")
        return override(func, q.take(), k.take(), v.take(), heads, *args, **kwargs)
    finally:
        override.inner = own
