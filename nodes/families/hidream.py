"""ToMA for HiDream-I1 (`comfy.ldm.hidream.model.HiDreamImageTransformer2DModel`).

HiDream has no replace key: each selected `double_stream_blocks.{i}` / `single_stream_blocks.{i}`
(a `HiDreamImageBlock`) gets an object patch of its `forward`, called with keywords image_tokens,
image_tokens_masks, text_tokens, adaln_input, rope, transformer_options (as
HiDreamImageTransformer2DModel.forward calls them). The image comes first everywhere: double blocks get image_tokens (B, N, C)
beside their text; single blocks get image_tokens = [image (N); text] and return that sequence;
rope (B, N + T_all, 1, hd/2, 2, 2) has the image rows first. The block runs on M image with the
destinations' rope rows; modulation is per sample. The MoE feed-forward routes each merged
token on its merged features (legal, but the routing changes).

Attention is a small share of HiDream's block compute (the MoE feed-forward dominates), so
merging saves mostly linear work; the speed-up is measured by bench/speed/bench_families.py
(figures in docs/benchmarks.md). Refused per call (run unmerged, with the reason): the E1 edit condition (`image_cond`, concatenated along the width,
so tiles would cross the seam) and list inputs with token masks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..contract import NOTHING_TO_MERGE, TOKENS_DIFFER, CallGeometry, Unmerged
from ..machinery.dit_blocks import parse_flux_blocks
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_forward_patches, module_forward
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, Rows, run_hook, run_merged
from ..machinery.scope import require_block_scope
from ..run.runtime import CallContext
from ..settings import ToMASettings

SLOT = "hidream"
STREAMS = {"double": "double_stream_blocks", "single": "single_stream_blocks"}
EDIT = "E1 edit condition (image_cond beside the image) is not merged"


@dataclasses.dataclass(frozen=True)
class HiDreamAdapter(DitAdapter):
    """DitAdapter that runs E1-edit calls unmerged."""

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        geometry = super().call_geometry(x, context, kwargs)
        if geometry.reason is None and kwargs.get("image_cond") is not None:
            return dataclasses.replace(geometry, reason=EDIT)
        return geometry


def apply(model, settings: ToMASettings) -> HiDreamAdapter:
    """Object-patch the selected blocks of a ModelPatcher clone of a HiDream model."""
    require_block_scope(settings, "HiDream")
    dm = model.get_model_object("diffusion_model")
    sizes = {group: len(getattr(dm, name)) for group, name in STREAMS.items()}
    blocks = parse_flux_blocks(settings.blocks, sizes["double"], sizes["single"])
    paths = {f"{STREAMS[g]}.{i}": (g, blocks.selects(g, i)) for g, n in sizes.items() for i in range(n)}
    install_forward_patches(
        model, {path: selected for path, (_, selected) in paths.items()},
        lambda path, foreign: make_forward(dm.get_submodule(path), foreign, paths[path][0] == "double"),
    )
    return HiDreamAdapter("hidream", blocks.describe(), blocks.count, int(dm.patch_size), refs_key=None)


def make_forward(block: torch.nn.Module, foreign: Callable | None, double: bool) -> Callable:
    """The object patch of one HiDreamImageBlock's forward (double: returns (image, text); single:
    returns the [image; text] sequence)."""
    run = module_forward(block, foreign)

    def toma_forward(image_tokens, image_tokens_masks=None, text_tokens=None, adaln_input=None, rope=None, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
        def call(seq: torch.Tensor, rows: torch.Tensor, options: dict = transformer_options) -> Any:
            return run(image_tokens=seq, image_tokens_masks=image_tokens_masks, text_tokens=text_tokens,
                       adaln_input=adaln_input, rope=rows, transformer_options=options)

        def merged(ctx: CallContext) -> Any:
            n = ctx.geometry.tokens
            if rope is None:
                return NOTHING_TO_MERGE
            if image_tokens_masks is not None:
                return Unmerged("image_tokens_masks present")
            if (image_tokens.shape[1] if double else min(image_tokens.shape[1], n)) != n:
                return TOKENS_DIFFER
            return run_merged(
                ctx, SLOT, image_tokens, ImageSpan(0, (Rows("rope", 1, 0),), rope.shape[1], keys=Keys(0, rope.shape[1])),
                {"rope": rope, "transformer_options": transformer_options}, call=lambda seq, merged: call(seq, merged["rope"], merged.get("transformer_options", transformer_options)),
                output=lambda result: result[0] if double else result,
                rebuild=lambda result, seq: (seq, result[1]) if double else seq,
            )

        return run_hook({"transformer_options": transformer_options}, None, lambda: call(image_tokens, rope), merged)

    return toma_forward
