"""Geometry of the tile grid: how a t x h x w token grid is cut into tiles and how many tokens
each tile keeps (ToMA §3.2, "locality"; the frame axis t makes them spatio-temporal tiles for video).

Tokens are t-major (frame, then row, then column), as a video DiT patchifies a (B, C, T, H, W)
latent; an image is the t = 1 case.

Tiles are a reshape + permute of the (zero-padded) grid, never a gather. A grid that the tile
does not divide is padded; padded positions are masked, and every tile keeps a number of
destinations proportional to its real tokens, so edge tiles and 1 x N grids merge like the rest.

Everything here is plain Python arithmetic on ints, and the index tensors are made from Python
lists: no tensor -> Python conversion and no lock, so plan building traces under torch.compile
without graph breaks (tests/integration/test_compat_compile.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from einops import rearrange


def kept_per_tile(real: int, ratio: float) -> int:
    """Destinations kept by a tile with `real` tokens: round(real * (1 - ratio)), at least 1."""
    return min(real, max(1, math.floor(real * (1.0 - ratio) + 0.5)))


@dataclass(frozen=True)
class TileGrid:
    """A frames x height x width t-major grid cut into tt x th x tw tiles (th = min(tile_size,
    height), tw likewise, tt = min(tile_frames, frames)).

    G = gt * gh * gw tiles of n = tt * th * tw positions, in (frame block, row block, column
    block) order; k = the most destinations any tile keeps.
    """

    height: int
    width: int
    tile_size: int
    ratio: float
    th: int = field(init=False)
    tw: int = field(init=False)
    frames: int = 1
    tile_frames: int = 1
    tt: int = field(init=False)
    _real: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _keep: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "th", min(self.tile_size, self.height))
        object.__setattr__(self, "tw", min(self.tile_size, self.width))
        object.__setattr__(self, "tt", min(self.tile_frames, self.frames))
        # Per-tile counts once: a plan reads them a dozen times, and a video grid has 1000s of tiles.
        spans = [min(self.tt, self.frames - i * self.tt) for i in range(self.gt)]
        rows = [min(self.th, self.height - i * self.th) for i in range(self.gh)]
        cols = [min(self.tw, self.width - j * self.tw) for j in range(self.gw)]
        real = tuple(f * r * c for f in spans for r in rows for c in cols)
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_keep", tuple(kept_per_tile(r, self.ratio) for r in real))

    @property
    def gt(self) -> int:
        return -(-self.frames // self.tt)

    @property
    def gh(self) -> int:
        return -(-self.height // self.th)

    @property
    def gw(self) -> int:
        return -(-self.width // self.tw)

    @property
    def num_tiles(self) -> int:
        return self.gt * self.gh * self.gw

    @property
    def tile_tokens(self) -> int:
        return self.tt * self.th * self.tw

    @property
    def num_tokens(self) -> int:
        """N = frames * height * width."""
        return self.frames * self.height * self.width

    @property
    def padded(self) -> bool:
        return self.gt * self.tt != self.frames or self.gh * self.th != self.height or self.gw * self.tw != self.width

    @property
    def real_counts(self) -> list[int]:
        """Real (unpadded) tokens of each tile, in tile order."""
        return list(self._real)

    @property
    def max_real(self) -> int:
        """The most real tokens in any tile (n unless the grid is smaller than one tile)."""
        return max(self._real)

    @property
    def keep_counts(self) -> list[int]:
        """Destinations kept by each tile, proportional to its real tokens."""
        return list(self._keep)

    @property
    def k(self) -> int:
        return max(self._keep)

    @property
    def num_kept(self) -> int:
        return sum(self._keep)

    @property
    def keeps_all(self) -> bool:
        return self.num_kept == self.num_tokens

    @property
    def uniform(self) -> bool:
        """True when every tile keeps k destinations (no unused slots)."""
        return all(c == self._keep[0] for c in self._keep)

    def raster_index(self, device: torch.device | None = None) -> torch.Tensor:
        """(G, n) t-major raster index of every tile position; padded positions hold -1."""
        frames = torch.arange(self.gt * self.tt, device=device).view(-1, 1, 1)
        rows = torch.arange(self.gh * self.th, device=device).view(1, -1, 1)
        cols = torch.arange(self.gw * self.tw, device=device).view(1, 1, -1)
        real = (frames < self.frames) & (rows < self.height) & (cols < self.width)
        index = torch.where(real, (frames * self.height + rows) * self.width + cols, -1)
        return rearrange(index, "(gt tt) (gh th) (gw tw) -> (gt gh gw) (tt th tw)", tt=self.tt, th=self.th, tw=self.tw)

    def fold_index(self, device: torch.device | None = None) -> torch.Tensor:
        """(G*n,) the raster token each tile position reads, for a fold that is one index_select.

        A padded position reads its tile's first token (always real), not zero: only for matmuls
        that give padded positions zero weight (TiledMergePlan.merge), where the result is the
        same and a non-finite token still reaches only its own tile, as with zero padding.
        """
        index = self.raster_index(device)
        return torch.where(index < 0, index[:, :1], index).flatten()

    def unfold_index(self, device: torch.device | None = None) -> torch.Tensor:
        """(N,) the flat tile position (g * n + p) of every t-major raster token."""
        frames = torch.arange(self.frames, device=device).view(-1, 1, 1)
        rows = torch.arange(self.height, device=device).view(1, -1, 1)
        cols = torch.arange(self.width, device=device).view(1, 1, -1)
        tile = ((frames // self.tt) * self.gh + rows // self.th) * self.gw + cols // self.tw
        position = ((frames % self.tt) * self.th + rows % self.th) * self.tw + cols % self.tw
        return (tile * self.tile_tokens + position).flatten()

    def pad_mask(self, device: torch.device | None = None) -> torch.Tensor:
        """(G, n) bool, True at padded positions."""
        return self.raster_index(device) < 0

    def slot_valid(self, device: torch.device | None = None) -> torch.Tensor:
        """(G, k) bool, True for the destination slots a tile really uses."""
        counts = torch.tensor(self._keep, device=device).view(-1, 1)
        return torch.arange(self.k, device=device).view(1, -1) < counts

    def slot_maps(self, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Static index maps of the used slots, or None when every slot is used.

        kept (D,): the flat (G*k) slot of each kept token. source (G*k,): the kept token each
        slot reads on unmerge (unused slots read token 0, with weight 0). Tensor ops, not a
        Python loop over the G*k slots (tens of thousands on a video grid).
        """
        if self.uniform:
            return None
        counts = torch.tensor(self._keep, device=device)
        first = counts.cumsum(0) - counts  # each tile's first kept token
        slots = torch.arange(self.k, device=device)
        source = torch.where(slots < counts.unsqueeze(-1), first.unsqueeze(-1) + slots, 0).flatten()
        tile = torch.arange(self.num_tiles, device=device).repeat_interleave(counts, output_size=self.num_kept)
        kept = tile * self.k + torch.arange(self.num_kept, device=device) - first[tile]
        return kept, source

    def fold(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) t-major raster tokens -> (B, G, n, C) tiles (padding is zeros): one index_select."""
        index = self.raster_index(x.device).flatten()
        tiles = x.index_select(1, index.clamp_min(0))
        if self.padded:  # zero the padded positions in place: they hold the smallest raster indices, -1
            padded = index.topk(self.num_tiles * self.tile_tokens - self.num_tokens, largest=False).indices
            tiles.index_fill_(1, padded, 0.0)
        return tiles.view(x.shape[0], self.num_tiles, self.tile_tokens, x.shape[-1])
