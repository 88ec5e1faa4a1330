"""ToMA for the Flux family (Flux.1 dev/schnell, Fill, Kontext; Chroma, Chroma Radiance).

Each selected block gets a `patches_replace["dit"]` entry. Inside, for a merged call:

    x = image tokens (B, N, C) of the block input, N = h * w (the main latent grid only)
    x_m = plan.merge(x)                                   (B, D, C)
    out = block([txt;] x_m [; ref], pe with destination rows, attn_mask with destination rows)
    y = plan.unmerge_residual(x, x_m, out_image_part)     (B, N, C) = x + U(block(Mx) - Mx)

Text tokens and Kontext reference tokens pass through untouched, with their pe rows; merged
tokens take their destination's pe rows (plan.take on the pe token axis). Every hook returns N
image tokens, so ControlNet residuals and step caches keep working. The hooks only say where the
image tokens and per-token tables are (`double_span`, `single_span`) and merge the attention mask
(`merged_mask`: `merge_mask`, and `add_key_bias` for proportional attention); the merged run is the one
every DiT family shares (machinery/runner.py): the plan is built by the first merged block of
a forward from a parameter-free LayerNorm of its image tokens and reused by the other blocks. All
per-step decisions are made eagerly in wrappers.apply_model_wrapper; the hooks only read the
CallContext.

Single blocks add to their input in place (`x += ...`): the hook always passes a freshly
concatenated tensor and keeps its own merged tokens for the delta.

Reference tokens at timestep zero (reference method "index_timestep_zero" of
comfy.ldm.flux.model.Flux): the block modulates spans of its tokens differently, and ComfyUI hands
it those spans over the full sequence as a keyword of the block's forward, outside the replace
args. A merged run of such a block carries its row move in a copy of transformer_options (which
ComfyUI's wrapper passes on to the block), and an object patch of each selected block's forward
(machinery/spans.py `span_forward`) moves the spans to the merged rows, so every token keeps its
own modulation; spans it cannot move run the block unmerged, with the layout reason.

With scope "attention", double blocks merge only their attention (flux_attention.py) and
single blocks merge whole, as the reference ToMA Flux code does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from ...toma_core import MergePlan
from ..contract import TOKENS_DIFFER, Unmerged, layout_changed
from ..machinery.dit_blocks import parse_flux_blocks
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_dit_hooks, install_forward_patches
from ..machinery.keys_values import Keys
from ..machinery.runner import (
    ImageSpan,
    Rows,
    image_plan,
    merge_rows,
    merged_dit_block,
    run_hook,
)
from ..machinery.spans import RowMove, moved_keyword, span_forward, with_move
from ..run.runtime import CallContext
from ..settings import ToMASettings
from .flux_attention import attention_options

log = logging.getLogger(__name__)

PLAN_SLOT = "flux"
"""One plan per forward: every Flux block sees the same h x w image grid."""

Block = Callable[[dict], dict]
"""A dit replace key's `original_block`: args -> the block's outputs."""

SPAN_KEYWORDS = {"double": "modulation_dims_img", "single": "modulation_dims"}
"""The keyword argument of comfy.ldm.flux.layers.DoubleStreamBlock / SingleStreamBlock that holds
the modulation spans [(first row, end row, modulation index)] over the rows of args["img"]."""

SPANS = "per-span modulation"
"""What the layout reasons of spans that cannot follow the merge name; CUT: the one of a boundary
inside the image rows, the same for every block (their boundaries differ by the text length)."""
CUT = "{name} whose spans cut the image rows"


def apply(model, settings: ToMASettings) -> DitAdapter:
    """Install the block hooks on `model` (a ModelPatcher clone); return the runtime adapter.

    Earlier ToMA hooks are replaced; a replacement another pack put on the same key stays
    outermost and ToMA merges only around the real block. On a model with global modulation
    (Flux.2) the selected blocks' forwards move the modulation spans of a merged run
    (SPAN_KEYWORDS): ComfyUI 0.33 runs timestep-zero references only there (on a Flux.1 layout
    `index_timestep_zero` fails in comfy.ldm.flux.layers.apply_mod, unpatched). Other Flux models
    keep their blocks' forwards untouched, which per-block compile nodes that replace the block
    modules rely on (KJNodes' TorchCompileModelFluxAdvanced); a per-span run on a block without
    the patch would be caught (machinery/spans.py NOT_MOVED) and run unmerged.
    """
    dm = model.get_model_object("diffusion_model")
    sizes = {"double": len(dm.double_blocks), "single": len(dm.single_blocks)}
    blocks = parse_flux_blocks(settings.blocks, sizes["double"], sizes["single"])
    double = merged_attention if settings.scope == "attention" else merged_double
    install_dit_hooks(model, sizes, blocks, {"double": double, "single": merged_single})
    spans = bool(getattr(getattr(dm, "params", None), "global_modulation", False))
    paths = {f"{group}_blocks.{i}": (group, spans and blocks.selects(group, i)) for group, count in sizes.items() for i in range(count)}
    install_forward_patches(
        model, {path: selected for path, (_, selected) in paths.items()},
        lambda path, foreign: span_forward(dm.get_submodule(path), foreign, partial(moved_keyword, keyword=SPAN_KEYWORDS[paths[path][0]], name=SPANS, cut=CUT)),
    )
    return DitAdapter("flux", blocks.describe(), blocks.count, int(getattr(dm, "patch_size", 2)))


def double_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Double block: args img (B, N[+R], C) (the image first), txt (B, T, C), pe (B, 1, T+N+R, hd/2, 2, 2).
    img holds N rows alone when the R reference rows come as cached keys instead (cached_references)."""
    g, img, text_len = ctx.geometry, args["img"], args["txt"].shape[1]
    images = g.tokens + g.extra_tokens
    if img.shape[1] != images and not cached_references(args, g.extra_tokens, text_len + img.shape[1], text_len + images):
        return TOKENS_DIFFER
    return image_span(args, ctx, 0, text_len, text_len + images, text_len + img.shape[1])


def single_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Single block: args img = [txt; img; ref] (B, T+N+R, C), pe (B, 1, T+N+R, hd/2, 2, 2); [txt; img]
    alone when the references come as cached keys (cached_references: T is then read from pe)."""
    g, seq = ctx.geometry, args["img"]
    refs = g.extra_tokens
    rows = seq.shape[1] + (refs if cached_references(args, refs, seq.shape[1], seq.shape[1] + refs) else 0)
    text_len = rows - g.tokens - refs
    if text_len < 0:
        return TOKENS_DIFFER
    return image_span(args, ctx, text_len, text_len, rows, seq.shape[1])


def cached_references(args: dict, refs: int, tokens: int, rows: int) -> bool:
    """Whether a block of `tokens` tokens gets its R = `refs` reference tokens as cached keys: pe
    holds `rows` = tokens + R rows (the reference rows last) and the call carries reference images
    (transformer_options["reference_image_num_tokens"], comfy.ldm.flux.model.Flux._forward). ComfyUI
    0.33's Flux KV Cache node (comfy_extras/nodes_flux.py FluxKVCache) strips them from the image
    once their keys are cached and appends those keys in an attn1 patch, before every attention."""
    pe, options = args.get("pe"), args.get("transformer_options") or {}
    return (refs > 0 and pe is not None and pe.ndim > 2 and pe.shape[2] == rows == tokens + refs
            and sum(options.get("reference_image_num_tokens", ())) == refs)


def image_span(args: dict, ctx: CallContext, start: int, text_len: int, length: int, queries: int | None = None) -> ImageSpan:
    """The N image tokens at [start, start+N) of args img and at [text_len, text_len+N) of the
    block's attention sequence of `length` tokens ([txt; img; ref]: the pe and attn_mask rows), of
    which the block's own `queries` (default: all; fewer when the references come as cached keys).
    Besides the pe rows, a merged run gets the attention mask merged (with the proportional-attention
    bias when enabled) and, under per-span modulation, its row move for the block's forward patch
    (machinery/spans.py); a mask of another layout runs the block unmerged."""
    n, seq = ctx.geometry.tokens, args["img"]

    def more(plan: MergePlan) -> dict | Unmerged:
        mask = merged_mask(args, ctx, plan, text_len, length, seq.dtype)
        if isinstance(mask, Unmerged):
            return mask
        if not per_span_modulation(args["vec"], seq.shape[0]):
            return {"attn_mask": mask}
        return {"attn_mask": mask, "transformer_options": with_move(args.get("transformer_options"), RowMove.of(plan, start))}

    return ImageSpan(start, (Rows("pe", 2, text_len),), length, more=more, tokens=n, keys=Keys(text_len, queries or length))


def merged_mask(args: dict, ctx: CallContext, plan: MergePlan, text_len: int, length: int, dtype: torch.dtype) -> torch.Tensor | None | Unmerged:
    """The block's attention mask merged to the T + D [+ R] layout, with the proportional-attention
    bias when enabled; Unmerged when the mask has another layout."""
    n = ctx.geometry.tokens
    mask = merge_mask(args.get("attn_mask"), plan, text_len, length)
    if isinstance(mask, Unmerged):
        return mask
    bias = plan.size_bias() if ctx.settings.proportional_attention else None
    return add_key_bias(mask, bias, text_len, length - n + plan.num_kept, dtype)


def merge_mask(mask: torch.Tensor | None, plan: MergePlan, start: int, length: int) -> torch.Tensor | None | Unmerged:
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
    rows = merge_rows(mask, mask.ndim - 2, start, plan)
    return merge_rows(rows, rows.ndim - 1, start, plan)


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


def merged_attention(args: dict, extra: dict, block: Block) -> dict:
    """A double block whose attention alone sees merged image tokens (scope "attention")."""

    def merged(ctx: CallContext) -> dict | Unmerged:
        span = double_span(args, ctx)
        if isinstance(span, Unmerged):
            return span
        text_len = args["txt"].shape[1]
        plan = image_plan(ctx, PLAN_SLOT, args["img"][:, :ctx.geometry.tokens])
        mask = merged_mask(args, ctx, plan, text_len, span.length, args["img"].dtype)
        if isinstance(mask, Unmerged):
            return mask
        return block(dict(args, transformer_options=attention_options(args.get("transformer_options"), plan, text_len, mask)))

    return run_hook(args, extra, lambda: block(args), merged)


merged_double = merged_dit_block(PLAN_SLOT, double_span)
merged_single = merged_dit_block(PLAN_SLOT, single_span)


def per_span_modulation(vec, batch: int) -> bool:
    """Whether a block's `vec` modulates spans of its tokens differently: a tensor with more rows than
    the tokens' `batch` (comfy.ldm.flux.model.Flux doubles the timesteps), or a global modulation
    (comfy.ldm.flux.layers.ModulationOut, tuples of them) with more than one row on axis 1. The
    block then receives the spans [(first, end, modulation index)] over args["img"]'s rows as its
    SPAN_KEYWORDS keyword (comfy.ldm.flux.layers.apply_mod applies them): a merged run has its
    forward patch move them."""
    if isinstance(vec, torch.Tensor):
        return vec.shape[0] > batch
    if isinstance(vec, (tuple, list)):
        return any(per_span_modulation(v, batch) for v in vec)
    shift = getattr(vec, "shift", None)
    return isinstance(shift, torch.Tensor) and shift.ndim == 3 and shift.shape[1] > 1
