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

Scope "attention" (unet_attention.py) merges only inside the attention calls; the FF and norms
stay at N tokens, so the speed-up is small where the FF dominates (SDXL's 1/4 level). Where the
blocks are: unet_sites.py.

All per-step decisions are made eagerly by runtime.apply_model_wrapper; the hooks read the
CallContext and only add tensor work (issue 7 point 5).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...toma_core import MergePlan
from ..contract import CallGeometry
from ..machinery.geometry import text_length
from ..machinery.merge import features
from ..runtime import CallContext, find_call, note_orphan
from ..settings import ToMASettings
from .unet_attention import REPLACE_KEY, install_attention_patches, remove_own_attention_patches
from .unet_blocks import UNetBlockSpec, parse_unet_blocks
from .unet_sites import PLAN_SLOT, TOMA_MARK, TransformerSite, describe_blocks, find_sites, has_attention_replace

__all__ = ["REPLACE_KEY", "TOMA_MARK", "apply", "find_sites", "make_block_forward"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UNetAdapter:
    """The runtime's view of a patched UNet (see runtime.FamilyAdapter)."""

    family: str
    blocks: str
    num_blocks: int

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Latent grid H x W of x (B, C, H, W) and T of context (B, T, C_txt). Each transformer
        level has its own smaller grid, read per block from activations_shape."""
        text_len = text_length(context)
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
    remove_own_attention_patches(model)


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


def level_plan(ctx: CallContext, x: torch.Tensor, options: dict) -> MergePlan:
    """The plan of this block's level (h x w from activations_shape), built from x (B, N, C) once."""
    h, w = int(options["activations_shape"][-2]), int(options["activations_shape"][-1])
    return ctx.plan(PLAN_SLOT, h, w, lambda: features(x))
