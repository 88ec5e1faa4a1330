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

Reference tokens at timestep zero (reference method "index_timestep_zero" of
comfy.ldm.flux.model.Flux): the block modulates spans of its tokens differently, and ComfyUI hands
it those spans over the full sequence outside the replace args. A merged block then runs the real
block with the spans moved to the merged rows (`span_modulated`), so every token keeps its own
modulation.

With scope "attention", double blocks merge only their attention (flux_attention.py) and
single blocks merge whole, as the reference ToMA Flux code does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch

from ...toma_core import MergePlan
from ..contract import TOKENS_DIFFER, Unmerged, layout_changed
from ..machinery.dit_blocks import parse_flux_blocks
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_dit_hooks
from ..machinery.merge import add_key_bias, features, merge_mask, merge_rows, merge_span, unmerge_span
from ..machinery.skeleton import run_hook
from ..runtime import CallContext
from ..settings import ToMASettings
from .flux_attention import attention_options

log = logging.getLogger(__name__)

PLAN_SLOT = "flux"
"""One plan per forward: every Flux block sees the same h x w image grid."""

Block = Callable[[dict], dict]

SPAN_KEYWORDS = {"double": "modulation_dims_img", "single": "modulation_dims"}
"""The keyword argument of comfy.ldm.flux.layers.DoubleStreamBlock / SingleStreamBlock that holds
the modulation spans [(first row, end row, modulation index)] over the rows of args["img"]."""


def apply(model, settings: ToMASettings) -> DitAdapter:
    """Install the block hooks on `model` (a ModelPatcher clone); return the runtime adapter.

    Earlier ToMA hooks are replaced; a replacement another pack put on the same key stays
    outermost and ToMA merges only around the real block.
    """
    dm = model.get_model_object("diffusion_model")
    sizes = {"double": len(dm.double_blocks), "single": len(dm.single_blocks)}
    blocks = parse_flux_blocks(settings.blocks, sizes["double"], sizes["single"])
    install_dit_hooks(model, sizes, blocks, {"double": merged_double, "single": merged_single})
    return DitAdapter("flux", blocks.describe(), blocks.count, int(getattr(dm, "patch_size", 2)))


def merged_double(args: dict, extra: dict, block: Block) -> dict:
    """Double block: args img (B, N[+R], C), txt (B, T, C), pe (B, 1, T+N+R, hd/2, 2, 2)."""

    def merged(ctx: CallContext) -> dict | Unmerged:
        g = ctx.geometry
        img, text_len = args["img"], args["txt"].shape[1]
        if img.shape[1] != g.tokens + g.extra_tokens:
            return TOKENS_DIFFER
        if ctx.settings.scope == "attention":
            return _merged_attention(args, block, ctx, text_len, text_len + img.shape[1])
        return _merged_block(args, block, ctx, "double", 0, text_len, text_len + img.shape[1])

    return run_hook(args, extra, lambda: block(args), merged)


def merged_single(args: dict, extra: dict, block: Block) -> dict:
    """Single block: args img = [txt; img; ref] (B, T+N+R, C), pe (B, 1, T+N+R, hd/2, 2, 2)."""

    def merged(ctx: CallContext) -> dict | Unmerged:
        g = ctx.geometry
        seq = args["img"]
        text_len = seq.shape[1] - g.tokens - g.extra_tokens
        if text_len < 0:
            return TOKENS_DIFFER
        return _merged_block(args, block, ctx, "single", text_len, text_len, seq.shape[1])

    return run_hook(args, extra, lambda: block(args), merged)


def _merged_block(args: dict, block: Block, ctx: CallContext, group: str, start: int, text_len: int, length: int) -> dict | Unmerged:
    """Run `block` (of `group`, "double" or "single") on merged image tokens and unmerge its output.

    The N image tokens sit at [start, start+N) of args img and at [text_len, text_len+N) of the
    block's attention sequence of `length` tokens ([txt; img; ref]: the pe and attn_mask rows).
    A mask of another layout, or modulation spans that cannot follow the merge, run the block unmerged.
    """
    seq, n = args["img"], ctx.geometry.tokens
    prepared = _plan_and_mask(args, ctx, seq[:, start:start + n], text_len, length)
    if isinstance(prepared, Unmerged):
        return prepared
    plan, mask = prepared
    run = span_modulated(block, args, group, start, n, plan.num_kept)
    if isinstance(run, Unmerged):
        return run
    x, x_m, seq_m = merge_span(seq, start, n, plan)
    out = run(dict(args, img=seq_m, pe=merge_rows(args.get("pe"), 2, text_len, n, plan), attn_mask=mask))
    return dict(out, img=unmerge_span(out["img"], start, plan, x, x_m))


def _merged_attention(args: dict, block: Block, ctx: CallContext, text_len: int, length: int) -> dict | Unmerged:
    """Run a double block whose attention alone sees merged image tokens (scope "attention")."""
    prepared = _plan_and_mask(args, ctx, args["img"][:, :ctx.geometry.tokens], text_len, length)
    if isinstance(prepared, Unmerged):
        return prepared
    plan, mask = prepared
    return block(dict(args, transformer_options=attention_options(args.get("transformer_options"), plan, text_len, mask)))


def _plan_and_mask(args: dict, ctx: CallContext, image: torch.Tensor, text_len: int, length: int) -> tuple[MergePlan, torch.Tensor | None] | Unmerged:
    """This call's plan (built from `image` (B, N, C) if missing) and the block's attention mask
    merged to the T + D [+ R] layout, with the proportional-attention bias when enabled.
    Unmerged when the mask has another layout."""
    g = ctx.geometry
    plan = ctx.plan(PLAN_SLOT, g.height, g.width, lambda: features(image))
    mask = merge_mask(args.get("attn_mask"), plan, text_len, g.tokens, length)
    if isinstance(mask, Unmerged):
        return mask
    bias = plan.size_bias() if ctx.settings.proportional_attention else None
    return plan, add_key_bias(mask, bias, text_len, length - g.tokens + plan.num_kept, image.dtype)


def span_modulated(block: Block, args: dict, group: str, start: int, n: int, kept: int) -> Block | Unmerged:
    """`block`, or when its tokens' modulation differs by span, the real block with the spans moved.

    comfy.ldm.flux.model.Flux.forward_orig with reference method "index_timestep_zero" modulates
    the reference tokens with timestep zero: the vec the block receives holds two modulations, and
    the spans [(first, end, modulation index)] over args["img"]'s full rows reach the block as
    keyword arguments of ComfyUI's wrapper `original_block` (its `extra_kwargs`, read from its
    closure; comfy.ldm.flux.layers.apply_mod applies them), not through args. Merged rows under
    those spans would give reference rows the image's modulation, so the real block (the wrapper's
    `block`) runs with the spans moved: the N image rows at `start` become `kept` rows. Spans that
    cannot be read, or that start or end inside the image rows, run the block unmerged.
    """
    if not per_span_modulation(args["vec"], args["img"].shape[0]):
        return block
    keyword = SPAN_KEYWORDS[group]
    wrapped = closure(block)
    module, extra = wrapped.get("block"), wrapped.get("extra_kwargs")
    if not isinstance(module, torch.nn.Module) or not isinstance(extra, dict) or set(extra) != {keyword}:
        return layout_changed("per-span modulation (reference tokens at timestep zero) whose spans ToMA cannot read")
    spans = moved_spans(extra[keyword], start, n, kept)
    if spans is None:
        return layout_changed(f"{keyword} {extra[keyword]} cuts the image rows")
    return partial(_CALLS[group], module, {keyword: spans})


def per_span_modulation(vec, batch: int) -> bool:
    """Whether a block's `vec` modulates spans of its tokens differently: a tensor with more rows than
    the tokens' `batch` (comfy.ldm.flux.model.Flux doubles the timesteps), or a global modulation
    (comfy.ldm.flux.layers.ModulationOut, tuples of them) with more than one row on axis 1."""
    if isinstance(vec, torch.Tensor):
        return vec.shape[0] > batch
    if isinstance(vec, (tuple, list)):
        return any(per_span_modulation(v, batch) for v in vec)
    shift = getattr(vec, "shift", None)
    return isinstance(shift, torch.Tensor) and shift.ndim == 3 and shift.shape[1] > 1


def closure(fn) -> dict:
    """The variables a Python function closes over, by name ({} for anything else)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    try:
        return dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
    except ValueError:  # a variable not yet bound
        return {}


def moved_spans(spans, start: int, n: int, kept: int) -> list[tuple[int, int, int]] | None:
    """Spans [(first, end, index)] over rows whose N rows at `start` merge to `kept` rows, moved to
    the merged rows; None when one is malformed or starts or ends inside the N rows."""
    if not isinstance(spans, (tuple, list)) or not all(isinstance(s, (tuple, list)) and len(s) == 3 for s in spans):
        return None

    def move(row: int) -> int | None:
        if row <= start:
            return row
        return row - (n - kept) if row >= start + n else None

    moved = [(move(first), move(end), index) for first, end, index in spans]
    return None if any(first is None or end is None for first, end, _ in moved) else moved


def _call_double(module: torch.nn.Module, spans: dict, args: dict) -> dict:
    """A comfy.ldm.flux.layers.DoubleStreamBlock called as ComfyUI's wrapper calls it, with `spans`."""
    img, txt = module(
        img=args["img"], txt=args["txt"], vec=args["vec"], pe=args["pe"], attn_mask=args.get("attn_mask"),
        transformer_options=args.get("transformer_options"), **spans,
    )
    return {"img": img, "txt": txt}


def _call_single(module: torch.nn.Module, spans: dict, args: dict) -> dict:
    """A comfy.ldm.flux.layers.SingleStreamBlock called as ComfyUI's wrapper calls it, with `spans`."""
    img = module(
        args["img"], vec=args["vec"], pe=args["pe"], attn_mask=args.get("attn_mask"),
        transformer_options=args.get("transformer_options"), **spans,
    )
    return {"img": img}


_CALLS = {"double": _call_double, "single": _call_single}
