"""ToMA for Qwen-Image and Qwen-Image-Edit (`comfy.ldm.qwen_image.model.QwenImageTransformer2DModel`,
issue 14).

Its 60 blocks are `patches_replace["dit"]` ("double_block", i) keys with args img (B, N+R, C),
txt (B, T, C), vec (B, D) and pe (B, T+N+R, 1, hd/2, 2, 2), text rows first (research/
dit_family.md §5). The block runs on [M img; references]; merged tokens take their destinations'
pe rows at [T, T+N). There is no text mask (ComfyUI never passes one) and no in-place write.

Edit: reference-image tokens (`reference_latents`, R tokens after the image) pass through
unmerged with their pe rows. With CFG and a reference on the positive only, cond and uncond run
as separate calls of different length; geometry (and the plan) is per call (§11.5). The latent
is 5-D (B, 16, 1, H, W); the grid is ceil(H / 2) x ceil(W / 2).
"""

from __future__ import annotations

from collections.abc import Callable

from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.dit_runner import Rows, merged_dit_block, tokens_match
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import block_context, install_dit_hooks
from ..machinery.scope import require_block_scope
from ..settings import ToMASettings

SLOT = "qwen_image"


def apply(model, settings: ToMASettings) -> DitAdapter:
    """Hook the selected blocks of a ModelPatcher clone of a Qwen-Image model."""
    require_block_scope(settings, "Qwen-Image")
    dm = model.get_model_object("diffusion_model")
    sizes = {"double": len(dm.transformer_blocks)}
    blocks = parse_dit_blocks(settings.blocks, sizes)
    install_dit_hooks(model, sizes, blocks, {"double": merged_block})
    return DitAdapter("qwen_image", blocks.describe(), blocks.count, int(dm.patch_size))


def merged_block(args: dict, extra: dict, block: Callable[[dict], dict]) -> dict:
    """Block: img [image (N); references (R)] merged to (B, D+R, C); pe rows gathered at T."""
    ctx = block_context(args, extra)
    if ctx is None or not ctx.merge:
        return block(args)
    g, img, text_len = ctx.geometry, args["img"], args["txt"].shape[1]
    if not tokens_match(ctx, img.shape[1], g.tokens + g.extra_tokens):
        return block(args)
    return merged_dit_block(args, block, ctx, SLOT, 0, (Rows("pe", 1, text_len),), text_len + img.shape[1])
