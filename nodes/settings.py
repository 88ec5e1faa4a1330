"""User settings of a ToMA patch, validated once at node time.

Pure Python + toma_core (no ComfyUI), so it is unit-tested everywhere. Every bad value raises a
ValueError that names the value and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..toma_core import (
    BUDGETS,
    FACILITY,
    SIMILARITIES,
    UNMERGES,
    MergeSchedule,
    check_destinations,
    check_ratio,
    kept_per_tile,
)

TOMA_KEY = "comfyui_toma"
"""Pack-unique key: wrappers, the per-run state in transformer_options, log prefixes."""

CALL_KEY = "comfyui_toma_call"
"""transformer_options key of the per-model-call context (set by the APPLY_MODEL wrapper)."""

KEYS_VALUES = "keys_values"
AUTO_SCOPE = "auto"
SCOPES = (AUTO_SCOPE, "block", "attention", KEYS_VALUES)
"""auto: the scope the model's family merges best at a given speed-up (families/registry.py
Family.scope, chosen from docs/quality.md's scope study), resolved when the node patches a model.
block: whole transformer blocks run on merged tokens. attention: only attention runs merged (UNet:
attn1/attn2; Flux family: double blocks' attention, single blocks whole, as the reference code).
keys_values: every token keeps its query, residual and MLP; only the keys and values of the image
tokens in self-attention are merged, nothing is unmerged (machinery/keys_values.py)."""

NODE_SCOPE = AUTO_SCOPE
"""The nodes' scope: each family's own (registry.py Family.scope). ToMASettings keeps "block"."""

NODE_RATIO = 0.75
NODE_TILE_SIZE = 8
NODE_START_PERCENT = 0.2
"""The basic node's defaults (ratio, tile_size, start_percent; end 1, every step, re-select every step),
with `blocks` auto the later half of the model (machinery/dit_blocks.py, families/unet_blocks.py).

Chosen by bench/speed/defaults_search.py (docs/defaults.md): of the settings whose end-to-end
speed-up predicted by the real-size cost model (bench/speed/realsize.py) is at least the previous
defaults' (ratio 0.5, tile 8, from 0.4, every block but the first five: 1.36x on Flux.1-dev at 20 steps
and 1.33x on SDXL at 30 steps, CFG, 1024 x 1024), the best mean PSNR on the trained Flux and SDXL
fixtures with SSIM >= 0.95 on both. Merging fewer, later blocks harder and earlier in the run keeps more
than merging nearly every block gently from 40 %. ToMASettings and MergeSchedule keep the paper's
every-step schedule and tile 4 (the library defaults)."""

RATIO_TOLERANCE = 0.02
"""A tile's rounding that moves the merged share by more than this is said in the log (settings.notes)."""
TILE_SIZE_RANGE = (2, 32)
"""Tile 1 would keep every token (one token per tile): a silent no-op, so it is refused."""
TEMPERATURE_RANGE = (0.0, 1.0)
MIN_TOKENS_RANGE = (0, 1 << 20)
AUTO = "auto"
NODE_MIN_TOKENS = AUTO
"""The nodes' default min_tokens: a call merges only where the cost model predicts a gain
(run/prediction.py AUTO_MIN_SPEEDUP), or, where that prediction is within its error of break-even, where
the run measures one (run/judge.py judge). ToMASettings keeps 0 (always merge), as the library's default."""
TILE_FRAMES_RANGE = (1, 16)

NODE_TILE_FRAMES = 4
"""Latent frames a video tile spans by default (the video families: Wan, HunyuanVideo, Kandinsky 5), so
a token may merge with its neighbours in the next frames. Chosen by the video quality study on
the trained Wan fixture (2 and 4 frames tie within 0.2 dB at every ratio, ahead of 1 frame at ratios
0.25 and 0.5), with a study of camera pans over photographs (at ratio 0.5, 4 frames no worse than 2
at any pan speed); both scripts have left main, docs/video.md says where they are and has the figures."""


@dataclass(frozen=True)
class ToMASettings:
    """Everything a ToMA node configures.

    ratio: share of image tokens merged away (N -> D = about N * (1 - ratio)).
    tile_size: tile side in tokens; destinations are picked per t x t tile.
    schedule: sigma window, merge-step interval and re-selection interval (toma_core.MergeSchedule).
    blocks: which blocks merge; "auto", "all" or a family-specific list (parsed per family).
    min_tokens: a forward with fewer image tokens than this runs unmerged (0 = always merge);
    "auto": a forward merges only where the cost model predicts a gain (run/gain.py).
    similarity: one of toma_core.SIMILARITIES. temperature: softmax temperature of the
    token -> destination assignment (0 = hard). budget: one of toma_core.BUDGETS ("tile": every
    tile keeps the same share, as in the paper; "adaptive": the same total per sample, shared out
    by content). proportional_attention: add log(cluster size) to each merged key's attention
    logits (Flux family only). scope: one of SCOPES. verbose: log per-call detail. unmerge: one of
    toma_core.UNMERGES (how a merged block's result returns to N tokens). tile_frames: latent
    frames a tile spans in video models (Wan, HunyuanVideo); image models ignore it. key_mass: scope
    keys_values weighs each merged key by the tokens it stands for (its log-mass in the softmax,
    toma_core/keys_values.py; on the Wan fixture at the node's start_percent 0.4 it keeps 2-4 dB
    more, docs/video.md); False only to measure what that weight buys. scope "auto" is resolved per
    family when a model is patched (registry.py Family.resolve). destinations: one of
    toma_core.DESTINATIONS ("output_similarity": plans from the planning block's output at the previous
    model call, run/destinations.py); destination_penalty: the selection-frequency penalty (toma_core/destinations.py).
    """

    ratio: float = 0.5
    tile_size: int = 4
    schedule: MergeSchedule = field(default_factory=MergeSchedule)
    blocks: str = "auto"
    min_tokens: int | str = 0
    similarity: str = "cosine"
    temperature: float = 1e-3
    budget: str = "tile"
    proportional_attention: bool = False
    scope: str = "block"
    verbose: bool = False
    unmerge: str = "delta"
    tile_frames: int = NODE_TILE_FRAMES
    key_mass: bool = True
    destinations: str = FACILITY
    destination_penalty: float = 0.0

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        _check_int("tile_size", self.tile_size, *TILE_SIZE_RANGE, "tokens per tile side")
        object.__setattr__(self, "min_tokens", parse_min_tokens(self.min_tokens))
        _check_range("temperature", self.temperature, *TEMPERATURE_RANGE, "0 = hard assignment")
        _check_int("tile_frames", self.tile_frames, *TILE_FRAMES_RANGE, "latent frames per video tile")
        if not isinstance(self.schedule, MergeSchedule):
            raise ValueError(f"schedule={self.schedule!r} must be a toma_core.MergeSchedule")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity={self.similarity!r} is not one of {', '.join(SIMILARITIES)}")
        if self.budget not in BUDGETS:
            raise ValueError(f"budget={self.budget!r} is not one of {', '.join(BUDGETS)}")
        if self.unmerge not in UNMERGES:
            raise ValueError(f"unmerge={self.unmerge!r} is not one of {', '.join(UNMERGES)}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope!r} is not one of {', '.join(SCOPES)}")
        check_blocks_text(self.blocks)
        check_destinations(self.destinations, self.destination_penalty)
        for name in ("verbose", "proportional_attention", "key_mass"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")

    @property
    def merges(self) -> bool:
        """False when no token can ever be merged (ratio 0 or an empty sigma window)."""
        return self.ratio > 0 and self.schedule.end_percent > self.schedule.start_percent

    @property
    def token_floor(self) -> int:
        """min_tokens as a number of image tokens (0 for "auto", which the cost model decides per call)."""
        return 0 if self.min_tokens == AUTO else self.min_tokens

    @property
    def effective_ratio(self) -> float:
        """The share of a full tile's tokens merged away: each tile keeps
        round(n * (1 - ratio)) >= 1 of its n = tile_size^2 (x tile_frames) tokens (toma_core.kept_per_tile)."""
        tile = self.tile_size ** 2
        return 1.0 - kept_per_tile(tile, self.ratio) / tile

    def notes(self) -> list[str]:
        """Values the pack changes or cannot honour, each with how to fix it (logged once per patch)."""
        notes = []
        effective, s = self.effective_ratio, self.schedule
        if self.ratio > 0 and abs(effective - self.ratio) > RATIO_TOLERANCE:
            tile = self.tile_size ** 2
            notes.append(
                f"ratio {self.ratio:g} at tile_size {self.tile_size} merges {effective:.2f} of the tokens "
                f"(each {self.tile_size}x{self.tile_size} tile keeps {kept_per_tile(tile, self.ratio)} of its "
                f"{tile}); {_tile_hint(self.ratio)}"
            )
        if s.start_percent > s.end_percent:
            notes.append(
                f"start_percent {s.start_percent:g} is above end_percent {s.end_percent:g}: the merge window "
                "is empty and ToMA merges nothing; set start_percent below end_percent"
            )
        return notes

    def describe(self) -> str:
        """Short text of the settings for the per-run log line."""
        s = self.schedule
        return (
            f"ratio {self.ratio:g}, tile {self.tile_size}, budget {self.budget}, blocks {self.blocks}, "
            f"{'' if self.scope == 'block' else f'scope {self.scope}, '}"
            f"{'proportional attention, ' if self.proportional_attention else ''}"
            f"{'' if self.unmerge == 'delta' else f'unmerge {self.unmerge}, '}"
            f"{'' if self.destinations == FACILITY else f'destinations {self.destinations}, '}"
            f"{f'destination penalty {self.destination_penalty:g}, ' if self.destination_penalty else ''}"
            f"window {s.start_percent:g}-{s.end_percent:g}, merge every {s.merge_every}, "
            f"recompute every {s.recompute_every}"
        )


def check_blocks_text(value: object) -> None:
    """ValueError unless `blocks` is a non-empty string; its list is parsed per family
    (machinery/block_lists.py), once the model is known."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"blocks={value!r} must be a non-empty string: 'auto', 'all' or a block list")


def parse_min_tokens(value: object) -> int | str:
    """"auto" (any case, as a widget's text) or a whole number of image tokens in MIN_TOKENS_RANGE
    (an int, or its text: a saved workflow's number); ValueError naming the value otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        value = int(text) if text.isdigit() else text
    low, high = MIN_TOKENS_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"min_tokens={value!r} must be 'auto' or an integer in [{low}, {high}] (image tokens; 0 = always merge)"
        )
    return value


def _tile_hint(ratio: float) -> str:
    """The smallest tile_size whose tiles reach `ratio` within RATIO_TOLERANCE, as advice."""
    for size in range(TILE_SIZE_RANGE[0], TILE_SIZE_RANGE[1] + 1):
        tile = size * size
        if abs(1.0 - kept_per_tile(tile, ratio) / tile - ratio) <= RATIO_TOLERANCE:
            return f"tile_size {size} reaches it"
    return "no tile size reaches it exactly"


def _check_range(name: str, value: float, low: float, high: float, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} is outside [{low:g}, {high:g}] ({meaning})")


def _check_int(name: str, value: int, low: int, high: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} must be an integer in [{low}, {high}] ({meaning})")
