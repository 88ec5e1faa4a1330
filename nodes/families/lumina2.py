"""ToMA for Lumina-Image 2.0 and Z-Image (`comfy.ldm.lumina.model.NextDiT`).

NextDiT has no replace key: each selected `layers.{i}` gets an object patch of its `forward`
(x, x_mask, freqs_cis, adaln_input, [timestep_zero_index,] transformer_options)
(comfy.ldm.lumina.model.JointTransformerBlock; NextDiT passes the last two by keyword, and
timestep_zero_index only where the block takes it). The single stream x (B, L, C) is

    [prefix; image (N); image pads (P)]

- Lumina2: prefix = the caption (T), P = 0.
- Z-Image (`NextDiT.pad_tokens_multiple` m set): the caption padded to a multiple of m with pad
  tokens, with reference latents ("omni") also their captions, SigLIP features and reference
  images (each padded), then the image padded with P = (-N) mod m pad tokens whose rope
  positions are 0 (comfy.ldm.lumina.model.pad_zimage, NextDiT.embed_all).

freqs_cis (1|B, L, 1, hd/2, 2, 2) and x_mask (None, or an additive (B, L) key mask) have one row
per token. The image span starts at L - N - P, read per call from what the layer receives (L, the
pad rows of freqs_cis, the module's pad multiple, timestep_zero_index); a layer whose inputs do not
fit that layout runs unmerged with `layout_changed`. Prefix and pads pass through with their rope
rows; the layer runs on [prefix; M image; pads] with the destinations' rope rows and mask columns.
Its modulation is per sample (scale + tanh gate), so it commutes with the merge.

timestep_zero_index (Z-Image omni): the token ranges [(start, end), ...] modulated with the real
timestep, the other tokens with timestep 0, adaln_input then (2B, C)
(comfy.ldm.lumina.model.modulate, apply_gate). The image and its pads must be the range that ends
at L; the ranges are moved to the merged sequence before merging (machinery/spans.py).

Caption lengths: where ComfyUI drops padded caption tokens per sample (x_mask a (B, L) key mask
whose rows differ), each sample's image sits at its own offset: such a layer runs unmerged, with
the reason. Where the caption padding stays (x_mask None) one layout holds for the whole batch.
The noise and context refiners before the layers stay exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..contract import TOKENS_DIFFER, Unmerged, layout_changed
from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_forward_patches, module_forward
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, Rows, run_hook, run_merged
from ..machinery.scope import require_block_scope
from ..machinery.spans import RowMove, moved_spans
from ..run.runtime import CallContext
from ..settings import ToMASettings

SLOT = "lumina2"

KNOWN_KEYWORDS = frozenset({"timestep_zero_index"})
"""Keywords of JointTransformerBlock.forward beyond x_mask, freqs_cis, adaln_input and transformer_options."""

CAPTIONS_DIFFER = Unmerged("caption lengths differ within the batch")

Spans = list[tuple[int, int]]


def apply(model, settings: ToMASettings) -> DitAdapter:
    """Object-patch the selected layers of a ModelPatcher clone of a Lumina2 / Z-Image model."""
    require_block_scope(settings, "Lumina2")
    dm = model.get_model_object("diffusion_model")
    blocks = parse_dit_blocks(settings.blocks, {"layers": len(dm.layers)})
    paths = {f"layers.{i}": blocks.selects("layers", i) for i in range(len(dm.layers))}
    pad_multiple = getattr(dm, "pad_tokens_multiple", None)
    install_forward_patches(model, paths, lambda path, foreign: make_forward(dm.get_submodule(path), foreign, pad_multiple))
    return DitAdapter("lumina2", blocks.describe(), blocks.count, int(dm.patch_size), refs_key=None)


def make_forward(layer: torch.nn.Module, foreign: Callable | None, pad_multiple: int | None) -> Callable:
    """The object patch of one layer's forward: x (B, L, C) -> (B, L, C). pad_multiple:
    NextDiT.pad_tokens_multiple (Z-Image), None when the image is not padded."""
    run = module_forward(layer, foreign)

    def toma_forward(x, x_mask, freqs_cis, adaln_input=None, *, transformer_options={}, **kwargs):  # noqa: B006 (ComfyUI's signature)
        unmerged = {"x_mask": x_mask, "freqs_cis": freqs_cis} | kwargs

        def call(seq: torch.Tensor, tables: dict) -> torch.Tensor:
            extra = {key: tables[key] for key in kwargs}
            options = tables.get("transformer_options", transformer_options)
            return run(seq, tables["x_mask"], tables["freqs_cis"], adaln_input, transformer_options=options, **extra)

        def merged(ctx: CallContext) -> torch.Tensor | Unmerged:
            span = image_span(x, x_mask, freqs_cis, kwargs, ctx.geometry.tokens, pad_multiple)
            if isinstance(span, Unmerged):
                return span
            return run_merged(
                ctx, SLOT, x, span, unmerged | {"transformer_options": transformer_options},
                call=lambda seq, tables: call(seq, unmerged | tables), output=lambda y: y, rebuild=lambda y, seq: seq,
            )

        return run_hook({"transformer_options": transformer_options}, None, lambda: call(x, unmerged), merged)

    return toma_forward


def image_span(
    x: torch.Tensor, x_mask: torch.Tensor | None, freqs_cis: torch.Tensor, kwargs: dict[str, Any], n: int, pad_multiple: int | None,
) -> ImageSpan | Unmerged:
    """Where the N image tokens of x (B, L, C) are: [L - N - P, L - P), P image pads after them;
    or why the layer runs unmerged."""
    unknown = sorted(set(kwargs) - KNOWN_KEYWORDS)
    if unknown:
        return layout_changed(f"the layer received keyword(s) {', '.join(unknown)}")
    length = x.shape[1]
    pad = (-n) % pad_multiple if pad_multiple else 0
    start = length - n - pad
    if start < 0:
        return TOKENS_DIFFER
    if per_sample_mask(x_mask):
        return CAPTIONS_DIFFER
    if not at_origin(freqs_cis, length, pad):
        return layout_changed(f"the last {pad} of {length} rope rows are not image pad tokens (position 0)")
    spans = kwargs.get("timestep_zero_index")
    if spans is not None and (start, length) not in [tuple(s) for s in spans]:
        return layout_changed(f"no timestep_zero_index range is the image and its pads ({start}, {length})")
    tables = (Rows("x_mask", 1, start, key_mask=True), Rows("freqs_cis", 1, start))
    more = None if spans is None else lambda plan: move_spans(spans, start, n, plan.num_kept)
    return ImageSpan(start, tables, length, more=more, keys=Keys(start, length))


def per_sample_mask(x_mask: torch.Tensor | None) -> bool:
    """Whether x_mask is a key mask (B, L) whose rows differ: a caption of its own length per sample."""
    if not torch.is_tensor(x_mask) or x_mask.ndim < 2 or x_mask.shape[0] < 2:
        return False
    return not bool((x_mask == x_mask[:1]).all())


def at_origin(freqs_cis: torch.Tensor, length: int, pad: int) -> bool:
    """Whether the last `pad` rows of freqs_cis (1|B, L, 1, hd/2, 2, 2) are the identity rotation
    (rope position 0, as NextDiT.embed_all gives the image pads); True when pad is 0."""
    if pad == 0:
        return True
    if freqs_cis.ndim < 3 or freqs_cis.shape[1] != length or freqs_cis.shape[-2:] != (2, 2):
        return False
    tail = freqs_cis[:, length - pad:]
    return torch.equal(tail, torch.eye(2, dtype=tail.dtype, device=tail.device).expand_as(tail))


def move_spans(spans: Spans, start: int, n: int, kept: int) -> dict[str, Spans] | Unmerged:
    """timestep_zero_index ranges of the unmerged sequence moved to the merged one, whose image
    tokens [start, start + n) became [start, start + kept) (machinery/spans.py); a range ending
    inside them cannot move."""
    moved = moved_spans(spans, RowMove(start, n, kept), "timestep_zero_index")
    return moved if isinstance(moved, Unmerged) else {"timestep_zero_index": moved}
