"""Greedy facility location: pick k representative tokens per tile (ToMA §3.2, Algorithm 1).

F(S) = sum_j max_{i in S} sim(i, j) is monotone submodular, so the greedy below reaches at least
(1 - 1/e) of the optimum. Every iteration is one batched tensor op over all leading dims (tiles,
samples); the only Python loop is over the k picks.
"""

from __future__ import annotations

import torch

TIE_TOLERANCE = 1e-4
"""Gains within this fraction of a tile's best gain count as tied; ties go to the lowest index.

Near-identical tokens (flat regions after the block's LayerNorm) have gains that differ only by
float noise, so a 1e-6 change to the input or the weights, or eager against compiled kernels,
flipped their picks and the whole sampling trajectory with them (docs/defaults.md, "Stability"). A pick at most
this fraction below the best changes F by no more than that fraction.
"""


def facility_location(
    sim: torch.Tensor, k: int, mask: torch.Tensor | None = None, penalty: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return (..., k) distinct indices into n, in greedy order, maximising F(S).

    sim: (..., n, n) similarities (row i = candidate, column j = token it may cover).
    mask: (..., n) bool, True for tokens that may not be chosen and do not count as covered
    (padding). If fewer than k tokens are allowed, the remaining picks are masked tokens, still
    distinct, so callers can drop them by position. Ties (gains within TIE_TOLERANCE of the best)
    go to the lowest index (deterministic);
    chosen tokens are excluded, so a tile of identical tokens still yields k distinct indices.
    penalty (..., n) >= 0: each candidate is picked on gain - penalty x the pick's best gain
    (destinations.penalty_weight: the selection-frequency penalty); None picks on the gain alone.
    """
    return greedy_with_gains(sim, k, mask, penalty)[0]


def greedy_with_gains(
    sim: torch.Tensor, k: int, mask: torch.Tensor | None = None, penalty: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`facility_location` plus the marginal gain of every pick, (..., k) fp32.

    A pick's gain is how much it raised F, also under a penalty (which changes only which token is
    picked); it is -1 for the fallback picks of masked tokens.
    Greedy gains are comparable across tiles, so they can share one budget (make_plan's
    budget="adaptive").
    """
    n = sim.shape[-1]
    if sim.shape[-2] != n:
        raise ValueError(f"sim must be square in its last two dims, got shape {tuple(sim.shape)}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}] (the number of tokens per tile)")
    s = sim.float()
    # Shift so every similarity is >= 0: F(empty) = 0 with zero coverage, same greedy picks.
    s = s - s.amin(dim=(-1, -2), keepdim=True)
    # What a candidate may not gain: -1 for a masked token (picked only when nothing else is left),
    # -inf once chosen; added to the gains, so each pick costs no where / masked_fill pass.
    closed = torch.zeros_like(s[..., 0, :])
    if mask is not None:
        # A masked token is never covered and covers nothing: its column and row stay 0 in s, so
        # it adds exactly 0 to every gain and its own gain is exactly 0 (then -1).
        s.masked_fill_(mask.unsqueeze(-1) | mask.unsqueeze(-2), 0.0)
        closed.masked_fill_(mask, -1.0)
    cover = torch.zeros_like(closed)
    excess = torch.empty_like(s)
    picks, gains = [], []
    for _ in range(k):
        # sum_j max(0, s_vj - cover_j) in one reused buffer: the greedy's cost is these k passes
        gain = torch.sub(s, cover.unsqueeze(-2), out=excess).clamp_min_(0).sum(-1).add_(closed)
        idx = stable_argmax(gain if penalty is None else penalised(gain, penalty))
        pick = idx.unsqueeze(-1)
        picks.append(idx)
        gains.append(gain.gather(-1, pick))
        closed.scatter_(-1, pick, float("-inf"))
        row = s.gather(-2, pick.unsqueeze(-1).expand(*idx.shape, 1, n)).squeeze(-2)
        torch.maximum(cover, row, out=cover)
    return torch.stack(picks, dim=-1), torch.cat(gains, dim=-1)


def penalised(gain: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """(..., n) score of each candidate: gain - penalty x the best gain (>= 0) of its tile's candidates."""
    best = gain.amax(dim=-1, keepdim=True).clamp_min(0)
    return gain - penalty * best


def stable_argmax(gain: torch.Tensor) -> torch.Tensor:
    """(..., n) -> (...,) index of the first entry within TIE_TOLERANCE (relative) of the maximum."""
    best = gain.amax(dim=-1, keepdim=True)
    tied = gain >= best - TIE_TOLERANCE * best.abs()
    return tied.to(torch.uint8).argmax(dim=-1)  # argmax returns the first maximal index
