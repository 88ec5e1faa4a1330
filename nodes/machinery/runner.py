"""How a block hook runs, for every family: the one skeleton every hook runs (`run_hook`), the
merged run of a block whose image tokens are a span of one argument (`run_merged`, `merged_dit_block`)
and the merging around one block that both are made of (`merge_span`, `unmerge_span`, the per-token
rows and key masks), read top to bottom in that order.

`run_hook`: find the call's CallContext (none: an orphan, run as it is), run the block as it is when the
call does not merge, else let the family merge it (`merged(ctx)`: the block's result on merged tokens or
an `Unmerged`); then record the block run, merged or unmerged with its reason.

`run_merged` is that `merged` for the DiT families (Flux double / single blocks, Qwen-Image and SD3
double blocks (image stream `img` = [image; references] beside the text stream `txt`), HunyuanVideo's
double and single blocks, Wan's blocks, Lumina2's layers, HiDream's and Kandinsky 5's blocks), the
merging below with every per-token table gathered to the destinations. A family says where its image
tokens are (`ImageSpan`: their start in the sequence, the frame segments of a video grid) and where its
per-token tables are (`Rows`: which argument, its token axis, where the image rows start in it and
whether it is a key mask, whose last axis only is per token); `run_merged` does the rest, with the call's plan from the one plan builder
(run/runtime.py CallContext.plan). A table of an unexpected shape runs the block unmerged, counted
with the reason.

Merging around one block, shared by every family (the UNet's sites use `features` too): a block
sees a sequence (B, L, C) in which the N image tokens of the main grid sit at [start, start + N);
text and extra tokens (reference images) around them pass through. The plan (toma_core.MergePlan)
maps the span to D merged tokens and a block's change back:

    x = seq[:, start:start+N]                  (B, N, C)
    seq_m = [head; M x; tail]                  (B, L - N + D, C), a fresh tensor (merge_span)
    out = block(seq_m, rows gathered to the D destinations)   (merge_tables)
    y = [head'; x + U(out_span - M x); tail']  (B, L, C)     (unmerge_span)

The merged sequence is always a fresh tensor and the delta is taken against our own copy of M x, so
blocks that write into their input in place (`x += ...` in comfy.ldm.flux.layers.SingleStreamBlock,
Chroma's and HunyuanVideo's blocks) cannot zero the delta.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

from ...toma_core import MergePlan
from ...toma_core.keys_values import take_span
from ...toma_core.video import Segment
from ..contract import Unmerged, layout_changed
from ..run.current import find_call, note_orphan
from ..run.runtime import CallContext, compiling
from ..settings import KEYS_VALUES
from .hooks import MergedBlock
from .keys_values import Keys, run_with_merged_keys
from .spans import MOVE_KEY, MOVED_KEY, NOT_MOVED, SpansCut

log = logging.getLogger(__name__)

_WARNED: set[tuple[str, str]] = set()
"""(family, reason) of the layout changes already warned about in this process."""

R = TypeVar("R")


def block_context(args: dict, extra: dict | None = None) -> CallContext | None:
    """The running call's CallContext for a block hook (none: counted as orphan, it runs unmerged); a forward
    loop calling the blocks itself (TeaCache-style) passes no transformer_options: find_call's active call."""
    ctx = find_call(args, extra)
    if ctx is None:
        note_orphan("no ToMA call context")
    return ctx


def run_hook(args: dict, extra: dict | None, plain: Callable[[], R], merged: Callable[[CallContext], R | Unmerged]) -> R:
    """One block run: plain() (the block as it is) unless the call merges and merged(ctx) returns
    the result on merged tokens; args / extra hold the block's transformer_options (see block_context).
    A merged run is recorded as merged, an Unmerged with a reason as unmerged under it."""
    ctx = block_context(args, extra)
    if ctx is None or not ctx.merge:
        return plain()
    out = merged(ctx)
    if isinstance(out, Unmerged):
        if out.reason is not None:
            ctx.record_block(False, out.reason)
        if out.layout:
            warn_layout(ctx.state.config.adapter.family, out.reason or "")
        return plain() if out.result is None else out.result
    ctx.record_block(True)
    return out


def warn_layout(family: str, reason: str) -> None:
    """Warn once per process and reason that a block's inputs broke its adapter's layout check, naming
    the running ComfyUI's version (the block ran unmerged; the run line counts it)."""
    if compiling() or (family, reason) in _WARNED:
        return
    _WARNED.add((family, reason))
    log.warning(
        "ToMA [%s]: on ComfyUI %s the blocks' inputs are not laid out as ToMA expects (%s): those blocks run "
        "unmerged, nothing is merged wrongly. Please report it with your ComfyUI version.", family, comfyui_version(), reason,
    )


def comfyui_version() -> str:
    """The running ComfyUI's version (ComfyUI's own comfyui_version module), or "unknown"."""
    try:
        from comfyui_version import __version__
    except ImportError:
        return "unknown"
    return str(__version__)


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
    h x w grid). more(plan): further merged block arguments, or an Unmerged. keys: where the block's
    self-attention holds the N image keys (scope keys_values; None: the block cannot merge them).
    """

    start: int
    tables: tuple[Rows, ...]
    length: int
    segments: tuple[Segment, ...] | None = None
    more: Callable[[MergePlan], dict | Unmerged] | None = None
    tokens: int | None = None
    keys: Keys | None = None


def image_plan(ctx: CallContext, slot: str, image: torch.Tensor, segments: tuple[Segment, ...] | None = None) -> MergePlan:
    """This call's plan at `slot` of the main grid (or of its frame `segments`), built from image
    (B, N, C) when missing (runtime.CallContext.plan)."""
    g = ctx.geometry
    return ctx.plan(slot, g.height, g.width, lambda: features(image), segments)


def merge_tables(args: dict, tables: tuple[Rows, ...], plan: MergePlan, length: int) -> dict | Unmerged:
    """The per-token tables gathered to the destinations ({key: table}), or why not."""
    why = tables_misfit(args, tables, length)
    if why is not None:
        return why
    return {rows.key: merge_rows(args[rows.key], token_axis(rows, args[rows.key]), rows.start, plan)
            for rows in tables if args.get(rows.key) is not None}


def token_axis(rows: Rows, table: torch.Tensor) -> int:
    """The axis of `table` that runs over the tokens (a key mask's last one)."""
    return table.ndim - 1 if rows.key_mask else rows.dim


def tables_misfit(args: dict, tables: tuple[Rows, ...], length: int) -> Unmerged | None:
    """Why a per-token table of args does not run over the `length` tokens of the block's sequence
    where `tables` says (a key mask (B|1, ..., L): HunyuanVideo's (1, 1, L), Lumina2's (B, L)), or None."""
    for rows in tables:
        table = args.get(rows.key)
        if table is None:
            continue
        axis = token_axis(rows, table)
        if table.ndim <= axis or (rows.key_mask and table.ndim < 2) or table.shape[axis] != length:
            return layout_changed(f"{rows.key} of shape {tuple(table.shape)} does not have {length} rows on axis {axis}")
    return None


def unless_cut(call: Callable[[], R], options: dict | None = None) -> R | Unmerged:
    """call(), a merged block run, or the layout reason when its forward patch raised SpansCut or,
    for `options` made by with_move, never moved the spans (NOT_MOVED)."""
    try:
        out = call()
    except SpansCut as cut:
        return cut.unmerged
    if options is not None and MOVE_KEY in options and not options[MOVED_KEY]:
        return NOT_MOVED
    return out


def run_merged(
    ctx: CallContext, slot: str, seq: torch.Tensor, span: ImageSpan, args: dict, call: Callable[[torch.Tensor, dict], R],
    output: Callable[[R], torch.Tensor], rebuild: Callable[[R, torch.Tensor], R],
) -> R | Unmerged:
    """Run a block on merged image tokens (the `merged` of run_hook).

    seq (B, L_seq, C) holds the image tokens where `span` says; args holds the per-token tables and
    the block's transformer_options (scope keys_values hands the block a copy of them, with every
    patch and attention override they hold). call(seq_m, tables) runs the block on the merged sequence with the gathered tables;
    output(out) picks the merged sequence from its result; rebuild(out, seq') puts the unmerged
    sequence back. Returns the rebuilt result, or an Unmerged when a table has another layout or
    the block's forward patch found spans it cannot move (spans.SpansCut; nothing ran: unless_cut).
    Scope keys_values runs the block on its own tokens with merged self-attention keys and values
    instead (`run_keys_values`).
    """
    n = ctx.geometry.tokens if span.tokens is None else span.tokens
    image = seq[:, span.start:span.start + n]
    plan = image_plan(ctx, slot, image, span.segments)
    if ctx.settings.scope == KEYS_VALUES:
        return noted(ctx, slot, span, n, output, run_keys_values(ctx, plan, span.keys, seq, args, span.tables, span.length, call))
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
    return noted(ctx, slot, span, n, output, rebuild(out, unmerge_span(output(out), span.start, plan, x, x_m)))


def noted(ctx: CallContext, slot: str, span: ImageSpan, n: int, output: Callable[[R], torch.Tensor], out: R | Unmerged) -> R | Unmerged:
    """out, its n image tokens kept for the next call's plan (CallContext.note_output)."""
    if not isinstance(out, Unmerged):
        ctx.note_output(slot, ctx.geometry.height, ctx.geometry.width, output(out)[:, span.start:span.start + n], span.segments)
    return out


def run_keys_values(
    ctx: CallContext, plan: MergePlan, keys: Keys | None, seq: torch.Tensor, args: dict, tables: tuple[Rows, ...],
    length: int, call: Callable[[torch.Tensor, dict], R],
) -> R | Unmerged:
    """The block on its own N tokens, its per-token tables as they are, its self-attention on the
    image keys and values merged with `plan` where `keys` says (machinery/keys_values.py). Unmerged
    when the family places no keys, when a table does not run over the `length` tokens where the
    family said (the layout is not the one `keys` was read from), or as run_with_merged_keys says."""
    if keys is None:
        return Unmerged("scope keys_values: this block's self-attention keys are not located")
    why = tables_misfit(args, tables, length)
    if why is not None:
        return why
    own = {rows.key: args[rows.key] for rows in tables if rows.key in args}
    run = lambda options: call(seq, own | {"transformer_options": options})  # noqa: E731
    return run_with_merged_keys(run, args.get("transformer_options"), plan, keys, ctx.settings.key_mass, ctx.note_attention, ctx.kernel)


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


def features(x: torch.Tensor) -> torch.Tensor:
    """Plan features of image tokens x (B, N, C): parameter-free LayerNorm in fp32 (B, N, C)."""
    return F.layer_norm(x.float(), (x.shape[-1],))


def merge_span(seq: torch.Tensor, start: int, n: int, plan: MergePlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge tokens [start, start+n) of seq (B, L, C).

    Returns x (B, N, C) the original span, x_m (B, D, C) its merge, and a fresh (B, L-N+D, C)
    sequence with x_m in place of the span (fresh, so an in-place block cannot touch x or x_m).
    """
    x = seq[:, start:start + n]
    x_m = plan.merge(x)
    return x, x_m, torch.cat([seq[:, :start], x_m, seq[:, start + n:]], dim=1)


def unmerge_span(out: torch.Tensor, start: int, plan: MergePlan, x: torch.Tensor, x_m: torch.Tensor) -> torch.Tensor:
    """Block output out (B, L-N+D, C) -> (B, L, C): the merged span becomes x + U(out_span - x_m)."""
    d = plan.num_kept
    y = plan.unmerge_residual(x, x_m, out[:, start:start + d])
    if start == 0 and d == out.shape[1]:
        return y  # nothing around the span (Wan's img): no copy of all N tokens
    return torch.cat([out[:, :start], y, out[:, start + d:]], dim=1)


def merge_rows(rows: torch.Tensor | None, dim: int, start: int, plan: MergePlan) -> torch.Tensor | None:
    """Per-token rows (pe, mask) along `dim`: rows [start, start+n) -> the D destinations' rows
    (toma_core.keys_values.take_span). None stays None."""
    return None if rows is None else take_span(rows, dim, start, plan)


