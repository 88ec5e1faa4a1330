"""The cost model's view of a UNet (SDXL, SD1.x, SD2.x), the UNet family's CostModel (registry.py):
every BasicTransformerBlock at its level (unet_sites.find_sites), merged when the `blocks` setting
selects it, and every ResBlock, which runs at full N (convolutions priced at 2 flops per parameter
and output position; the stacks' proj_in / proj_out are left out)."""

from __future__ import annotations

import torch

from ...toma_core.cost import BlockCost
from ...toma_core.cost_constants import LINEAR_UNET
from ..run.prediction import CostProfile, head_width, tile_tokens
from ..settings import ToMASettings
from .unet_blocks import parse_unet_blocks
from .unet_sites import find_sites, levels


class UNetCost:
    """Prices a UNet level by level (a contract for prediction.CostModel)."""

    def profile(self, diffusion_model: torch.nn.Module, merged_blocks: int, settings: ToMASettings, video: bool) -> CostProfile:
        """merged_blocks is unused: which transformer blocks merge is read per site from the setting."""
        from comfy.ldm.modules.diffusionmodules.openaimodel import ResBlock

        spec = parse_unet_blocks(settings.blocks)
        sites = find_sites(diffusion_model)
        blocks = [
            BlockCost(_site_width(s.module), share=1.0 / s.downsample ** 2, linear=LINEAR_UNET, joint=False,
                      merged=spec.selects(s.block, s.downsample), scope=settings.scope,
                      head=head_width(s.module.attn1, _site_width(s.module)))
            for s in sites
        ]
        blocks += [
            _conv_cost(layer, 1.0 / downsample ** 2)
            for _, _, layer, downsample in levels(diffusion_model) if isinstance(layer, ResBlock)
        ]
        width = _site_width(sites[0].module) if sites else 0
        return CostProfile(tuple(blocks), width, 1.0 - settings.effective_ratio, tile_tokens(settings, video))


def _site_width(block: torch.nn.Module) -> int:
    norm = getattr(block, "norm1", None)
    shape = getattr(norm, "normalized_shape", None)
    return int(shape[0]) if shape else 0


def _conv_cost(module: torch.nn.Module, share: float) -> BlockCost:
    """A convolution block at full N: 2 flops per parameter and output position (width 1)."""
    params = sum(p.numel() for p in module.parameters())
    return BlockCost(1, share=share, linear=2.0 * params, attention=False, joint=False)
