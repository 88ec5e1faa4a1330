"""ToMA for Qwen-Image and Qwen-Image-Edit (`comfy.ldm.qwen_image.model.QwenImageTransformer2DModel`).

Its 60 blocks are `patches_replace["dit"]` ("double_block", i) keys with args img (B, N+R, C),
txt (B, T, C), vec (B|2B, C) and pe, a rope table with one row per token of [text (T); image (N);
references (R)] on one axis: (B, T+N+R, 1, hd/2, 2, 2) on ComfyUI 0.3.64, (B, 1, T+N+R, hd/2, 2, 2)
where `_forward` keeps `pe_embedder(ids)` as it is. The token axis is read from the pe each block
receives (the one axis of length T + N + R); none or several: the block runs unmerged, the layout
reason counted. The block runs on [M img; references]; merged tokens take their destinations'
pe rows at [T, T+N). The text mask (`encoder_hidden_states_mask`, from `_forward`'s closure)
covers the T text keys only and the block sizes the image part from what it receives, so merging
leaves it intact. No block writes its input in place.

Edit: reference-image tokens (`reference_latents`, R tokens after the image) pass through
unmerged with their pe rows. With CFG and a reference on the positive only, cond and uncond run
as separate calls of different length; geometry (and the plan) is per call. The latent
is 5-D (B, 16, F, H, W); the grid is ceil(H / 2) x ceil(W / 2). A latent of F > 1 frames (the
layers of a layered latent, which `QwenImageTransformer2DModel.process_img` flattens t-major:
frame, row, column) merges each frame on its own: spatial tiles inside one frame, never a token
of one layer with another's (`toma_core.video.Segment` with tile_frames 1).

Reference method `index_timestep_zero` (Qwen-Image-Edit 2511's `default_ref_method`, or the
conditioning's `reference_latents_method`): vec holds 2B rows, the call's timestep then timestep 0,
and `_forward` hands every block `timestep_zero_index` = N from a closure, not in the replace
args: tokens from N on (the references) take the timestep-0 modulation
(`QwenImageTransformerBlock._modulate`). A merged block has its references from D on, so the
merged run carries its row move in a copy of transformer_options and an object patch of each
selected block's forward (machinery/spans.py `span_forward`) moves that index from N to D: the
references keep their own modulation, exactly. An index inside the image rows cannot move: the
block runs unmerged, with the layout reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ...toma_core import MergePlan
from ...toma_core.video import Segment
from ..contract import TOKENS_DIFFER, CallGeometry, Unmerged, layout_changed
from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_dit_hooks, install_forward_patches
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, Rows, merged_dit_block
from ..machinery.scope import require_block_scope
from ..machinery.spans import RowMove, SpansCut, span_forward, with_move
from ..run.runtime import CallContext
from ..settings import ToMASettings

SLOT = "qwen_image"

ZERO_INDEX = "timestep_zero_index"
"""QwenImageTransformerBlock.forward's keyword: the token the timestep-0 modulation starts at."""


@dataclasses.dataclass(frozen=True)
class QwenImageAdapter(DitAdapter):
    """DitAdapter that also reads the frames of a multi-frame (layered) latent."""

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Grid of one frame of x (B, C, F, H, W) and its F frames, T of context, reference tokens."""
        if x.ndim != 5 or x.shape[2] == 1:
            return super().call_geometry(x, context, kwargs)
        geometry = super().call_geometry(x[:, :, :1], context, kwargs)
        return geometry if geometry.reason else dataclasses.replace(geometry, frames=x.shape[2])


def apply(model, settings: ToMASettings) -> QwenImageAdapter:
    """Hook the selected blocks of a ModelPatcher clone of a Qwen-Image model: their replace keys
    merge, their forwards move the timestep-zero index of a merged run."""
    require_block_scope(settings, "Qwen-Image")
    dm = model.get_model_object("diffusion_model")
    sizes = {"double": len(dm.transformer_blocks)}
    blocks = parse_dit_blocks(settings.blocks, sizes)
    install_dit_hooks(model, sizes, blocks, {"double": merged_block})
    paths = {f"transformer_blocks.{i}": blocks.selects("double", i) for i in range(sizes["double"])}
    install_forward_patches(model, paths, lambda path, foreign: span_forward(dm.get_submodule(path), foreign, moved_zero_index))
    return QwenImageAdapter("qwen_image", blocks.describe(), blocks.count, int(dm.patch_size))


def token_axis(pe: torch.Tensor, length: int) -> int | Unmerged:
    """The axis of pe (B, ...) with one row per token of the block's L = `length` tokens."""
    axes = [a for a in range(1, pe.ndim) if pe.shape[a] == length]
    if len(axes) != 1:
        return layout_changed(f"pe of shape {tuple(pe.shape)} does not have one axis of {length} rows")
    return axes[0]


def timestep_zero(args: dict, n: int) -> Callable[[MergePlan], dict] | None | Unmerged:
    """None for one modulation per sample (vec (B, C)); under index_timestep_zero (vec (2B, C): the
    call's timestep, then timestep 0 for the tokens from N on) the merged run's transformer_options
    carrying its row move for the forward patch (moved_zero_index); Unmerged for another vec batch."""
    batch, rows = args["img"].shape[0], args["vec"].shape[0]
    if rows in (1, batch):
        return None
    if rows != 2 * batch:
        return layout_changed(f"vec of batch {rows} is neither the image batch {batch} nor twice it")
    options = args["transformer_options"]
    return lambda plan: {"transformer_options": with_move(options, RowMove(0, n, plan.num_kept))}


def image_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Block: img [image (N); references (R)] merged to (B, D+R, C), each frame of a multi-frame
    image on its own; pe rows gathered at T on the axis that has T + N + R rows."""
    g, img, text_len = ctx.geometry, args["img"], args["txt"].shape[1]
    if img.shape[1] != g.tokens + g.extra_tokens:
        return TOKENS_DIFFER
    length = text_len + img.shape[1]
    axis = token_axis(args["pe"], length)
    if isinstance(axis, Unmerged):
        return axis
    zero = timestep_zero(args, g.tokens)
    if isinstance(zero, Unmerged):
        return zero
    frames = (Segment(g.frames),) if g.frames > 1 else None
    return ImageSpan(0, (Rows("pe", axis, text_len),), length, segments=frames, more=zero, keys=Keys(text_len, length))


merged_block = merged_dit_block(SLOT, image_span)


def moved_zero_index(move: RowMove, kwargs: dict) -> dict:
    """The block's keywords with timestep_zero_index N moved to D (a boundary after the image
    shifts, one before stays); SpansCut when missing or inside the image rows."""
    index = kwargs.get(ZERO_INDEX)
    row = None if index is None else move.row(index)
    if row is None:
        raise SpansCut(layout_changed(f"{ZERO_INDEX} {index} is not a boundary of the merged image rows"))
    return kwargs | {ZERO_INDEX: row}
