"""Which Flux-family blocks ToMA merges: the `blocks` setting for Flux, Kontext, Fill and Chroma.

Pure Python (no torch, no ComfyUI). A block is named as ComfyUI's dit replace keys name it:
("double", i) for `double_blocks[i]`, ("single", i) for `single_blocks[i]`.

Accepted `blocks` strings:

- "auto": every block except the first `min(AUTO_SKIP, depth // 3)` of each stream. For Flux.1
  (19 double + 38 single) this is "double:5-18,single:5-37", the block set of the reference ToMA
  Flux configuration (research/toma_algorithm.md §5); the first blocks are left alone because
  they shape the layout and are the cheapest to keep exact. A fidelity measurement on real
  weights is still owed; a tiny test model (depth 2 + 2) merges every block.
- "all": every block.
- a list: comma-separated items `group[:ranges]` with group "double" or "single", ranges such as
  `5-18` or `7`; a bare range continues the previous group ("double:0-3,10-18"). A group without
  ranges means all its blocks. Example: "double:5-18,single:5-37".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GROUPS = ("double", "single")
AUTO_SKIP = 5

_ITEM = re.compile(r"^(?P<group>[a-z_]+)\s*(?::\s*(?P<range>.*))?$")
_RANGE = re.compile(r"^(?P<lo>\d+)(?:\s*-\s*(?P<hi>\d+))?$")


@dataclass(frozen=True)
class FluxBlocks:
    """The selected block indices of each stream, e.g. double={5..18}, single={5..37}."""

    double: frozenset[int]
    single: frozenset[int]

    def selects(self, group: str, index: int) -> bool:
        return index in (self.double if group == "double" else self.single)

    @property
    def count(self) -> int:
        return len(self.double) + len(self.single)

    def describe(self) -> str:
        """Canonical text, e.g. 'double:5-18,single:5-37'."""
        parts = [f"{g}:{_ranges(sorted(getattr(self, g)))}" for g in GROUPS if getattr(self, g)]
        return ",".join(parts) or "none"


def parse_flux_blocks(spec: str, depth: int, depth_single: int) -> FluxBlocks:
    """Parse `spec` for a model with `depth` double and `depth_single` single blocks.

    Raises ValueError naming the bad item and the allowed groups or index range.
    """
    sizes = {"double": depth, "single": depth_single}
    text = spec.strip().lower()
    if text == "all":
        return FluxBlocks(frozenset(range(depth)), frozenset(range(depth_single)))
    if text == "auto":
        return FluxBlocks(*(frozenset(range(min(AUTO_SKIP, n // 3), n)) for n in (depth, depth_single)))
    chosen: dict[str, set[int]] = {g: set() for g in GROUPS}
    group = None
    for item in (part.strip() for part in text.split(",")):
        group = _parse_item(item, group, sizes, chosen, spec)
    return FluxBlocks(frozenset(chosen["double"]), frozenset(chosen["single"]))


def check_flux_blocks_syntax(spec: str) -> None:
    """Validate `spec` without knowing the model depth (indices checked later against the model)."""
    parse_flux_blocks(spec, 1 << 16, 1 << 16)


def _parse_item(item: str, group: str | None, sizes: dict[str, int], chosen: dict[str, set[int]], spec: str) -> str:
    match = _RANGE.match(item)
    if match and group is not None:
        chosen[group].update(_indices(match, group, sizes[group], spec))
        return group
    match = _ITEM.match(item)
    if not match or match["group"] not in GROUPS:
        raise ValueError(
            f"blocks={spec!r}: item {item!r} is not 'auto', 'all' or group[:range] with group in "
            f"{', '.join(GROUPS)} (example 'double:5-18,single:5-37')"
        )
    group = match["group"]
    if match["range"] is None:
        chosen[group].update(range(sizes[group]))
        return group
    span = _RANGE.match(match["range"].strip())
    if span is None:
        raise ValueError(f"blocks={spec!r}: range {match['range']!r} of {group} must look like 5-18 or 7")
    chosen[group].update(_indices(span, group, sizes[group], spec))
    return group


def _indices(match: re.Match, group: str, size: int, spec: str) -> range:
    lo = int(match["lo"])
    hi = int(match["hi"]) if match["hi"] is not None else lo
    if lo > hi or hi >= size:
        raise ValueError(f"blocks={spec!r}: {group} range {lo}-{hi} is outside 0-{size - 1} (this model's {group} blocks)")
    return range(lo, hi + 1)


def _ranges(values: list[int]) -> str:
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)
