"""Merge plans: per-sample destination tokens and the soft merge/unmerge matrices (ToMA §3.3).

A plan is built once from one block's input features and reused for every tensor that lives on
the same token grid (other blocks, other channel widths, positional rows). Merge and unmerge are
batched matmuls over tiles: (B, G, k, n) @ (B, G, n, C); no sort, no scatter.
"""

from __future__ import annotations

import torch

from .assignment import adaptive_slots, assignment, balanced_assignment, hard_assignment, own_destinations
from .checks import check_plan_args, whole
from .destinations import penalty_weight
from .facility import facility_location, greedy_with_gains
from .rows import select_rows, take_destinations, take_rows
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

    def _merge_into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """merge(x) written into out (B, D, C): a SegmentPlan's parts fill one tensor, no concatenation."""
        return out.copy_(self.merge(x))

    def _unmerge_residual_into(self, x: torch.Tensor, merged_in: torch.Tensor, merged_out: torch.Tensor,
                               out: torch.Tensor) -> torch.Tensor:
        """unmerge_residual written into out (B, N, C), all four of one dtype."""
        return out.copy_(self.unmerge_residual(x, merged_in, merged_out))

    def cluster_sizes(self) -> torch.Tensor:
        """(B, D) fp32: how many tokens each merged token stands for (soft counts, sum N).

        log(cluster_sizes()) added to a merged key's attention logits makes it weigh as much as
        its tokens would (proportional attention, as in ToMe for ViTs).
        """
        return torch.ones(self.batch, self.num_tokens, device=self.device)

    def balanced(self) -> MergePlan:
        """The plan with the same destinations whose every destination of a tile stands for the same
        number of tokens (assignment.balanced_assignment); itself when it cannot be balanced."""
        return self

    def size_bias(self) -> torch.Tensor | None:
        """(B, D) fp32 log cluster sizes, to add to the merged keys' attention logits so each
        merged token weighs as much as the tokens it stands for (proportional attention, as in
        ToMe for ViTs). None for the no-op plan: there is nothing to correct."""
        return None

    def take(self, rows: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Rows of the destinations along `dim` (size N there, batch 1 or B in dim 0) -> size D.

        Used for positional embeddings: a merged token sits at its destination's position.
        """
        return rows


class TiledMergePlan(MergePlan):
    """A plan that merges N -> D tokens tile by tile; see `make_plan`.

    dst (B, G, k) tile-local destination indices; assign (B, G, k, n) the soft assignment P
    (zero rows for unused slots); maps: None when every slot is used, else (kept (B|1, D) the
    slot of each kept token, source (B|1, G*k) the kept token each slot reads on unmerge).
    """

    def __init__(
        self, grid: TileGrid, dst: torch.Tensor, assign: torch.Tensor, maps: tuple[torch.Tensor, torch.Tensor] | None,
        unmerge: str = "delta", logits: torch.Tensor | None = None,
    ) -> None:
        super().__init__(assign.shape[0], grid.num_tokens, assign.device)
        self._logits = logits
        self._balanced: MergePlan | None = None
        self.grid = grid
        self.dst = dst
        self.assign = assign
        self.maps = maps
        self.unmerge_mode = unmerge
        self._merge = assign / assign.sum(-1, keepdim=True).clamp_min(1e-12)
        self._unmerge = (hard_assignment(assign) if unmerge == "hard" else assign).transpose(-1, -2)
        self._cast_cache: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._index = self._raster_destinations()
        # merge and unmerge run in every merged block: their folds are one index_select each
        self._fold_index = grid.fold_index(self.device)
        self._unfold_index = grid.unfold_index(self.device)

    @property
    def slot_valid(self) -> torch.Tensor:
        """(B, G, k) bool: the destination slots in use (exactly D per sample)."""
        return self.assign.sum(-1) > 0

    def _raster_destinations(self) -> torch.Tensor:
        local_to_raster = self.grid.raster_index(self.device).expand(self.batch, -1, -1)
        flat = local_to_raster.gather(-1, self.dst).flatten(1)
        return self._keep(flat.unsqueeze(-1)).squeeze(-1)

    def _keep(self, slots: torch.Tensor) -> torch.Tensor:
        """(B, G*k, C) slots -> (B, D, C), dropping the unused slots."""
        if self.maps is None:
            return slots
        return take_rows(slots, self.maps[0])

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

    def cluster_sizes(self) -> torch.Tensor:
        return self._keep(self.assign.sum(-1).flatten(1).unsqueeze(-1)).squeeze(-1)

    def size_bias(self) -> torch.Tensor | None:
        return self.cluster_sizes().log()

    def balanced(self) -> MergePlan:
        """Built once, from the assignment logits (B, G, k, n) `make_plan` handed over."""
        if self._logits is None:
            return self
        if self._balanced is None:
            assign = balanced_assignment(self._logits, self.slot_valid, self.assign.sum(-2) > 0)
            self._balanced = TiledMergePlan(self.grid, self.dst, assign, self.maps, self.unmerge_mode)
        return self._balanced

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        return self._merge_into(x, None)

    def _merge_into(self, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        # Padded positions read a real token of their tile; the merge matrix gives them weight 0.
        tiles = x.index_select(1, self._fold_index.to(x.device))
        tiles = tiles.view(x.shape[0], self.grid.num_tiles, self.grid.tile_tokens, x.shape[-1])
        merged = (self._matrix("merge", x) @ tiles).flatten(1, 2)
        if self.maps is None:
            return merged if out is None else out.copy_(merged)
        return take_rows(merged, self.maps[0], out)

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        return self._unmerge_into(y, None)

    def _unmerge_into(self, y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if self.maps is not None:
            y = take_rows(y, self.maps[1])
        tiles = y.view(y.shape[0], self.grid.num_tiles, self.dst.shape[-1], y.shape[-1])
        change = (self._matrix("unmerge", y) @ tiles).flatten(1, 2)
        return select_rows(change, self._unfold_index.to(y.device), out)

    def unmerge_residual(self, x: torch.Tensor, merged_in: torch.Tensor, merged_out: torch.Tensor) -> torch.Tensor:
        if self.unmerge_mode == "output":
            return self.unmerge(merged_out)
        change = self.unmerge(merged_out - merged_in)
        if change.shape == x.shape and change.dtype == x.dtype:
            return change.add_(x)  # x + change, into the fresh tensor: no third (B, N, C) buffer
        return x + change

    def _unmerge_residual_into(self, x: torch.Tensor, merged_in: torch.Tensor, merged_out: torch.Tensor,
                               out: torch.Tensor) -> torch.Tensor:
        if self.unmerge_mode == "output":
            return self._unmerge_into(merged_out, out)
        return self._unmerge_into(merged_out - merged_in, out).add_(x)

    def take(self, rows: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return take_destinations(rows, self._index, dim)


BUDGETS = ("tile", "adaptive")

BALANCE_TEMPERATURE = 0.03
"""The softest assignment temperature `TiledMergePlan.balanced` works at. At the paper's 1e-3 the
Sinkhorn iterations barely move a token (8 of them leave tokens weighing 0.22..2 instead of 1); at
0.03, 24 leave each token's total weight within 0.02 of 1 on average, with merged tokens nearly as
close to their tokens as the unbalanced plan's (smooth random fields of 16 x 16 and 32 x 32 x 4 tokens,
ratio 0.5, tile 4: tests/test_key_forms.py)."""

UNMERGES = ("delta", "hard", "output")
"""How a block's merged result returns to N tokens (compared in docs/defaults.md). delta: x + U(f(Mx) - Mx),
each token adds the soft mix of its destinations' changes (default). hard: the same with each
token taking its most similar destination's change alone. output: U f(Mx), each token replaced by
its destinations' outputs (the block's own detail between tokens of a cluster is lost)."""


def make_plan(
    features: torch.Tensor,
    height: int,
    width: int,
    ratio: float,
    tile_size: int,
    *,
    similarity: str = "cosine",
    temperature: float = 1e-3,
    budget: str = "tile",
    unmerge: str = "delta",
    frames: int = 1,
    tile_frames: int = 1,
    frequency: torch.Tensor | None = None,
    penalty: float = 0.0,
) -> MergePlan:
    """Choose destinations per sample and tile, and build the merge/unmerge matrices.

    features: (B, N, C) with N = frames * height * width in t-major raster order (the block's
    input tokens); tiles span tile_frames frames (video tokens; see toma_core/video.py).
    ratio in RATIO_RANGE ([0, 0.95], checks.py): share of tokens merged away; D = sum over tiles of round(n_real * (1 - ratio)),
    at least 1 per tile. tile_size >= 1 tokens per side (clamped to the grid). similarity:
    "cosine" (paper), "centered_cosine" or "neg_sq_dist". temperature >= 0:
    softmax(sim / temperature) over destinations; the paper's tau = 1000 is temperature 1e-3,
    0 is a hard assignment. budget: "tile" keeps the same share of every tile (paper);
    "adaptive" shares the same D over the tiles of each sample by facility-location gain.
    unmerge: one of UNMERGES (how `unmerge_residual` returns a block's result to N tokens).
    frequency (B, N) in [0, 1] and penalty in [0, 1]: the selection-frequency penalty (destinations.py).
    A plan that would keep every token is the exact no-op `MergePlan`.
    """
    check_plan_args(height, width, ratio, tile_size, temperature)
    check_similarity(similarity)
    if budget not in BUDGETS:
        raise ValueError(f"budget={budget!r} is not supported; use one of {', '.join(BUDGETS)}")
    if unmerge not in UNMERGES:
        raise ValueError(f"unmerge={unmerge!r} is not supported; use one of {', '.join(UNMERGES)}")
    if not (whole(frames, 1) and whole(tile_frames, 1)):
        raise ValueError(f"frames={frames} and tile_frames={tile_frames} must be integers >= 1")
    grid = TileGrid(height, width, int(tile_size), float(ratio), frames=int(frames), tile_frames=int(tile_frames))
    if features.dim() != 3 or features.shape[1] != grid.num_tokens:
        raise ValueError(
            f"features shape {tuple(features.shape)} does not match the grid: expected (B, {frames}*{height}*{width}"
            f"={grid.num_tokens}, C); pass the image tokens only, with the latent grid's frames, height and width"
        )
    if grid.keeps_all:
        return MergePlan(features.shape[0], grid.num_tokens, features.device)
    tiles = grid.fold(prepare_features(features, similarity))
    sim = pairwise(tiles, similarity)
    pad = grid.pad_mask(features.device).expand(sim.shape[:-1])
    weight = penalty_weight(grid, frequency, pad, penalty)
    if budget == "adaptive":
        dst, gains = greedy_with_gains(sim, grid.max_real, pad, weight)
        slot_valid, maps = adaptive_slots(gains, grid.num_kept)
    else:
        dst = facility_location(sim, grid.k, pad, weight)
        slot_valid = grid.slot_valid(features.device).unsqueeze(0)
        static = grid.slot_maps(features.device)
        maps = None if static is None else (static[0].unsqueeze(0), static[1].unsqueeze(0))
    dst_sim = sim.gather(-2, dst.unsqueeze(-1).expand(*dst.shape, sim.shape[-1]))
    logits = dst_sim / max(temperature, BALANCE_TEMPERATURE)
    assign = assignment(dst_sim, slot_valid, temperature)
    if temperature == 0:
        assign = own_destinations(assign, dst, slot_valid)
    return TiledMergePlan(grid, dst, assign.masked_fill_(pad.unsqueeze(-2), 0.0), maps, unmerge, logits)
