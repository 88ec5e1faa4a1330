"""The cost model's view of a patched model (toma_core.cost), and `min_tokens = "auto"`: a model
call merges only where the model predicts a gain of at least AUTO_MIN_SPEEDUP for that family's
width, that call's token count and the plan's tile (tile_size^2 x tile_frames tokens). A predicted
gain is then checked by measurement during the run (call_timing.CallTimer.auto_stop, wrappers.py):
the model is calibrated on a CPU only.

The profile is read once, when the node runs, from the diffusion model's own modules, by the
family's CostModel (its registry entry, registry.py): `DitCost` for a DiT (its width and block
lists; the adapter says how many blocks the setting merges), families/unet_cost.py for the UNet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ...toma_core.cost import TILE_TOKENS, BlockCost, call_speedup
from ..contract import CallGeometry
from ..settings import ToMASettings

AUTO_MIN_SPEEDUP = 1.05
"""min_tokens "auto": a call merges only when its predicted speed-up is at least this (a few percent)."""


@dataclass
class CostProfile:
    """The blocks of one patched model for the cost model, with a per-geometry cache of predictions.

    width: the width reported in log lines (a UNet's first transformer level). tile_tokens: tokens
    per plan tile, tile_size^2 (x tile_frames in a video family): the plan's cost grows with it.
    """

    blocks: tuple[BlockCost, ...]
    width: int
    kept: float
    tile_tokens: int = TILE_TOKENS
    _cache: dict[tuple[int, int, str, int], float] = field(default_factory=dict, repr=False)

    def speedup(self, tokens: int, others: int, device: str = "cpu", batch: int = 1) -> float:
        """Predicted unmerged / merged time of a call of batch `batch`, N = `tokens` image tokens and
        `others` text and pass-through tokens, on a device of type `device` ("cpu", "cuda", ...)."""
        key = (tokens, others, device, batch)
        if key not in self._cache:
            self._cache[key] = call_speedup(self.blocks, tokens, others, self.kept, device, batch, self.tile_tokens)
        return self._cache[key]

    def auto_veto(self, geometry: CallGeometry, device: str, batch: int) -> str | None:
        """min_tokens "auto": why this call runs unmerged on `device`, or None when merging is predicted to pay."""
        predicted = self.speedup(geometry.tokens, (geometry.text_len or 0) + geometry.extra_tokens, device, batch)
        if predicted >= AUTO_MIN_SPEEDUP:
            return None
        return (
            f"min_tokens auto: merging {geometry.tokens} image tokens at width {self.width} on {device} is predicted "
            f"{predicted:.2f}x (needs {AUTO_MIN_SPEEDUP:g}x; a number in min_tokens forces merging)"
        )


class CostModel(Protocol):
    """How a family's blocks are priced: each registry entry (registry.py Family.cost) holds one."""

    def profile(self, diffusion_model: torch.nn.Module, merged_blocks: int, settings: ToMASettings, video: bool) -> CostProfile:
        """The CostProfile of a patched model whose adapter merges `merged_blocks` of its blocks; a
        `video` family's tiles span settings.tile_frames frames."""
        ...


@dataclass(frozen=True)
class DitCost:
    """The cost model's view of a DiT family: `width`, the attribute of ComfyUI's model class holding
    the block width C; `blocks`, the ModuleList attributes of its blocks on image tokens (the ones
    `blocks` selects and any others, e.g. Lumina2's noise refiner, priced at full N); `joint`: its
    text joins the blocks' self-attention (False: cross-attention, as Wan and Kandinsky 5)."""

    width: str
    blocks: tuple[str, ...]
    joint: bool = True

    def profile(self, diffusion_model: torch.nn.Module, merged_blocks: int, settings: ToMASettings, video: bool) -> CostProfile:
        width = getattr(diffusion_model, self.width)
        total = sum(len(getattr(diffusion_model, name)) for name in self.blocks)
        merged = min(merged_blocks, total)
        whole = settings.scope == "block"
        blocks = (
            BlockCost(width, merged, joint=self.joint, merged=True, whole=whole),
            BlockCost(width, max(0, total - merged), joint=self.joint),
        )
        return CostProfile(blocks, width, 1.0 - settings.effective_ratio, tile_tokens(settings, video))


def tile_tokens(settings: ToMASettings, video: bool) -> int:
    """Tokens per plan tile: tile_size^2, times tile_frames in a video family (the plan's cost grows with it)."""
    return settings.tile_size ** 2 * (settings.tile_frames if video else 1)
