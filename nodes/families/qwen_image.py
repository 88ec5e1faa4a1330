"""ToMA for Qwen-Image and Qwen-Image-Edit (`comfy.ldm.qwen_image.model.QwenImageTransformer2DModel`).

Its 60 blocks are `patches_replace["dit"]` ("double_block", i) keys with args img (B, N+R, C),
txt (B, T, C), vec (B, D) and pe (B, T+N+R, 1, hd/2, 2, 2), text rows first (as
QwenImageTransformer2DModel._forward passes them). The block runs on [M img; references]; merged tokens take their destinations'
pe rows at [T, T+N). There is no text mask (ComfyUI never passes one) and no in-place write.

Edit: reference-image tokens (`reference_latents`, R tokens after the image) pass through
unmerged with their pe rows. With CFG and a reference on the positive only, cond and uncond run
as separate calls of different length; geometry (and the plan) is per call. The latent
is 5-D (B, 16, 1, H, W); the grid is ceil(H / 2) x ceil(W / 2).
"""

from __future__ import annotations

from ..contract import TOKENS_DIFFER, Unmerged
from ..machinery.dit_blocks import parse_dit_blocks
from ..machinery.dit_runner import ImageSpan, Rows, merged_dit_block
from ..machinery.geometry import DitAdapter
from ..machinery.hooks import install_dit_hooks
from ..machinery.scope import require_block_scope
from ..runtime import CallContext
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


def image_span(args: dict, ctx: CallContext) -> ImageSpan | Unmerged:
    """Block: img [image (N); references (R)] merged to (B, D+R, C); pe rows gathered at T."""
    g, img, text_len = ctx.geometry, args["img"], args["txt"].shape[1]
    if img.shape[1] != g.tokens + g.extra_tokens:
        return TOKENS_DIFFER
    return ImageSpan(0, (Rows("pe", 1, text_len),), text_len + img.shape[1])


merged_block = merged_dit_block(SLOT, image_span)
