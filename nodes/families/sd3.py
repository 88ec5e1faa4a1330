"""ToMA for SD3 / SD3.5 (MMDiT: `comfy.ldm.modules.diffusionmodules.mmdit.MMDiT`, issue 14).

Every joint block is a `patches_replace["dit"]` ("double_block", i) key with args img (B, N, C),
txt (B, T, C) and vec (B, D) (research/dit_family.md §6.1). The whole block runs on the merged
image stream; the text stream passes through. SD3 has no rope: a learned absolute position
embedding is added to the tokens once before the blocks, so a merged token carries its cluster's
position in its features and there is nothing to gather. The last block's text stream is
pre-only and returns txt None, passed on as it comes. SD3.5-Medium's extra image self-attention
(`x_block_self_attn`) runs inside the block on the merged tokens too.

The grid comes from the APPLY_MODEL wrapper's latent (MMDiT.forward has no DIFFUSION_MODEL
executor, §11.7): h = ceil(H / 2), w = ceil(W / 2), as `PatchEmbed` pads.
"""

from __future__ import annotations

from collections.abc import Callable

from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.dit_runner import merged_dit_block, tokens_match
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import block_context, install_dit_hooks
from ..machinery.scope import require_block_scope
from ..settings import ToMASettings

SLOT = "sd3"


def apply(model, settings: ToMASettings) -> DitAdapter:
    """Hook the selected joint blocks of a ModelPatcher clone of an SD3 model."""
    require_block_scope(settings, "SD3")
    dm = model.get_model_object("diffusion_model")
    sizes = {"double": len(dm.joint_blocks)}
    blocks = parse_dit_blocks(settings.blocks, sizes)
    install_dit_hooks(model, sizes, blocks, {"double": merged_joint})
    return DitAdapter("sd3", blocks.describe(), blocks.count, int(dm.x_embedder.patch_size[0]), refs_key=None)


def merged_joint(args: dict, extra: dict, block: Callable[[dict], dict]) -> dict:
    """Joint block: img (B, N, C) merged to (B, D, C); txt, vec unchanged; returns img (B, N, C)."""
    ctx = block_context(args, extra)
    if ctx is None or not ctx.merge or not tokens_match(ctx, args["img"].shape[1], ctx.geometry.tokens):
        return block(args)
    return merged_dit_block(args, block, ctx, SLOT, 0, (), args["img"].shape[1])
