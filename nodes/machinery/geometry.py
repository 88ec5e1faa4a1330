"""Token geometry of a DiT call from BaseModel.apply_model's inputs, and the adapter that DiT
families hand the runtime (`DitAdapter`, a contract.FamilyAdapter).

Every DiT here patchifies the latent p x p with padding, so the main image grid is
h = ceil(H / p), w = ceil(W / p), whatever the latent's layout: (B, C, H, W), or Qwen-Image's
(B, C, 1, H, W). Reference latents (Flux Kontext, Qwen-Image-Edit: kwargs["ref_latents"], each
(b, C[, 1], h', w')) add ceil(h'/p) * ceil(w'/p) tokens after the image; they pass through
unmerged. A video latent (T > 1) is not an image grid: such a call runs unmerged with the reason
(the video families read their own geometry: families/wan.py, families/hunyuan_video.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...toma_core.video import Segment
from ..contract import CallGeometry, Unmerged


def text_length(context: torch.Tensor | None) -> int | None:
    """T of a text conditioning (B, T, C_txt), or None."""
    return int(context.shape[1]) if torch.is_tensor(context) and context.ndim == 3 else None


def image_grid(x: torch.Tensor, patch: int) -> tuple[int, int] | Unmerged:
    """(h, w) token grid of a latent (B, C, H, W) or (B, C, 1, H, W); Unmerged otherwise."""
    if x.ndim == 5 and x.shape[2] == 1 or x.ndim == 4:
        return math.ceil(x.shape[-2] / patch), math.ceil(x.shape[-1] / patch)
    return Unmerged(f"latent of shape {tuple(x.shape)} is not an image (B, C, H, W)")


def reference_tokens(refs: list[torch.Tensor] | None, patch: int) -> int:
    """Tokens of the reference latents appended after the image tokens (each (b, C[, t], h', w'))."""
    return sum(math.prod(r.shape[2:-2]) * math.ceil(r.shape[-2] / patch) * math.ceil(r.shape[-1] / patch) for r in refs or [])


@dataclass(frozen=True)
class DitAdapter:
    """The runtime's view of a patched DiT (a contract.FamilyAdapter).

    refs_key: the apply_model keyword holding reference latents appended after the image tokens
    (None: the family has none).
    """

    family: str
    blocks: str
    num_blocks: int
    patch_size: int
    refs_key: str | None = "ref_latents"

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Grid of x (B, C[, 1], H, W), T of context (B, T, C_txt), reference tokens from kwargs."""
        text_len = text_length(context)
        grid = image_grid(x, self.patch_size)
        if isinstance(grid, Unmerged):
            return CallGeometry(1, 1, text_len, 0, grid.reason)
        refs = kwargs.get(self.refs_key) if self.refs_key else None
        return CallGeometry(grid[0], grid[1], text_len, reference_tokens(refs, self.patch_size))


@dataclass(frozen=True)
class VideoGeometry(CallGeometry):
    """CallGeometry of a video DiT call whose blocks see frame segments (Wan, Kandinsky 5): `frames`
    video frames of height x width tokens (N = tokens), plus pass-through frames (Wan's Fun reference
    before, Phantom after); `segments` in token order (toma_core.video.Segment). tail: tokens after
    every frame that are no frame of this grid (Wan's Bernini `context_latents`, each its own grid);
    they pass through and are counted in extra_tokens too."""

    segments: tuple[Segment, ...] = ()
    tail: int = 0

    @property
    def all_frames(self) -> int:
        return sum(s.frames for s in self.segments)
