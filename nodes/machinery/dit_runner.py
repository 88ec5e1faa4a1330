"""A merged run of one block whose image tokens are a span of one argument, for the DiT families
without special cases (issue 14): Qwen-Image and SD3 double blocks (image stream `img` =
[image; references] beside the text stream `txt`), HunyuanVideo's double and single blocks,
Lumina2's layers and HiDream's blocks.

    x = seq[:, start:start+N]                  the main image grid (B, N, C)
    block(seq with M x in place of x, every per-token table gathered to the destinations)
    seq' = out with x + U(out_span - M x) in place of the span

Per-token tables (rope rows, key masks) are described by `Rows`: which argument, its token
axis, where the image rows start in it and whether it is a key mask (only its last axis is
per token). A table of an unexpected shape runs the block unmerged, counted with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...toma_core import MergePlan
from ...toma_core.video import Segment, make_video_plan
from ..runtime import CallContext
from .merge import features, merge_key_mask, merge_rows, merge_span, unmerge_span


@dataclass(frozen=True)
class Rows:
    """A per-token table among a block's arguments: args[key] with tokens on axis `dim`, the N
    image rows starting at `start` (the text length when text comes first). key_mask: an
    additive key mask (B|1, ..., L) whose last axis only is per token."""

    key: str
    dim: int
    start: int
    key_mask: bool = False


def image_plan(ctx: CallContext, slot: str, image: torch.Tensor) -> MergePlan:
    """This call's plan of the main h x w grid at `slot`, built from image (B, N, C) when missing."""
    g = ctx.geometry
    return ctx.plan(slot, g.height, g.width, lambda: features(image))


def segment_plan(ctx: CallContext, slot: str, segments: tuple[Segment, ...], image: torch.Tensor) -> MergePlan:
    """This call's plan of a video grid cut into frame segments (toma_core.video, issue 12: each
    segment tiled on its own, t x h x w tiles inside it), built from image (B, N, C) when missing."""
    g = ctx.geometry
    key = ((slot, segments), g.height, g.width)
    plan = ctx.plans.get(key)
    if plan is None:
        s = ctx.settings
        plan = make_video_plan(
            features(image), list(segments), g.height, g.width, s.ratio, s.tile_size,
            similarity=s.similarity, temperature=s.temperature, budget=s.budget, unmerge=s.unmerge,
        )
        ctx.plans[key] = plan
    return plan


def merge_tables(args: dict, tables: tuple[Rows, ...], plan: MergePlan, length: int) -> dict | str:
    """The per-token tables gathered to the destinations ({key: table}), or why not (a reason)."""
    n, merged = plan.num_tokens, {}
    for rows in tables:
        table = args.get(rows.key)
        if table is None:
            continue
        if rows.key_mask:
            table, why = merge_key_mask(table, plan, rows.start, n, length)
            if why:
                return why
        elif table.ndim <= rows.dim or table.shape[rows.dim] != length:
            return f"{rows.key} of shape {tuple(table.shape)} does not have {length} rows on axis {rows.dim}"
        else:
            table = merge_rows(table, rows.dim, rows.start, n, plan)
        merged[rows.key] = table
    return merged


def run_merged(
    ctx: CallContext, slot: str, seq: torch.Tensor, start: int, args: dict, tables: tuple[Rows, ...],
    length: int, call: Callable[[torch.Tensor, dict], object], output: Callable[[object], torch.Tensor],
    rebuild: Callable[[object, torch.Tensor], object], segments: tuple[Segment, ...] | None = None,
    more: Callable[[MergePlan], dict | str] | None = None,
) -> tuple[bool, object]:
    """Run a block on merged image tokens.

    seq (B, L_seq, C) holds the N image tokens at [start, start+N); `length` is the token count of
    the per-token tables. call(seq_m, tables) runs the block on the merged sequence with the
    gathered tables; output(out) picks the merged sequence from its result; rebuild(out, seq')
    puts the unmerged sequence back. segments: the frame segments of a video grid (None: one
    plan over the whole grid). more(plan): further merged arguments for the block, or a reason
    not to merge. Returns (False, reason) when a table has another layout (nothing ran), else
    (True, the rebuilt result).
    """
    n = ctx.geometry.tokens
    image = seq[:, start:start + n]
    plan = image_plan(ctx, slot, image) if segments is None else segment_plan(ctx, slot, segments, image)
    merged = merge_tables(args, tables, plan, length)
    if more is not None and not isinstance(merged, str):
        extra = more(plan)
        merged = extra if isinstance(extra, str) else merged | extra
    if isinstance(merged, str):
        return False, merged
    x, x_m, seq_m = merge_span(seq, start, n, plan)
    out = call(seq_m, merged)
    ctx.record_block(True)
    return True, rebuild(out, unmerge_span(output(out), start, plan, x, x_m))


def merged_dit_block(
    args: dict, block: Callable[[dict], dict], ctx: CallContext, slot: str, start: int, tables: tuple[Rows, ...], length: int,
    segments: tuple[Segment, ...] | None = None, more: Callable[[MergePlan], dict | str] | None = None,
) -> dict:
    """run_merged for a dit replace key whose args["img"] holds the image span at `start`."""
    done, out = run_merged(
        ctx, slot, args["img"], start, args, tables, length,
        call=lambda seq_m, merged: block(dict(args, img=seq_m, **merged)),
        output=lambda result: result["img"],
        rebuild=lambda result, img: dict(result, img=img),
        segments=segments, more=more,
    )
    if done:
        return out
    ctx.record_block(False, out)
    return block(args)


def tokens_match(ctx: CallContext, count: int, expected: int) -> bool:
    """True when a block sees the token count the call's geometry predicts; else counts the block
    run as unmerged (the latent grid and the block's tokens disagree)."""
    if count == expected:
        return True
    ctx.record_block(False, "image tokens differ from the latent grid")
    return False
