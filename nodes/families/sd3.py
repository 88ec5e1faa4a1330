"""ToMA for SD3 / SD3.5 (MMDiT: `comfy.ldm.modules.diffusionmodules.mmdit.MMDiT`).

Every joint block is a `patches_replace["dit"]` ("double_block", i) key with args img (B, N, C),
txt (B, T, C) and vec (B, D) (as MMDiT.forward_core_with_concat passes them). The whole block runs on the merged
image stream; the text stream passes through. SD3 has no rope: a learned absolute position
embedding is added to the tokens once before the blocks, so a merged token carries its cluster's
position in its features and there is nothing to gather. The last block's text stream is
pre-only and returns txt None, passed on as it comes. SD3.5-Medium's extra image self-attention
(`x_block_self_attn`) runs inside the block on the merged tokens too; under scope keys_values its
keys and values merge as the joint attention's image keys do.

The grid comes from the APPLY_MODEL wrapper's latent (MMDiT.forward has no DIFFUSION_MODEL
executor): h = ceil(H / 2), w = ceil(W / 2), as `PatchEmbed` pads.
"""

from __future__ import annotations

from ..contract import TOKENS_DIFFER, Unmerged
from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_dit_hooks
from ..machinery.keys_values import Keys
from ..machinery.runner import ImageSpan, merged_dit_block
from ..machinery.scope import require_block_scope
from ..run.runtime import CallContext
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


def image_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Joint block: img (B, N, C) is the image, merged to (B, D, C); txt, vec unchanged; no
    per-token table (no rope). The joint attention runs over [txt; img] (mmdit._block_mixing); its
    second attention call, in the blocks that have one, is SD3.5-Medium's image-only
    x_block_self_attn over the N image tokens (scope keys_values merges the keys of both)."""
    n = args["img"].shape[1]
    if n != ctx.geometry.tokens:
        return TOKENS_DIFFER
    text_len = 0 if args.get("txt") is None else args["txt"].shape[1]
    return ImageSpan(0, (), n, keys=Keys(text_len, text_len + n, then=Keys(0, n)))


merged_joint = merged_dit_block(SLOT, image_span)
