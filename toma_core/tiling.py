"""Geometry of the tile grid: how an h x w token grid is cut into tiles and how many tokens
each tile keeps (ToMA §3.2, "locality").

Tiles are a reshape + permute of the (zero-padded) grid, never a gather. A grid that the tile
does not divide is padded; padded positions are masked, and every tile keeps a number of
destinations proportional to its real tokens, so edge tiles and 1 x N grids merge like the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch
from einops import rearrange


def kept_per_tile(real: int, ratio: float) -> int:
    """Destinations kept by a tile with `real` tokens: round(real * (1 - ratio)), at least 1."""
    return min(real, max(1, math.floor(real * (1.0 - ratio) + 0.5)))


@dataclass(frozen=True)
class TileGrid:
    """An h x w raster grid cut into th x tw tiles (th = min(tile_size, h), tw likewise).

    G = gh * gw tiles of n = th * tw positions; k = the most destinations any tile keeps.
    """

    height: int
    width: int
    tile_size: int
    ratio: float
    th: int = field(init=False)
    tw: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "th", min(self.tile_size, self.height))
        object.__setattr__(self, "tw", min(self.tile_size, self.width))

    @property
    def gh(self) -> int:
        return -(-self.height // self.th)

    @property
    def gw(self) -> int:
        return -(-self.width // self.tw)

    @property
    def num_tiles(self) -> int:
        return self.gh * self.gw

    @property
    def tile_tokens(self) -> int:
        return self.th * self.tw

    @property
    def padded(self) -> bool:
        return self.gh * self.th != self.height or self.gw * self.tw != self.width

    @cached_property
    def raster_index(self) -> torch.Tensor:
        """(G, n) raster index of every tile position; padded positions hold -1."""
        rows = torch.arange(self.gh * self.th).view(-1, 1)
        cols = torch.arange(self.gw * self.tw).view(1, -1)
        index = torch.where((rows < self.height) & (cols < self.width), rows * self.width + cols, -1)
        return rearrange(index, "(gh th) (gw tw) -> (gh gw) (th tw)", th=self.th, tw=self.tw)

    @cached_property
    def pad_mask(self) -> torch.Tensor:
        """(G, n) bool, True at padded positions."""
        return self.raster_index < 0

    @cached_property
    def keep_counts(self) -> list[int]:
        """Destinations kept by each tile, proportional to its real tokens."""
        real = (~self.pad_mask).sum(-1).tolist()
        return [kept_per_tile(r, self.ratio) for r in real]

    @property
    def k(self) -> int:
        return max(self.keep_counts)

    @property
    def num_kept(self) -> int:
        return sum(self.keep_counts)

    @property
    def keeps_all(self) -> bool:
        return self.num_kept == self.height * self.width

    @cached_property
    def slot_valid(self) -> torch.Tensor:
        """(G, k) bool, True for the destination slots a tile really uses."""
        return torch.arange(self.k).view(1, -1) < torch.tensor(self.keep_counts).view(-1, 1)

    @cached_property
    def kept_slots(self) -> torch.Tensor | None:
        """(D,) flat (G*k) slot indices that are real, or None when every slot is."""
        flat = self.slot_valid.flatten()
        return None if bool(flat.all()) else flat.nonzero().squeeze(-1)

    @cached_property
    def slot_source(self) -> torch.Tensor | None:
        """(G*k,) index into the D kept tokens for every slot (dead slots read token 0, weight 0)."""
        flat = self.slot_valid.flatten()
        if bool(flat.all()):
            return None
        return torch.where(flat, flat.long().cumsum(0) - 1, 0)

    def fold(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) raster tokens -> (B, G, n, C) tiles (padding is zeros)."""
        grid = x.view(x.shape[0], self.height, self.width, x.shape[-1])
        if self.padded:
            pad_h, pad_w = self.gh * self.th - self.height, self.gw * self.tw - self.width
            grid = torch.nn.functional.pad(grid, (0, 0, 0, pad_w, 0, pad_h))
        return rearrange(grid, "b (gh th) (gw tw) c -> b (gh gw) (th tw) c", th=self.th, tw=self.tw)

    def unfold(self, tiles: torch.Tensor) -> torch.Tensor:
        """(B, G, n, C) tiles -> (B, N, C) raster tokens (padding dropped)."""
        grid = rearrange(tiles, "b (gh gw) (th tw) c -> b (gh th) (gw tw) c", gh=self.gh, th=self.th)
        grid = grid[:, : self.height, : self.width]
        return grid.reshape(grid.shape[0], self.height * self.width, grid.shape[-1])
