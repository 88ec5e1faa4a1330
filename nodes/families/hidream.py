"""ToMA for HiDream-I1 (`comfy.ldm.hidream.model.HiDreamImageTransformer2DModel`, issue 14).

HiDream has no replace key: each selected `double_stream_blocks.{i}` / `single_stream_blocks.{i}`
(a `HiDreamImageBlock`) gets an object patch of its `forward`, called with keywords image_tokens,
image_tokens_masks, text_tokens, adaln_input, rope, transformer_options (research/
dit_family.md §6.5). The image comes first everywhere: double blocks get image_tokens (B, N, C)
beside their text; single blocks get image_tokens = [image (N); text] and return that sequence;
rope (B, N + T_all, 1, hd/2, 2, 2) has the image rows first. The block runs on M image with the
destinations' rope rows; modulation is per sample. The MoE feed-forward routes each merged
token on its merged features (legal, but the routing changes).

Attention is only about 9 % of HiDream's block compute (the MoE dominates), so merging saves
mostly linear work (research §8); measured before enabling it: 1.67x at ratio 0.5 against an
ideal of 1.68x on the CPU bench (README, "Speed on each DiT family"). Refused per call (run
unmerged, with the reason): the E1 edit condition (`image_cond`, concatenated along the width,
so tiles would cross the seam) and list inputs with token masks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..contract import CallGeometry
from ..machinery.dit_blocks import parse_flux_blocks
from ..machinery.dit_runner import Rows, run_merged, tokens_match
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import block_context, install_forward_patches, module_forward
from ..machinery.scope import require_block_scope
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
        def call(seq: torch.Tensor, rows: torch.Tensor) -> Any:
            return run(image_tokens=seq, image_tokens_masks=image_tokens_masks, text_tokens=text_tokens,
                       adaln_input=adaln_input, rope=rows, transformer_options=transformer_options)

        ctx = block_context({"transformer_options": transformer_options})
        if ctx is None or not ctx.merge or rope is None:
            return call(image_tokens, rope)
        n = ctx.geometry.tokens
        if image_tokens_masks is not None:
            ctx.record_block(False, "image_tokens_masks present")
            return call(image_tokens, rope)
        if not tokens_match(ctx, image_tokens.shape[1] if double else min(image_tokens.shape[1], n), n):
            return call(image_tokens, rope)
        done, out = run_merged(
            ctx, SLOT, image_tokens, 0, {"rope": rope}, (Rows("rope", 1, 0),), rope.shape[1],
            call=lambda seq, merged: call(seq, merged["rope"]),
            output=lambda result: result[0] if double else result,
            rebuild=lambda result, seq: (seq, result[1]) if double else seq,
        )
        if done:
            return out
        ctx.record_block(False, out)
        return call(image_tokens, rope)

    return toma_forward
