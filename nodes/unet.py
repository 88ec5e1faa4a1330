"""ToMA for UNet models: SDXL, SD1.x, SD2.x and their fine-tunes (issue 4).

ComfyUI has no patch point around a whole `BasicTransformerBlock` (attn1 + attn2 + FF), so scope
"block" object-patches the `forward` of each selected block through the ModelPatcher
(`add_object_patch`: applied when the model loads, restored when another clone loads; other
clones stay bit-identical). For a merged call the replacement does (ToMA §3.3, DESIGN §1.4):

    x = block input (B, N, C), N = h * w from transformer_options["activations_shape"]
    x_m = plan.merge(x)                                   (B, D, C)
    y_m = BasicTransformerBlock.forward(block, x_m, ...)  the class's own forward, so other
                                                          packs' attn1/attn2 patches still run
    y = plan.unmerge_residual(x, x_m, y_m)                (B, N, C) = x + U(y_m - x_m)

UNet blocks carry no positional embedding, so merged tokens need nothing else. The plan of a
resolution level is built by the first merged block at that level in a forward and reused by
every later block at the same h x w (the per-call plan cache of runtime.CallContext; one plan
per level per selection epoch). Destinations are per sample (cond and uncond differ).

Scope "attention" (issue 4 point 2) merges only inside the attention calls through the
attn1/attn2 patch points, composable with every other UNet patch: attn1 runs on D queries, keys
and values; attn2 on D queries against the full text context; the outputs are unmerged before
the residual add. The FF and norms stay at N tokens, so the speed-up is small where the FF
dominates (SDXL's 1/4 level).

All per-step decisions are made eagerly by runtime.apply_model_wrapper; the hooks read the
CallContext and only add tensor work (issue 7 point 5).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..toma_core import MergePlan
from .runtime import CallContext, CallGeometry, find_call, note_orphan
from .settings import TOMA_KEY, ToMASettings
from .unet_blocks import BlockId, UNetBlockSpec, parse_unet_blocks

log = logging.getLogger(__name__)

PLAN_SLOT = "unet"
"""Plan cache slot; the cache key adds the level's h x w, so this is one plan per level."""

TOMA_MARK = "toma_unet_site"
"""Attribute set on our object-patch functions (re-applying ToMA replaces, never stacks)."""


@dataclass(frozen=True)
class TransformerSite:
    """One BasicTransformerBlock of the UNet.

    path: module path below the diffusion model, e.g. "input_blocks.4.1.transformer_blocks.0".
    block: ComfyUI's block id ("input", 4) as in transformer_options["block"]; depth: index in
    its SpatialTransformer stack (transformer_options["block_index"]); downsample: how many times
    smaller than the latent its level is (1, 2, 4, ...).
    """

    path: str
    block: BlockId
    depth: int
    downsample: int
    module: torch.nn.Module

    @property
    def patch_key(self) -> str:
        return f"diffusion_model.{self.path}.forward"


@dataclass(frozen=True)
class UNetAdapter:
    """The runtime's view of a patched UNet (see runtime.FamilyAdapter)."""

    family: str
    blocks: str
    num_blocks: int

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Latent grid H x W of x (B, C, H, W) and T of context (B, T, C_txt). Each transformer
        level has its own smaller grid, read per block from activations_shape."""
        text_len = int(context.shape[1]) if torch.is_tensor(context) and context.ndim == 3 else None
        if x.ndim != 4:
            return CallGeometry(1, 1, text_len, 0, f"latent of shape {tuple(x.shape)} is not (B, C, H, W)")
        return CallGeometry(int(x.shape[-2]), int(x.shape[-1]), text_len)


def apply(model, settings: ToMASettings) -> UNetAdapter:
    """Install ToMA's hooks on `model` (a ModelPatcher clone of a UNet model); return the adapter.

    Raises ValueError for a bad `blocks` string, a video UNet, or a selection with no block.
    """
    if settings.proportional_attention:
        raise ValueError(
            "proportional_attention=True is available for Flux-family models only (UNet attention "
            "takes no bias); turn it off for SDXL / SD1.5"
        )
    unet = model.get_model_object("diffusion_model")
    spec = parse_unet_blocks(settings.blocks)
    sites = find_sites(unet)
    selected = [s for s in sites if spec.selects(s.block, s.downsample)]
    if not selected:
        raise ValueError(
            f"blocks={settings.blocks!r} selects none of this UNet's transformer blocks; it has "
            f"{describe_blocks(sites)}"
        )
    _remove_own_patches(model, sites)
    if settings.scope == "block":
        for site in selected:
            model.add_object_patch(site.patch_key, make_block_forward(site, model.object_patches.get(site.patch_key)))
    else:
        install_attention_patches(model, frozenset(s.block for s in selected))
    log.debug("ToMA UNet: %d of %d transformer blocks selected (%s)", len(selected), len(sites), spec.describe())
    return UNetAdapter("unet", _describe_selection(spec, selected), len(selected))


# --- finding the transformer blocks ---------------------------------------------------------


def find_sites(unet: torch.nn.Module) -> list[TransformerSite]:
    """Every BasicTransformerBlock of a UNetModel with its block id and resolution level.

    The level is tracked by walking the blocks in execution order: each downsampling layer halves
    the grid, each upsampling layer doubles it. Video UNets (SpatialVideoTransformer) are refused.
    """
    from comfy.ldm.modules.attention import SpatialTransformer, SpatialVideoTransformer

    sites: list[TransformerSite] = []
    downsample = 1
    for group, prefix, index, block in _unet_blocks(unet):
        for layer_index, layer in enumerate(block):
            if isinstance(layer, SpatialVideoTransformer):
                raise ValueError("ToMA does not support video UNets (SpatialVideoTransformer, e.g. SVD)")
            if isinstance(layer, SpatialTransformer):
                sites += _stack_sites(layer, f"{prefix}.{layer_index}", (group, index), downsample)
            downsample = max(1, int(downsample * _scale_change(layer)))
    return sites


def _unet_blocks(unet: torch.nn.Module):
    """(group, module path, index, TimestepEmbedSequential) of every UNet block in execution order."""
    for index, block in enumerate(unet.input_blocks):
        yield "input", f"input_blocks.{index}", index, block
    if getattr(unet, "middle_block", None) is not None:
        yield "middle", "middle_block", 0, unet.middle_block
    for index, block in enumerate(unet.output_blocks):
        yield "output", f"output_blocks.{index}", index, block


def _scale_change(layer: torch.nn.Module) -> float:
    """2 after a downsampling layer (Downsample, or a ResBlock with down=True), 0.5 after an
    upsampling one, else 1."""
    from comfy.ldm.modules.diffusionmodules.openaimodel import Downsample, Upsample

    if getattr(layer, "updown", False):
        layer = getattr(layer, "h_upd", layer)
    if isinstance(layer, Downsample):
        return 2.0
    if isinstance(layer, Upsample):
        return 0.5
    return 1.0


def _stack_sites(stack: torch.nn.Module, path: str, block: BlockId, downsample: int) -> list[TransformerSite]:
    return [
        TransformerSite(f"{path}.transformer_blocks.{j}", block, j, downsample, module)
        for j, module in enumerate(stack.transformer_blocks)
    ]


def describe_blocks(sites: list[TransformerSite]) -> str:
    """E.g. "input 4,5 (1/2), input 7,8 (1/4), middle 0 (1/4), output 0-5 ..." for error messages."""
    seen: dict[tuple[str, int], int] = {}
    for site in sites:
        seen.setdefault(site.block, site.downsample)
    text = ", ".join(f"{g} {i} (1/{d})" for (g, i), d in seen.items())
    return f"transformer blocks {text}" if text else "no transformer blocks"


def _describe_selection(spec: UNetBlockSpec, selected: list[TransformerSite]) -> str:
    levels = sorted({s.downsample for s in selected})
    return f"{spec.describe()}: {len({s.block for s in selected})} UNet blocks at 1/{',1/'.join(map(str, levels))}"


def _remove_own_patches(model, sites: list[TransformerSite]) -> None:
    """Drop earlier ToMA object patches (re-applying replaces), restoring what they wrapped."""
    for site in sites:
        entry = model.object_patches.get(site.patch_key)
        if getattr(entry, TOMA_MARK, None) is None:
            continue
        foreign = getattr(entry, "toma_foreign", None)
        if foreign is None:
            del model.object_patches[site.patch_key]
        else:
            model.object_patches[site.patch_key] = foreign
    _remove_own_attention_patches(model)


# --- scope "block": whole BasicTransformerBlock on merged tokens ----------------------------


def make_block_forward(site: TransformerSite, foreign: Callable | None = None) -> Callable:
    """The object patch for one block's `forward`: (x (B, N, C), context, transformer_options) -> (B, N, C).

    foreign: another pack's object patch already on this key; it runs on the merged tokens in
    place of the class's forward.
    """
    block = site.module

    def run(x: torch.Tensor, context: Any, options: dict) -> torch.Tensor:
        if foreign is not None:
            return foreign(x, context=context, transformer_options=options)
        return type(block).forward(block, x, context=context, transformer_options=options)

    def toma_forward(x: torch.Tensor, context: Any = None, transformer_options: dict = {}) -> torch.Tensor:  # noqa: B006 (ComfyUI's signature)
        ctx = find_call({"transformer_options": transformer_options})
        if ctx is None:
            note_orphan("no ToMA call context")
            return run(x, context, transformer_options)
        if not ctx.merge:
            return run(x, context, transformer_options)
        why = block_veto(ctx, x, transformer_options)
        if why is not None:
            ctx.record_block(False, why)
            return run(x, context, transformer_options)
        plan = level_plan(ctx, x, transformer_options)
        x_m = plan.merge(x)
        y_m = run(x_m, context, transformer_options)
        ctx.record_block(True)
        return plan.unmerge_residual(x, x_m, y_m)

    setattr(toma_forward, TOMA_MARK, site.path)
    toma_forward.toma_foreign = foreign
    return toma_forward


def block_veto(ctx: CallContext, x: torch.Tensor, options: dict) -> str | None:
    """Why this block run must stay unmerged, or None.

    x (B, N, C) must match the level grid; a block whose attention another node replaced (SAG,
    PAG: issue 7 point 4) or a level below min_tokens runs unmerged.
    """
    shape = options.get("activations_shape")
    if shape is None or len(shape) != 4:
        return "no activations_shape"
    h, w = int(shape[-2]), int(shape[-1])
    if x.ndim != 3 or x.shape[1] != h * w or x.shape[0] != ctx.batch:
        return "tokens differ from activations_shape"
    if h * w < ctx.settings.min_tokens:
        return f"level below min_tokens={ctx.settings.min_tokens}"
    if has_attention_replace(options.get("patches_replace"), options.get("block"), options.get("block_index", 0)):
        return "attn1/attn2 replace patch present"
    return None


def has_attention_replace(replace: dict | None, block: Any, block_index: int) -> bool:
    """True when patches_replace has an attn1/attn2 entry for this block, keyed as ComfyUI's
    BasicTransformerBlock looks it up: (group, index, depth) first, then (group, index)."""
    if not replace or block is None:
        return False
    keys = ((block[0], block[1], block_index), tuple(block))
    return any(key in replace.get(name, {}) for name in ("attn1", "attn2") for key in keys)


def level_plan(ctx: CallContext, x: torch.Tensor, options: dict) -> MergePlan:
    """The plan of this block's level (h x w from activations_shape), built from x (B, N, C) once."""
    h, w = int(options["activations_shape"][-2]), int(options["activations_shape"][-1])
    return ctx.plan(PLAN_SLOT, h, w, lambda: features(x))


def features(x: torch.Tensor) -> torch.Tensor:
    """Plan features of tokens x (B, N, C): parameter-free LayerNorm in fp32, (B, N, C)."""
    return F.layer_norm(x.float(), (x.shape[-1],))


# --- scope "attention": attn1 / attn2 patch points -----------------------------------------

_ATTN_PATCHES = ("attn1_patch", "attn1_output_patch", "attn2_patch", "attn2_output_patch")


REPLACE_KEY = f"{TOMA_KEY}_attn_replace"
"""transformer_options key (and wrapper key): the call's attn1/attn2 replace dicts, for the
attention patches, whose extra_options lack "patches_replace"."""


def install_attention_patches(model, selected: frozenset[BlockId]) -> None:
    """Add ToMA's four attention patches; they act only in the `selected` UNet blocks."""
    import comfy.patcher_extension

    model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, REPLACE_KEY, expose_attention_replace)
    model.set_model_attn1_patch(_mark(make_attn_in(selected, self_attention=True)))
    model.set_model_attn1_output_patch(_mark(make_attn_out(count=True)))
    model.set_model_attn2_patch(_mark(make_attn_in(selected, self_attention=False)))
    model.set_model_attn2_output_patch(_mark(make_attn_out(count=False)))


def _mark(fn: Callable) -> Callable:
    setattr(fn, TOMA_MARK, "attention")
    return fn


def expose_attention_replace(executor, *args, **kwargs):
    """APPLY_MODEL wrapper: copy the call's attn1/attn2 replace dicts to transformer_options[REPLACE_KEY]
    (eagerly, outside the diffusion model), so the attention patches can leave those blocks alone.

    args: (x, t, c_concat, c_crossattn, control, transformer_options, **extra conds).
    """
    args = list(args)
    in_kwargs = "transformer_options" in kwargs
    options = kwargs["transformer_options"] if in_kwargs else (args[5] if len(args) > 5 else None)
    if isinstance(options, dict):
        replace = options.get("patches_replace", {})
        options = dict(options)
        options[REPLACE_KEY] = {name: replace[name] for name in ("attn1", "attn2") if replace.get(name)}
        if in_kwargs:
            kwargs["transformer_options"] = options
        else:
            args[5] = options
    return executor(*args, **kwargs)


def _remove_own_attention_patches(model) -> None:
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
            patches[name] = [p for p in patches[name] if getattr(p, TOMA_MARK, None) is None]
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
    why = _attention_veto(ctx, n, extra)
    if why is not None:
        if count:
            ctx.record_block(False, why)
        return None
    h, w = int(extra["activations_shape"][-2]), int(extra["activations_shape"][-1])
    return ctx.plan(PLAN_SLOT, h, w, lambda: features(n))


def _attention_veto(ctx: CallContext, n: torch.Tensor, extra: dict) -> str | None:
    """block_veto for the attention patches: n (B, N, C) is the normed block input."""
    shape = extra.get("activations_shape")
    if shape is None or len(shape) != 4:
        return "no activations_shape"
    h, w = int(shape[-2]), int(shape[-1])
    if n.ndim != 3 or n.shape[0] != ctx.batch or n.shape[1] != h * w:
        return "tokens differ from activations_shape"
    if h * w < ctx.settings.min_tokens:
        return f"level below min_tokens={ctx.settings.min_tokens}"
    if has_attention_replace(extra.get(REPLACE_KEY), extra.get("block"), extra.get("block_index", 0)):
        return "attn1/attn2 replace patch present"
    return None


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
