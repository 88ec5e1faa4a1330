"""Per-span modulation under merging: row boundaries moved past merged image rows.

ComfyUI 0.33 modulates spans of a block's tokens differently (reference tokens at timestep zero):
comfy.ldm.flux.layers.apply_mod takes `modulation_dims` spans [(first, end, index)],
comfy.ldm.qwen_image.model.QwenImageTransformerBlock a `timestep_zero_index` N, NextDiT's layers
`timestep_zero_index` ranges, HunyuanVideo `modulation_dims` with an open end (None). A merged
block holds the N image rows at `start` as D rows, so every boundary moves: one at or before
`start` stays, one at or after start + N shifts by D - N, one at a frame-segment end of a video
plan goes to its merged end; a boundary anywhere else inside the image rows has no merged row,
and the block runs unmerged (`contract.layout_changed`).

Where the spans reach the block in its replace args (HunyuanVideo) or in the forward patch that
merges (Lumina2), the family moves them before merging (`moved_spans`). Where they reach only the
block's forward as a keyword, after ComfyUI's wrapper (Flux, Qwen-Image), the merged run puts its
`RowMove` in a copy of transformer_options (`with_move`) and an object patch of the block's
forward (`span_forward`) moves the keyword. A boundary cut there raises `SpansCut` before the
block runs; the merged run catches it (runner.py `unless_cut`) and the block runs unmerged:
nothing ran on the merged tokens, and the block's inputs are untouched. The forward patch also
notes in those options that it moved the spans (MOVED_KEY): when another node's object patch of
the same forward replaced ToMA's after it was installed, nothing moved them, and `unless_cut`
discards the merged result (NOT_MOVED: the block runs again unmerged, with the layout reason)
rather than keep rows modulated as other rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...toma_core import MergePlan
from ...toma_core.video import SegmentPlan
from ..contract import Unmerged, layout_changed
from .hooks import module_forward

MOVE_KEY = "toma_row_move"
"""transformer_options key of a merged block run: its RowMove, for the block's forward patch."""

MOVED_KEY = "toma_row_moved"
"""transformer_options key beside MOVE_KEY: a list the forward patch appends to once it moved the spans."""

NOT_MOVED = layout_changed("modulation spans not moved: another node patched the block's forward after ToMA")
"""A merged run whose block forward never saw ToMA's forward patch (see the module docstring)."""


@dataclass(frozen=True)
class RowMove:
    """N = `tokens` rows at `start` merged to D = `kept` rows; ends: {row: merged row} of the
    frame-segment ends inside them (a video plan merges each segment on its own)."""

    start: int
    tokens: int
    kept: int
    ends: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, plan: MergePlan, start: int) -> RowMove:
        """The move of the image rows at `start` that `plan` merges (its segments' ends included)."""
        parts = plan.parts if isinstance(plan, SegmentPlan) else [plan]
        ends, tokens, kept = [], start, start
        for part in parts[:-1]:
            tokens, kept = tokens + part.num_tokens, kept + part.num_kept
            ends.append((tokens, kept))
        return cls(start, plan.num_tokens, plan.num_kept, tuple(ends))

    def row(self, bound: int) -> int | None:
        """The merged row of boundary `bound`; None when it lies inside merged rows."""
        if bound <= self.start:
            return bound
        if bound >= self.start + self.tokens:
            return bound - self.tokens + self.kept
        return dict(self.ends).get(bound)


class SpansCut(Exception):
    """Raised by a forward patch before its block runs: the spans it received cannot follow the
    merge. `unmerged`: the layout reason the merged run returns instead."""

    def __init__(self, unmerged: Unmerged):
        super().__init__(unmerged.reason)
        self.unmerged = unmerged


CUT = "{name} boundary {bound} inside a merged frame segment"
"""The layout reason of a span boundary inside the merged image rows (an image is one segment)."""


def moved_spans(spans, move: RowMove, name: str, cut: str = CUT) -> list[tuple] | Unmerged:
    """Spans [(first, end[, ...])] over rows merged by `move`, moved to the merged rows (an open end
    None stays None, further items stay). A malformed span, or a boundary inside the merged rows
    (reason `cut`, formatted with `name` and the boundary): layout_changed."""
    if not isinstance(spans, (tuple, list)) or not all(isinstance(s, (tuple, list)) and len(s) >= 2 for s in spans):
        return layout_changed(f"{name} is not a list of spans")
    bounds = [[b if b is None else move.row(b) for b in span[:2]] for span in spans]
    inside = [a for span, moved in zip(spans, bounds) for a, b in zip(span[:2], moved) if b is None and a is not None]
    if inside:
        return layout_changed(cut.format(name=name, bound=inside[0]))
    return [(*moved, *span[2:]) for span, moved in zip(spans, bounds)]


def with_move(options: dict | None, move: RowMove) -> dict:
    """A copy of a block's transformer_options carrying `move` for its forward patch, and the list
    the patch notes the move in."""
    return dict(options or {}, **{MOVE_KEY: move, MOVED_KEY: []})


def span_forward(module, foreign: Callable | None, move_keywords: Callable[[RowMove, dict], dict]) -> Callable:
    """The object patch of one block's forward: under a merged run (MOVE_KEY in the transformer_options
    keyword) its keyword arguments become move_keywords(move, kwargs), which raises SpansCut when
    they cannot move; every other run passes through as it is (foreign: see hooks.module_forward)."""
    run = module_forward(module, foreign)

    def toma_forward(*args, **kwargs):
        options = kwargs.get("transformer_options") or {}
        move = options.get(MOVE_KEY)
        if move is not None:
            kwargs = move_keywords(move, kwargs)
            options[MOVED_KEY].append(move)
        return run(*args, **kwargs)

    return toma_forward


def moved_keyword(move: RowMove, kwargs: dict, keyword: str, name: str, cut: str = CUT) -> dict:
    """kwargs with the spans of `keyword` moved (see moved_spans); SpansCut when missing or cut."""
    if kwargs.get(keyword) is None:
        raise SpansCut(layout_changed(f"{name} the block does not receive as {keyword}"))
    spans = moved_spans(kwargs[keyword], move, name, cut)
    if isinstance(spans, Unmerged):
        raise SpansCut(spans)
    return kwargs | {keyword: spans}
