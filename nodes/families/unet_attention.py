"""UNet scope "attention": merging only inside the attention calls, through the attn1/attn2
patch points, composable with every other UNet patch. attn1 runs on D queries,
keys and values; attn2 on D queries against the full text context; the outputs are unmerged
before the residual add. The FF and norms stay at N tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...toma_core import MergePlan
from ..machinery.hooks import is_toma, mark
from ..run.current import find_call
from ..run.wrappers import transformer_options_of
from ..settings import TOMA_KEY
from .unet_blocks import BlockId
from .unet_sites import level_plan, level_veto

_ATTN_PATCHES = ("attn1_patch", "attn1_output_patch", "attn2_patch", "attn2_output_patch")


REPLACE_KEY = f"{TOMA_KEY}_attn_replace"
"""transformer_options key (and wrapper key): the call's attn1/attn2 replace dicts, for the
attention patches, whose extra_options lack "patches_replace"."""


def install_attention_patches(model, selected: frozenset[BlockId]) -> None:
    """Add ToMA's four attention patches; they act only in the `selected` UNet blocks."""
    import comfy.patcher_extension

    model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, REPLACE_KEY, expose_attention_replace)
    model.set_model_attn1_patch(mark(make_attn_in(selected, self_attention=True), "attention"))
    model.set_model_attn1_output_patch(mark(make_attn_out(count=True), "attention"))
    model.set_model_attn2_patch(mark(make_attn_in(selected, self_attention=False), "attention"))
    model.set_model_attn2_output_patch(mark(make_attn_out(count=False), "attention"))


def expose_attention_replace(executor, *args, **kwargs):
    """APPLY_MODEL wrapper: copy the call's attn1/attn2 replace dicts to transformer_options[REPLACE_KEY]
    (eagerly, outside the diffusion model), so the attention patches can leave those blocks alone.

    args: apply_model's (see run/wrappers.py transformer_options_of).
    """
    args = list(args)
    options, put_back = transformer_options_of(args, kwargs)
    if isinstance(options, dict):
        replace = options.get("patches_replace", {})
        options = dict(options)
        options[REPLACE_KEY] = {name: replace[name] for name in ("attn1", "attn2") if replace.get(name)}
        put_back(options)
    return executor(*args, **kwargs)


def remove_own_attention_patches(model) -> None:
    """Drop earlier ToMA attention patches (and their wrapper) from the clone (lists copied, never shared)."""
    import comfy.patcher_extension

    model.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, REPLACE_KEY)
    options = model.model_options.get("transformer_options", {})
    patches = options.get("patches")
    if not patches:
        return
    patches = dict(patches)
    for name in _ATTN_PATCHES:
        if name in patches:
            patches[name] = [p for p in patches[name] if not is_toma(p)]
    options["patches"] = patches


def _attention_plan(selected: frozenset[BlockId], n: torch.Tensor, extra: dict, count: bool) -> MergePlan | None:
    """The level plan for an attention patch in a selected, mergeable block; None to leave it.

    count: record a block left unmerged for a reason (once per block: on the attn1 side).
    """
    block = extra.get("block")
    if block is None or (block[0], int(block[1])) not in selected:
        return None
    ctx = find_call({"transformer_options": extra})
    if ctx is None or not ctx.merge:
        return None
    veto = level_veto(ctx, n, extra, extra.get(REPLACE_KEY))
    if veto is not None:
        if count:
            ctx.record_block(False, veto.reason)
        return None
    return level_plan(ctx, n, extra)


PLAN_EXTRA_KEY = "comfyui_toma_plan"
"""extra_options key: the plan an attn*_patch merged with, read by the matching output patch
(ComfyUI passes one extra_options dict to every patch of a block run)."""


def make_attn_in(selected: frozenset[BlockId], self_attention: bool) -> Callable:
    """attn1_patch / attn2_patch: (n (B, N, C), context, value, extra) -> (n_m (B, D, C), context, value).

    Self-attention: keys and values are merged too when they are the queries' tokens (they are,
    unless an earlier patch replaced them). Cross-attention: only the queries are merged.
    """

    def toma_attn_in(n: torch.Tensor, context: Any, value: Any, extra: dict):
        plan = _attention_plan(selected, n, extra, count=self_attention)
        extra[PLAN_EXTRA_KEY] = plan
        if plan is None:
            return n, context, value
        n_m = plan.merge(n)
        if self_attention:
            context = n_m if context is n else context
            value = n_m if value is n else value
        return n_m, context, value

    return toma_attn_in


def make_attn_out(count: bool) -> Callable:
    """attn1_output_patch / attn2_output_patch: (out (B, D, C), extra) -> U out (B, N, C).

    count: record the block run (once per block: on the attn1 side).
    """

    def toma_attn_out(out: torch.Tensor, extra: dict) -> torch.Tensor:
        plan = extra.pop(PLAN_EXTRA_KEY, None)
        if plan is None or out.ndim != 3 or out.shape[1] != plan.num_kept:
            return out
        if count:
            ctx = find_call({"transformer_options": extra})
            if ctx is not None:
                ctx.record_block(True)
        return plan.unmerge(out)

    return toma_attn_out
