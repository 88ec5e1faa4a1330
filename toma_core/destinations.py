"""Where a plan's destinations come from: the rules (`DESTINATIONS`) and the selection-frequency
penalty, after DiTo (arXiv 2605.22011), which matches tokens on the similarity of their block
outputs, reused across steps, and penalises destinations chosen too often.

"facility" (ToMA §3.2): destinations and assignment from the planning block's input tokens.
"output_similarity": the same greedy and assignment on the planning block's output tokens of the
previous model call (the caller supplies those features; this module only names the rule).

The penalty lowers the greedy score of a token by penalty x its selection frequency (the share of
this run's earlier plans that chose it) x the pick's best gain (`facility.greedy_with_gains`), so a
token chosen by every earlier plan must beat the best other candidate by that share of its gain.
Penalty 0 is no penalty at all (the greedy runs unchanged). Layouts: (B, N) frequencies, (B, G, n)
tiles (tiling.TileGrid.fold), (B, D) destinations' raster indices (MergePlan.dst_index).
"""

from __future__ import annotations

import torch

from .tiling import TileGrid

FACILITY = "facility"
OUTPUT_SIMILARITY = "output_similarity"
DESTINATIONS = (FACILITY, OUTPUT_SIMILARITY)

PENALTY_RANGE = (0.0, 1.0)


def check_destinations(rule: str, penalty: float) -> None:
    """ValueError naming a rule outside DESTINATIONS or a penalty outside PENALTY_RANGE."""
    if rule not in DESTINATIONS:
        raise ValueError(f"destinations={rule!r} is not supported; use one of {', '.join(DESTINATIONS)}")
    low, high = PENALTY_RANGE
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not low <= penalty <= high:
        raise ValueError(f"destination_penalty={penalty!r} is outside [{low:g}, {high:g}] (0 = no penalty)")


def penalty_weight(grid: TileGrid, frequency: torch.Tensor | None, pad: torch.Tensor, penalty: float) -> torch.Tensor | None:
    """The greedy's (B, G, n) share of a pick's best gain taken off each candidate, or None (no penalty).

    frequency (B, N) in [0, 1]: each token's selection frequency. pad (B|1, G, n) the tile padding:
    padded tokens get penalty + 1, so they stay below every real token, as the fallback picks
    `facility.greedy_with_gains` makes them.
    """
    if frequency is None or penalty == 0:
        return None
    if frequency.dim() != 2 or frequency.shape[1] != grid.num_tokens:
        raise ValueError(f"frequency shape {tuple(frequency.shape)} must be (B, {grid.num_tokens}): one per image token")
    tiles = grid.fold(frequency.float().clamp(0, 1).unsqueeze(-1)).squeeze(-1)
    return (tiles * penalty).masked_fill(pad.expand_as(tiles), penalty + 1.0)


def count_destinations(counts: torch.Tensor | None, dst_index: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """counts (B, N) fp32 (None: zeros) + one for every token that `dst_index` (B|1, D) chose; a new tensor.

    Bookkeeping between plans, never in a merge: the one scatter here runs once per plan built.
    """
    batch = dst_index.shape[0] if counts is None else counts.shape[0]
    base = torch.zeros(batch, num_tokens, device=dst_index.device) if counts is None else counts.clone()
    index = dst_index.to(base.device).expand(batch, -1)
    return base.scatter_add_(1, index, torch.ones(index.shape, device=base.device))
