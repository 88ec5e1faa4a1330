"""A merged run of one block whose image tokens are a span of one argument, for the DiT families:
Qwen-Image and SD3 double blocks (image stream `img` = [image; references] beside the text stream
`txt`), HunyuanVideo's double and single blocks, Wan's blocks, Lumina2's layers, HiDream's and Kandinsky 5's blocks.

    x = seq[:, start:start+N]                  the main image grid (B, N, C)
    block(seq with M x in place of x, every per-token table gathered to the destinations)
    seq' = out with x + U(out_span - M x) in place of the span

A family says where its image tokens are (`ImageSpan`: their start in the sequence, the frame
segments of a video grid) and where its per-token tables are (`Rows`: which argument, its token
axis, where the image rows start in it and whether it is a key mask, whose last axis only is per
token); `run_merged` does the rest. A table of an unexpected shape runs the block unmerged,
counted with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from ...toma_core import MergePlan
from ...toma_core.video import Segment
from ..contract import Unmerged, layout_changed
from ..run.runtime import CallContext
from .hooks import MergedBlock
from .merge import features, merge_key_mask, merge_rows, merge_span, unmerge_span
from .skeleton import run_hook
from .spans import unless_cut


@dataclass(frozen=True)
class Rows:
    """A per-token table among a block's arguments: args[key] with tokens on axis `dim`, the N
    image rows starting at `start` (the text length when text comes first). key_mask: an
    additive key mask (B|1, ..., L) whose last axis only is per token."""

    key: str
    dim: int
    start: int
    key_mask: bool = False


@dataclass(frozen=True)
class ImageSpan:
    """Where a block's image tokens and per-token tables are.

    The N image tokens sit at [start, start + N) of the block's sequence (N: `tokens`, or the
    call's main grid when None); tables: its per-token tables, over `length` tokens. segments:
    the frame segments of a video grid, pass-through frames included (None: one plan over the
    h x w grid). more(plan): further merged block arguments, or an Unmerged.
    """

    start: int
    tables: tuple[Rows, ...]
    length: int
    segments: tuple[Segment, ...] | None = None
    more: Callable[[MergePlan], dict | Unmerged] | None = None
    tokens: int | None = None


def image_plan(ctx: CallContext, slot: str, image: torch.Tensor, segments: tuple[Segment, ...] | None = None) -> MergePlan:
    """This call's plan at `slot` of the main grid (or of its frame `segments`), built from image
    (B, N, C) when missing (runtime.CallContext.plan)."""
    g = ctx.geometry
    return ctx.plan(slot, g.height, g.width, lambda: features(image), segments)


def merge_tables(args: dict, tables: tuple[Rows, ...], plan: MergePlan, length: int) -> dict | Unmerged:
    """The per-token tables gathered to the destinations ({key: table}), or why not."""
    n, merged = plan.num_tokens, {}
    for rows in tables:
        table = args.get(rows.key)
        if table is None:
            continue
        if rows.key_mask:
            table = merge_key_mask(table, plan, rows.start, n, length)
            if isinstance(table, Unmerged):
                return table
        elif table.ndim <= rows.dim or table.shape[rows.dim] != length:
            return layout_changed(f"{rows.key} of shape {tuple(table.shape)} does not have {length} rows on axis {rows.dim}")
        else:
            table = merge_rows(table, rows.dim, rows.start, n, plan)
        merged[rows.key] = table
    return merged


R = TypeVar("R")


def run_merged(
    ctx: CallContext, slot: str, seq: torch.Tensor, span: ImageSpan, args: dict, call: Callable[[torch.Tensor, dict], R],
    output: Callable[[R], torch.Tensor], rebuild: Callable[[R, torch.Tensor], R],
) -> R | Unmerged:
    """Run a block on merged image tokens (the `merged` of skeleton.run_hook).

    seq (B, L_seq, C) holds the image tokens where `span` says; args holds the per-token tables.
    call(seq_m, tables) runs the block on the merged sequence with the gathered tables;
    output(out) picks the merged sequence from its result; rebuild(out, seq') puts the unmerged
    sequence back. Returns the rebuilt result, or an Unmerged when a table has another layout or
    the block's forward patch found spans it cannot move (spans.SpansCut; nothing ran).
    """
    n = ctx.geometry.tokens if span.tokens is None else span.tokens
    image = seq[:, span.start:span.start + n]
    plan = image_plan(ctx, slot, image, span.segments)
    merged = merge_tables(args, span.tables, plan, span.length)
    if span.more is not None and not isinstance(merged, Unmerged):
        extra = span.more(plan)
        merged = extra if isinstance(extra, Unmerged) else merged | extra
    if isinstance(merged, Unmerged):
        return merged
    x, x_m, seq_m = merge_span(seq, span.start, n, plan)
    out = unless_cut(lambda: call(seq_m, merged), merged.get("transformer_options"))
    if isinstance(out, Unmerged):
        return out
    return rebuild(out, unmerge_span(output(out), span.start, plan, x, x_m))


def merged_dit_block(slot: str, locate: Callable[[dict, CallContext], ImageSpan | Unmerged]) -> MergedBlock:
    """The merged run of a dit replace key whose args["img"] holds the image tokens:
    locate(args, ctx) says where they and the per-token tables are, or why the block stays unmerged."""

    def merged_block(args: dict, extra: dict, block: Callable[[dict], dict]) -> dict:
        def merged(ctx: CallContext) -> dict | Unmerged:
            span = locate(args, ctx)
            if isinstance(span, Unmerged):
                return span
            return run_merged(
                ctx, slot, args["img"], span, args,
                call=lambda seq_m, tables: block(dict(args, img=seq_m, **tables)),
                output=lambda result: result["img"],
                rebuild=lambda result, img: dict(result, img=img),
            )

        return run_hook(args, extra, lambda: block(args), merged)

    return merged_block
