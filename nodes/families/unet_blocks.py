"""Which UNet transformer blocks ToMA merges: the `blocks` setting for SDXL / SD1.x / SD2.x.

Pure Python (no torch, no ComfyUI) so it is tested everywhere. A UNet block is named as ComfyUI
names it in `transformer_options["block"]`: ("input", i), ("middle", 0), ("output", i), where i
indexes `input_blocks` / `output_blocks`. Every `SpatialTransformer` in such a block has a stack
of `BasicTransformerBlock`s; a selected block merges all of them.

Accepted `blocks` strings:

- "auto": the later half, the output (decoder) blocks whose resolution level is downsampled at most
  `AUTO_MAX_DOWNSAMPLE` times from the latent. On SDXL this is output 0-5 (36 of its 70 transformer
  blocks: 30 at 1/4, 6 at 1/2); on SD1.x/2.x output 3-11 (levels 1/4, 1/2 and 1). As on the DiTs
  (machinery/dit_blocks.py), the first blocks lay out the image and their error runs through the rest:
  on the trained fixtures the output blocks kept more at the same predicted real-size speed-up than
  every block (docs/defaults.md). Tiles at the 1/8 level would span a large part of the image.
- "all": every transformer block.
- a list in the grammar of machinery/block_lists.py: comma-separated items `group[:range]` with
  group in input / middle / output and ranges such as `4-8` or `4`; a bare range continues the
  previous group. Example:
  "input:4-8,middle,output:0-5" or "input:4,5,7-8". A group without ranges means all its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..machinery.block_lists import block_items, groups_menu

BlockId = tuple[str, int]

GROUPS = ("input", "middle", "output")
AUTO_MAX_DOWNSAMPLE = 4


@dataclass(frozen=True)
class UNetBlockSpec:
    """A parsed `blocks` setting.

    mode: "auto", "all" or "list". For "list", `groups` holds the groups selected as a whole and
    `ids` the single blocks, e.g. {("input", 4), ("input", 5)}.
    """

    mode: str
    groups: frozenset[str] = frozenset()
    ids: frozenset[BlockId] = frozenset()

    def selects(self, block: BlockId, downsample: int) -> bool:
        """Whether block (group, index), at a level `downsample` times smaller than the latent, merges."""
        if self.mode == "all":
            return True
        if self.mode == "auto":
            return block[0] == "output" and downsample <= AUTO_MAX_DOWNSAMPLE
        return block[0] in self.groups or (block[0], int(block[1])) in self.ids

    def describe(self) -> str:
        """Canonical text of the setting, for the per-run log line."""
        if self.mode != "list":
            return self.mode
        parts = sorted(self.groups) + [f"{g}:{i}" for g, i in sorted(self.ids)]
        return ",".join(parts)


def parse_unet_blocks(spec: str) -> UNetBlockSpec:
    """Parse the advanced node's `blocks` string for a UNet model (see the module docstring).

    Raises ValueError naming the bad item and the accepted forms.
    """
    text = (spec or "").strip().lower()
    if text in ("", "auto"):
        return UNetBlockSpec("auto")
    if text == "all":
        return UNetBlockSpec("all")
    groups: set[str] = set()
    ids: set[BlockId] = set()
    for group, span in block_items(spec, GROUPS, MENU):
        if span is None:
            groups.add(group)
        else:
            ids.update((group, i) for i in range(span[0], span[1] + 1))
    return UNetBlockSpec("list", frozenset(groups), frozenset(ids))


MENU = groups_menu(GROUPS, "input:4-8,middle,output:0-5")
"""What a UNet `blocks` list may name, for its errors (machinery/block_lists.py)."""
