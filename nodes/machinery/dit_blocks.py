"""Which blocks of a DiT ToMA merges: the `blocks` setting of every DiT family.

Pure Python (no torch, no ComfyUI). A block is named by its stream (group) and index, as the
family's adapter names them: Flux, Chroma, HunyuanVideo and HiDream have ("double", i) and
("single", i); Qwen-Image and SD3 ("double", i), after ComfyUI's dit replace keys; Wan
("blocks", i); Lumina2 ("layers", i) for `layers[i]`.

Accepted `blocks` strings:

- "auto": the later half of each stream, blocks n // 2 to n - 1 of its n (`auto_indices`). For Flux.1
  (19 double + 38 single) this is "double:9-18,single:19-37". The first blocks lay out the image and
  their error runs through every later block: on the trained fixtures the later half kept more of the
  image at the same predicted real-size speed-up than every block but the first five (docs/defaults.md,
  bench/speed/defaults_search.py). The video families (`video`) keep every block but the first
  `min(AUTO_SKIP, depth // 3)` (Flux.1's would be "double:5-18,single:5-37", the ToMA authors'
  released set), not measured against the later half on video. A one-block stream merges its block.
- "all": every block.
- a list in the grammar of block_lists.py: comma-separated items `group[:range]`, ranges such as
  `5-18` or `7`; a bare range continues the previous group ("double:0-3,10-18"). A group without
  a range means all its blocks. Example: "double:5-18,single:5-37".
"""

from __future__ import annotations

from dataclasses import dataclass

from .block_lists import Span, block_items, groups_menu

AUTO_SKIP = 5
"""blocks auto on a video family: the first min(AUTO_SKIP, depth // 3) blocks of each stream stay exact."""


@dataclass(frozen=True)
class DitBlocks:
    """The selected block indices of each stream, in the family's stream order, e.g.
    (("double", {5..18}), ("single", {5..37})). A stream's set is also an attribute (`.double`)."""

    groups: tuple[tuple[str, frozenset[int]], ...]

    def __getattr__(self, name: str) -> frozenset[int]:
        for group, indices in object.__getattribute__(self, "groups"):
            if group == name:
                return indices
        raise AttributeError(name)

    def selects(self, group: str, index: int) -> bool:
        return index in getattr(self, group, frozenset())

    @property
    def count(self) -> int:
        return sum(len(indices) for _, indices in self.groups)

    def describe(self) -> str:
        """Canonical text, e.g. 'double:5-18,single:5-37'."""
        parts = [f"{g}:{_ranges(sorted(indices))}" for g, indices in self.groups if indices]
        return ",".join(parts) or "none"


def auto_indices(n: int, video: bool = False) -> range:
    """The blocks "auto" selects in a stream of n: its later half, or on a `video` family every block
    but the first min(AUTO_SKIP, n // 3)."""
    return range(min(AUTO_SKIP, n // 3) if video else n // 2, n)


def parse_dit_blocks(spec: str, sizes: dict[str, int], video: bool = False) -> DitBlocks:
    """Parse `spec` for a model with sizes[group] blocks in each stream (in stream order); `video`:
    the model's family tiles frames (its "auto" is auto_indices(n, video=True)).

    Raises ValueError naming the bad item and the allowed groups or index range.
    """
    text = spec.strip().lower()
    if text == "all":
        return DitBlocks(tuple((g, frozenset(range(n))) for g, n in sizes.items()))
    if text == "auto":
        return DitBlocks(tuple((g, frozenset(auto_indices(n, video))) for g, n in sizes.items()))
    example = ",".join(f"{g}:0-{n - 1}" for g, n in sizes.items() if n)
    chosen: dict[str, set[int]] = {g: set() for g in sizes}
    for group, span in block_items(spec, sizes, groups_menu(list(sizes), example)):
        chosen[group].update(_indices(span, group, sizes[group], spec))
    return DitBlocks(tuple((g, frozenset(chosen[g])) for g in sizes))


def parse_flux_blocks(spec: str, depth: int, depth_single: int, video: bool = False) -> DitBlocks:
    """parse_dit_blocks for the two streams of a Flux-layout model (double, single)."""
    return parse_dit_blocks(spec, {"double": depth, "single": depth_single}, video)


def _indices(span: Span, group: str, size: int, spec: str) -> range:
    if span is None:
        return range(size)
    lo, hi = span
    if hi >= size:
        raise ValueError(f"blocks={spec!r}: {group} range {lo}-{hi} is outside {_model_range(group, size)}")
    return range(lo, hi + 1)


def _model_range(group: str, size: int) -> str:
    """"this model's double blocks 0-18" (Wan's group is itself "blocks"), or that it has none."""
    name = group if group == "blocks" else f"{group} blocks"
    return f"this model's {name} 0-{size - 1}" if size else f"this model's {name} (it has none)"


def _ranges(values: list[int]) -> str:
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)
