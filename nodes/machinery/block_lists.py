"""The grammar of a `blocks` list, shared by the DiT parser (dit_blocks.py), the UNet's
(families/unet_blocks.py) and the check made when a prompt is queued (node/input_checks.py):
comma-separated items `group[:range]`, a range being `N` or `N-M` with N <= M; a bare range
continues the previous item's group ("double:0-3,10-18"), a group without a range (or with a
blank one) means all its blocks, and empty items are skipped. Pure Python.

Every error of the grammar is one message (`list_error`): what is wrong with the list, then a
`menu` of what the list may name, which is the model's own groups once its family is known
(`groups_menu`) and every family's example while the prompt is only queued.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

ITEM = re.compile(r"^(?P<group>[a-z_]+)\s*(?::\s*(?P<range>.*))?$")
RANGE = re.compile(r"^(?P<lo>\d+)(?:\s*-\s*(?P<hi>\d+))?$")

NO_GROUP = "no group"
"""Problem: a bare range before any group."""
BAD_GROUP = "bad group"
"""Problem: an item that is not `group[:range]` with one of the groups the list may name."""
BAD_RANGE = "bad range"
"""Problem: a range that is not `N` or `N-M`."""
REVERSED = "reversed"
"""Problem: a range `N-M` with N > M."""
NO_BLOCK = "no block"
"""Problem: a list without an item (only commas and blanks)."""

Span = tuple[int, int] | None
"""(lo, hi) of a range, both included, lo <= hi; None: the whole group."""


def block_items(spec: str, groups: Collection[str], menu: str) -> list[tuple[str, Span]]:
    """(group, span) for every item of the list `spec` (any case), in order; at least one.

    Raises `list_error(spec, ..., menu)` for the first item that breaks the grammar.
    """
    items: list[tuple[str, Span]] = []
    group: str | None = None
    for item in (part.strip() for part in spec.strip().lower().split(",")):
        if not item:
            continue
        bare = RANGE.match(item)
        if bare:
            if group is None:
                raise list_error(spec, item, NO_GROUP, None, menu)
            items.append((group, _span(bare, group, spec, menu)))
            continue
        match = ITEM.match(item)
        if match is None or match["group"] not in groups:
            raise list_error(spec, item, BAD_GROUP, None, menu)
        group = match["group"]
        written = (match["range"] or "").strip()
        if not written:
            items.append((group, None))
            continue
        span = RANGE.match(written)
        if span is None:
            raise list_error(spec, written, BAD_RANGE, group, menu)
        items.append((group, _span(span, group, spec, menu)))
    if not items:
        raise list_error(spec, spec, NO_BLOCK, None, menu)
    return items


def list_error(spec: str, item: str, problem: str, group: str | None, menu: str) -> ValueError:
    """The error for `item` of the list `spec` (for BAD_RANGE and REVERSED its range, in `group`)."""
    what = {
        NO_GROUP: f"range {item!r} needs a group before it",
        BAD_GROUP: f"item {item!r} is not 'auto', 'all' or group[:range]",
        BAD_RANGE: f"range {item!r} of {group} must look like 5-18 or 7",
        REVERSED: f"{group} range {item} must run from low to high",
        NO_BLOCK: "it selects no block",
    }[problem]
    return ValueError(f"blocks={spec!r}: {what}; {menu}")


def groups_menu(groups: Sequence[str], example: str) -> str:
    """What a model's list may name: "this model's only group is 'blocks' (e.g. 'blocks:0-29')",
    "this model's groups are 'double' and 'single' (e.g. ...)"."""
    quoted = [f"'{g}'" for g in groups]
    if len(quoted) == 1:
        return f"this model's only group is {quoted[0]} (e.g. {example!r})"
    return f"this model's groups are {', '.join(quoted[:-1])} and {quoted[-1]} (e.g. {example!r})"


def _span(match: re.Match, group: str, spec: str, menu: str) -> tuple[int, int]:
    lo = int(match["lo"])
    hi = int(match["hi"]) if match["hi"] is not None else lo
    if lo > hi:
        raise list_error(spec, f"{lo}-{hi}", REVERSED, group, menu)
    return lo, hi
