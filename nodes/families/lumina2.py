"""ToMA for Lumina-Image 2.0 (`comfy.ldm.lumina.model.NextDiT`).

NextDiT has no replace key: each selected `layers.{i}` gets an object patch of its `forward`
(x, x_mask, freqs_cis, adaln_input, transformer_options) (comfy.ldm.lumina.model.JointTransformerBlock). The single
stream x (B, L, C) is [caption (T); image (N)], L = T + N; freqs_cis (B, L, 1, hd/2, 2, 2) and
x_mask (None, or an additive (B, L) key mask) have one row per token. The layer runs on
[caption; M image] with the destinations' rope rows and mask columns; its modulation is per
sample (scale + tanh gate), so it commutes with the merge.

The caption length T differs between cond and uncond (ComfyUI drops padded caption tokens), so
it is read per call as L - N. A batch whose samples have different caption lengths (a padded
`attention_mask` whose rows differ) puts each sample's image at its own offset: such a call
runs unmerged, with the reason. The noise and context refiners before the layers stay exact.
Z-Image (a later NextDiT with pad tokens) is not in the ComfyUI this was built against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..contract import TOKENS_DIFFER, CallGeometry, Unmerged
from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.dit_runner import ImageSpan, Rows, run_merged
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_forward_patches, module_forward
from ..machinery.scope import require_block_scope
from ..machinery.skeleton import run_hook
from ..runtime import CallContext
from ..settings import ToMASettings

SLOT = "lumina2"


@dataclasses.dataclass(frozen=True)
class Lumina2Adapter(DitAdapter):
    """DitAdapter that also refuses batches whose samples' captions differ in length."""

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        geometry = super().call_geometry(x, context, kwargs)
        mask = kwargs.get("attention_mask")
        if geometry.reason is None and torch.is_tensor(mask) and mask.ndim == 2 and mask.shape[0] > 1:
            lengths = mask.sum(dim=1)
            if bool((lengths != lengths[0]).any()):
                return dataclasses.replace(geometry, reason="caption lengths differ within the batch")
        return geometry


def apply(model, settings: ToMASettings) -> Lumina2Adapter:
    """Object-patch the selected layers of a ModelPatcher clone of a Lumina2 model."""
    require_block_scope(settings, "Lumina2")
    dm = model.get_model_object("diffusion_model")
    blocks = parse_dit_blocks(settings.blocks, {"layers": len(dm.layers)})
    paths = {f"layers.{i}": blocks.selects("layers", i) for i in range(len(dm.layers))}
    install_forward_patches(model, paths, lambda path, foreign: make_forward(dm.get_submodule(path), foreign))
    return Lumina2Adapter("lumina2", blocks.describe(), blocks.count, int(dm.patch_size), refs_key=None)


def make_forward(layer: torch.nn.Module, foreign: Callable | None) -> Callable:
    """The object patch of one layer's forward: x (B, T+N, C) -> (B, T+N, C)."""
    run = module_forward(layer, foreign)

    def toma_forward(x, x_mask, freqs_cis, adaln_input=None, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
        def call(seq: torch.Tensor, tables: dict) -> torch.Tensor:
            return run(seq, tables["x_mask"], tables["freqs_cis"], adaln_input, transformer_options=transformer_options)

        unmerged = {"x_mask": x_mask, "freqs_cis": freqs_cis}

        def merged(ctx: CallContext) -> torch.Tensor | Unmerged:
            text_len = x.shape[1] - ctx.geometry.tokens
            if text_len < 0:
                return TOKENS_DIFFER
            tables = (Rows("x_mask", 1, text_len, key_mask=True), Rows("freqs_cis", 1, text_len))
            return run_merged(
                ctx, SLOT, x, ImageSpan(text_len, tables, x.shape[1]), unmerged,
                call=lambda seq, merged: call(seq, unmerged | merged), output=lambda y: y, rebuild=lambda y, seq: seq,
            )

        return run_hook({"transformer_options": transformer_options}, None, lambda: call(x, unmerged), merged)

    return toma_forward
