"""The vocabulary every layer of the node pack shares: what a family's `apply(model_clone, settings)`
returns to the runtime (`FamilyAdapter`), the token layout it reads from a model call
(`CallGeometry`), and why something stays unmerged (`Unmerged`, `layout_changed`). It imports
nothing from the pack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class CallGeometry:
    """Token layout of one model call, as the family sees it from the model inputs.

    height x width: the image-token grid at the model's input resolution (Flux: after the 2x2
    patchify; UNet: the latent). text_len: T, or None when the call has no text context.
    extra_tokens: reference-image tokens beside the image tokens (after them for Kontext and
    Qwen-Image-Edit, before them for HunyuanVideo's reference latent); they pass through.
    reason: when set, the whole call runs unmerged and the reason is counted.
    frames: latent frames of a video DiT (tokens are t-major: frame, row, column).
    """

    height: int
    width: int
    text_len: int | None = None
    extra_tokens: int = 0
    reason: str | None = None
    frames: int = 1

    @property
    def tokens(self) -> int:
        """N, image tokens of the main grid (frames x height x width)."""
        return self.frames * self.height * self.width

    @property
    def others(self) -> int:
        """Tokens beside the N image tokens that the blocks also run on: T text plus the pass-through
        extra_tokens (what the cost model and the call timer count besides N)."""
        return (self.text_len or 0) + self.extra_tokens


class FamilyAdapter(Protocol):
    """What a model family's `apply(model, settings)` returns to the shared runtime."""

    family: str
    """Family name for logs: "flux", "unet", ..."""

    blocks: str
    """Canonical text of the selected blocks, for the log line."""

    num_blocks: int
    """How many blocks (Flux) or block groups (UNet) are selected."""

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Geometry of a call from BaseModel.apply_model's inputs: x (B, C, H, W) noisy latent,
        context (B, T, C_txt) text conditioning, kwargs the extra conds (ref_latents, attention_mask, ...)."""
        ...


@dataclass(frozen=True)
class Unmerged:
    """Why something stays unmerged, in place of the merged result a function would return.

    reason: counted under it in the run's log line; None: there was nothing to merge (not counted).
    layout: the block's inputs are not laid out as its adapter relies on (where the image span is,
    a per-token table's shape, a keyword the layer receives, a modulation span): ComfyUI changed
    under the pack. Besides the count, such a reason is warned about once, naming the ComfyUI
    version (machinery/runner.py run_hook).
    result: the block's own result when it already ran exactly as unpatched (a keys/values run whose
    attention was never reached): run_hook returns it instead of running the block again.
    """

    reason: str | None
    layout: bool = False
    result: Any = field(default=None, compare=False)


def layout_changed(reason: str) -> Unmerged:
    """An Unmerged for a block whose inputs break the layout its adapter checks (see Unmerged.layout)."""
    return Unmerged(reason, layout=True)


TOKENS_DIFFER = layout_changed("image tokens differ from the latent grid")
"""A block saw another token count than the call's geometry predicts."""

NOTHING_TO_MERGE = Unmerged(None)
"""Nothing to merge in this block (no rope table to gather, a plan that keeps every token): it runs
as it is, uncounted."""
