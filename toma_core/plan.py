"""Merge plans: per-sample destination tokens and the soft merge/unmerge matrices (ToMA §3.3).

A plan is built once from one block's input features and reused for every tensor that lives on
the same token grid (other blocks, other channel widths, positional rows). Merge and unmerge are
batched matmuls over tiles: (B, G, k, n) @ (B, G, n, C); no sort, no scatter.
"""

from __future__ import annotations

import torch

from .facility import facility_location
from .similarity import check_similarity, pairwise, prepare_features
from .tiling import TileGrid


class MergePlan:
    """The no-op plan: keeps all N tokens; every method returns its input unchanged.

    Also the interface of `TiledMergePlan`, so hook code never asks whether ToMA is on.
    """

    def __init__(self, batch: int, num_tokens: int, device: torch.device | None = None) -> None:
        self.batch = batch
        self.num_tokens = num_tokens
        self.device = device

    @property
    def num_kept(self) -> int:
        """D, the number of merged tokens of every sample."""
        return self.num_tokens

    @property
    def dst_index(self) -> torch.Tensor:
        """(B, D) raster index of each merged token's destination token."""
        return torch.arange(self.num_tokens, device=self.device).expand(self.batch, -1)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, D, C)."""
        return x

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """(B, D, C) -> (B, N, C)."""
        return y

    def unmerge_residual(self, x: torch.Tensor, merged_in: torch.Tensor, merged_out: torch.Tensor) -> torch.Tensor:
        """Full-N output of a block run on merged tokens: x + U (merged_out - merged_in) (ToMA §3.3).

        x (B, N, C) is the block's full input, merged_in = merge(x) and merged_out = block(merged_in),
        both (B, D, C). Keeps each token's own detail and spreads only the block's change.
        """
        return merged_out

    def take(self, rows: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Rows of the destinations along `dim` (size N there, batch 1 or B in dim 0) -> size D.

        Used for positional embeddings: a merged token sits at its destination's position.
        """
        return rows


class TiledMergePlan(MergePlan):
    """A plan that merges N -> D tokens tile by tile; see `make_plan`."""

    def __init__(self, grid: TileGrid, dst: torch.Tensor, assign: torch.Tensor) -> None:
        super().__init__(assign.shape[0], grid.height * grid.width, assign.device)
        self.grid = grid
        self.dst = dst
        self.assign = assign
        self._merge = assign / assign.sum(-1, keepdim=True).clamp_min(1e-12)
        self._unmerge = assign.transpose(-1, -2)
        self._cast_cache: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._index = self._raster_destinations()

    def _raster_destinations(self) -> torch.Tensor:
        local_to_raster = self.grid.raster_index.to(self.device).expand(self.batch, -1, -1)
        flat = local_to_raster.gather(-1, self.dst).flatten(1)
        return self._keep(flat.unsqueeze(-1)).squeeze(-1)

    def _keep(self, slots: torch.Tensor) -> torch.Tensor:
        """(B, G*k, C) slots -> (B, D, C), dropping the dead slots of sparse edge tiles."""
        kept = self.grid.kept_slots
        return slots if kept is None else slots.index_select(1, kept.to(slots.device))

    def _matrix(self, name: str, like: torch.Tensor) -> torch.Tensor:
        key = (name, like.dtype, like.device)
        if key not in self._cast_cache:
            source = self._merge if name == "merge" else self._unmerge
            self._cast_cache[key] = source.to(device=like.device, dtype=like.dtype)
        return self._cast_cache[key]

    @property
    def num_kept(self) -> int:
        return self.grid.num_kept

    @property
    def dst_index(self) -> torch.Tensor:
        return self._index

    @property
    def merge_matrix(self) -> torch.Tensor:
        """(B, G, k, n) fp32 merge weights; each real row sums to 1."""
        return self._merge

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        tiles = self.grid.fold(x)
        merged = self._matrix("merge", x) @ tiles
        return self._keep(merged.flatten(1, 2))

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        source = self.grid.slot_source
        if source is not None:
            y = y.index_select(1, source.to(y.device))
        tiles = y.view(y.shape[0], self.grid.num_tiles, self.grid.k, y.shape[-1])
        return self.grid.unfold(self._matrix("unmerge", y) @ tiles)

    def unmerge_residual(self, x: torch.Tensor, merged_in: torch.Tensor, merged_out: torch.Tensor) -> torch.Tensor:
        return x + self.unmerge(merged_out - merged_in)

    def take(self, rows: torch.Tensor, dim: int = 1) -> torch.Tensor:
        moved = rows.movedim(dim, 1)
        batch = torch.arange(self.batch, device=rows.device).unsqueeze(-1)
        if moved.shape[0] == 1:
            batch = torch.zeros_like(batch)
        return moved[batch, self._index.to(rows.device)].movedim(1, dim)


def check_plan_args(height: int, width: int, ratio: float, tile_size: int, temperature: float) -> None:
    """Reject illegal plan settings with a ValueError that names the value and the allowed range."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio={ratio} is outside [0, 1): it is the share of tokens merged away")
    if int(tile_size) != tile_size or tile_size < 1:
        raise ValueError(f"tile_size={tile_size} must be an integer >= 1 (tokens per tile side)")
    if height < 1 or width < 1:
        raise ValueError(f"grid {height}x{width} is empty; height and width must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = hard nearest-destination assignment)")


def assignment(dst_sim: torch.Tensor, slot_valid: torch.Tensor, temperature: float) -> torch.Tensor:
    """Soft assignment P (B, G, k, n) of each token over its tile's destinations (softmax over k)."""
    logits = dst_sim.masked_fill(~slot_valid.unsqueeze(-1), float("-inf"))
    if temperature == 0:
        best = logits.argmax(dim=-2, keepdim=True)
        slots = torch.arange(logits.shape[-2], device=logits.device).view(-1, 1)
        return (slots == best).float()
    return torch.softmax(logits / temperature, dim=-2)


def own_destinations(assign: torch.Tensor, dst: torch.Tensor, slot_valid: torch.Tensor) -> torch.Tensor:
    """Hard assignment (B, G, k, n) with every used destination pinned to its own token.

    A tile of identical tokens yields distinct but identical destinations; argmax ties would send
    all of them to the first, leaving the others empty (an all-zero merged token).
    """
    positions = torch.arange(assign.shape[-1], device=assign.device)
    own = (dst.unsqueeze(-1) == positions).float() * slot_valid.unsqueeze(-1)
    return torch.where(own.amax(dim=-2, keepdim=True) > 0, own, assign)


def make_plan(
    features: torch.Tensor,
    height: int,
    width: int,
    ratio: float,
    tile_size: int,
    *,
    similarity: str = "cosine",
    temperature: float = 1e-3,
) -> MergePlan:
    """Choose destinations per sample and tile, and build the merge/unmerge matrices.

    features: (B, N, C) with N = height * width in raster order (the block's input tokens).
    ratio in [0, 1): share of tokens merged away; every tile keeps round(n_real * (1 - ratio)),
    at least 1. tile_size >= 1 tokens per side (clamped to the grid). similarity: "cosine"
    (paper), "centered_cosine" or "neg_sq_dist". temperature >= 0: softmax(sim / temperature) over
    destinations; the paper's tau = 1000 is temperature 1e-3, 0 is a hard assignment.
    A plan that would keep every token is the exact no-op `MergePlan`.
    """
    check_plan_args(height, width, ratio, tile_size, temperature)
    check_similarity(similarity)
    if features.dim() != 3 or features.shape[1] != height * width:
        raise ValueError(
            f"features shape {tuple(features.shape)} does not match the grid: expected (B, {height}*{width}"
            f"={height * width}, C); pass the image tokens only, with the latent grid's height and width"
        )
    grid = TileGrid(height, width, int(tile_size), float(ratio))
    if grid.keeps_all:
        return MergePlan(features.shape[0], height * width, features.device)
    tiles = grid.fold(prepare_features(features, similarity))
    sim = pairwise(tiles, similarity)
    pad = grid.pad_mask.to(features.device).expand(sim.shape[:-1])
    dst = facility_location(sim, grid.k, pad)
    dst_sim = sim.gather(-2, dst.unsqueeze(-1).expand(*dst.shape, sim.shape[-1]))
    slot_valid = grid.slot_valid.to(features.device)
    assign = assignment(dst_sim, slot_valid, temperature)
    if temperature == 0:
        assign = own_destinations(assign, dst, slot_valid)
    return TiledMergePlan(grid, dst, assign.masked_fill(pad.unsqueeze(-2), 0.0))
