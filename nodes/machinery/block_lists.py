"""The grammar of a `blocks` list, shared by the DiT parser (dit_blocks.py) and the UNet's
(families/unet_blocks.py): comma-separated items `group[:range]`, a range being `N` or `N-M`;
a bare range continues the previous item's group ("double:0-3,10-18"), a group without a
range (or with a blank one) means all its blocks, and empty items are skipped. Pure Python.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

ITEM = re.compile(r"^(?P<group>[a-z_]+)\s*(?::\s*(?P<range>.*))?$")
RANGE = re.compile(r"^(?P<lo>\d+)(?:\s*-\s*(?P<hi>\d+))?$")

NO_GROUP = "no group"
"""Problem: a bare range before any group."""
BAD_GROUP = "bad group"
"""Problem: an item that is not `group[:range]` with one of the family's groups."""
BAD_RANGE = "bad range"
"""Problem: a range that is not `N` or `N-M`."""

Span = tuple[int, int] | None
"""(lo, hi) of a range, both included (lo > hi is the caller's to refuse); None: the whole group."""

Fail = Callable[[str, str, str | None], Exception]
"""fail(text, problem, group): the error for a bad item; text is the item, or its range for BAD_RANGE."""


def block_items(text: str, groups: Collection[str], fail: Fail) -> list[tuple[str, Span]]:
    """(group, span) for every item of the list `text` (already lower-cased), in order."""
    items: list[tuple[str, Span]] = []
    group: str | None = None
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        bare = RANGE.match(item)
        if bare:
            if group is None:
                raise fail(item, NO_GROUP, None)
            items.append((group, _span(bare)))
            continue
        match = ITEM.match(item)
        if match is None or match["group"] not in groups:
            raise fail(item, BAD_GROUP, None)
        group = match["group"]
        written = (match["range"] or "").strip()
        if not written:
            items.append((group, None))
            continue
        span = RANGE.match(written)
        if span is None:
            raise fail(written, BAD_RANGE, group)
        items.append((group, _span(span)))
    return items


def _span(match: re.Match) -> tuple[int, int]:
    lo = int(match["lo"])
    return lo, int(match["hi"]) if match["hi"] is not None else lo
