"""The cost model's prediction of what a merged call gains (min_tokens "auto" and the run line's
predicted gains, gain.py).

Predicted (`CostProfile`): the cost model's view of a patched model (toma_core.cost), read once, when
the node runs, from the diffusion model's own modules by the family's CostModel (its registry entry):
`DitCost` for a DiT (its width and block lists; the adapter says how many blocks the setting
merges), families/unet_cost.py for the UNet. A call's `Prediction` is its speed-up for the family's
width, the call's token count and the plan's tile (tile_size^2 x tile_frames tokens), and the range
the model's measured error leaves it in (toma_core.cost.call_speedup_range: the merged blocks within
12 % and the plan within a factor 2.5 of their CPU calibrations; no lower bound on a device the model
was not calibrated on, such as a GPU).

Per attention kernel (toma_core/kernels.py): a call's prediction prices the kernel the call runs
(nodes/machinery/kernel_choice.py run_kernel; None, an unknown one, as the device's default: SDPA on
a GPU, matmuls on a CPU) and the keys/values form it runs there (toma_core/keys_values.py choose_form),
and `scope` auto keeps the family's keys_values only where it pays on the patch's kernel (scope_for_kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from ...toma_core.cost import BlockCost, call_speedup, call_speedup_range
from ...toma_core.cost_constants import HEAD_WIDTH, TILE_TOKENS
from ...toma_core.keys_values import choose_form
from ...toma_core.kernels import KERNELS, MATMUL, Kernel
from ..contract import CallGeometry
from ..settings import ToMASettings

AUTO_MIN_SPEEDUP = 1.05
"""min_tokens "auto": a call merges only when its speed-up is at least this (a few percent)."""

KV_MIN_SPEEDUP = 1.1
"""scope "auto": a family's keys_values scope is kept on a kernel where its merged call at
SCOPE_REFERENCE_TOKENS is predicted at least this fast; below, the block merge runs (the scope study's
keys_values rows were chosen at >= 1.1x, docs/quality.md)."""

SCOPE_REFERENCE_TOKENS = 32_760
"""Image tokens of the call scope "auto" prices: Wan 480p x 81 frames (21 x 30 x 52), the smallest
call of the video templates that run keys_values."""


def default_kernel(device: str) -> Kernel:
    """The kernel a call with no known kernel is priced at: SDPA's on a GPU, a CPU's matmuls."""
    return KERNELS["sdpa" if device == "cuda" else MATMUL]


def on_kernel(blocks: tuple[BlockCost, ...], kernel: Kernel | None, device: str) -> tuple[BlockCost, ...]:
    """`blocks` priced on `kernel` (None: default_kernel) in the keys/values form choose_form picks
    there: every key is an image key where the text does not join the attention (Wan, Kandinsky 5, UNet attn1)."""
    chosen = kernel or default_kernel(device)
    return tuple(replace(b, kernel=chosen, form=choose_form(chosen, b.head, not b.joint)) for b in blocks)


@dataclass(frozen=True)
class Prediction:
    """The cost model's speed-up of a call (unmerged / merged time) and the range [low, high] its
    measured error leaves it in (toma_core.cost.call_speedup_range)."""

    speedup: float
    low: float
    high: float

    @property
    def merge(self) -> bool:
        """The prediction alone merges the call."""
        return self.speedup >= AUTO_MIN_SPEEDUP

    @property
    def close(self) -> bool:
        """The range holds AUTO_MIN_SPEEDUP: within its error the model cannot tell whether merging pays."""
        return self.low < AUTO_MIN_SPEEDUP <= self.high


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
    _cache: dict[tuple[int, int, str, int, str], Prediction] = field(default_factory=dict, repr=False)

    def predict(self, tokens: int, others: int, device: str = "cpu", batch: int = 1, kernel: Kernel | None = None) -> Prediction:
        """The Prediction of a call of batch `batch`, N = `tokens` image tokens and `others` text and
        pass-through tokens, on a device of type `device` ("cpu", "cuda", ...) whose attention runs
        on `kernel` (None: default_kernel)."""
        key = (tokens, others, device, batch, kernel.name if kernel else "")
        if key not in self._cache:
            args = (on_kernel(self.blocks, kernel, device), tokens, others, self.kept, device, batch, self.tile_tokens)
            self._cache[key] = Prediction(call_speedup(*args), *call_speedup_range(*args))
        return self._cache[key]

    def speedup(self, tokens: int, others: int, device: str = "cpu", batch: int = 1, kernel: Kernel | None = None) -> float:
        """Predicted unmerged / merged time of such a call (Prediction.speedup)."""
        return self.predict(tokens, others, device, batch, kernel).speedup

    def auto_veto(self, geometry: CallGeometry, device: str, batch: int, kernel: Kernel | None = None) -> str | None:
        """The prediction's decision for this call on `device` and `kernel`: why it runs unmerged, or
        None when merging is predicted to pay (auto_call_veto measures instead where the prediction is close)."""
        predicted = self.speedup(geometry.tokens, geometry.others, device, batch, kernel)
        if predicted >= AUTO_MIN_SPEEDUP:
            return None
        on = f"{device}, {kernel.name}" if kernel else device
        return (
            f"min_tokens auto: merging {geometry.tokens} image tokens at width {self.width} on {on} is predicted "
            f"{predicted:.2f}x (needs {AUTO_MIN_SPEEDUP:g}x; a number in min_tokens forces merging)"
        )

    def keys_values_pays(self, kernel: Kernel | None, device: str) -> tuple[bool, float]:
        """Whether this keys_values profile's merged call at SCOPE_REFERENCE_TOKENS (no text: the
        families that run keys_values by default take their text by cross-attention) is predicted at
        least KV_MIN_SPEEDUP on `kernel` and `device`, and that prediction."""
        predicted = self.speedup(SCOPE_REFERENCE_TOKENS, 0, device, 1, kernel)
        return predicted >= KV_MIN_SPEEDUP, predicted


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
        head = head_width(getattr(diffusion_model, self.blocks[0]), width)
        blocks = (
            BlockCost(width, merged, joint=self.joint, merged=True, scope=settings.scope, head=head),
            BlockCost(width, max(0, total - merged), joint=self.joint, head=head),
        )
        return CostProfile(blocks, width, 1.0 - settings.effective_ratio, tile_tokens(settings, video))


def head_width(blocks: torch.nn.Module, width: int) -> int:
    """The head size e of the attention in `blocks` (the keys/values scope pads it): the first
    submodule's `head_dim`, else `width` over its head count (num_heads, heads or n_heads, as
    ComfyUI's attention classes name it); HEAD_WIDTH when none says."""
    for module in blocks.modules():
        size = getattr(module, "head_dim", None)
        if isinstance(size, int) and size > 0:
            return size
        for name in ("num_heads", "heads", "n_heads"):
            count = getattr(module, name, None)
            if isinstance(count, int) and count > 0 and width % count == 0:
                return width // count
    return HEAD_WIDTH


def tile_tokens(settings: ToMASettings, video: bool) -> int:
    """Tokens per plan tile: tile_size^2, times tile_frames in a video family (the plan's cost grows with it)."""
    return settings.tile_size ** 2 * (settings.tile_frames if video else 1)
