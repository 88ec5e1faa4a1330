"""Greedy facility location against a brute-force reference (ToMA §3.2)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from toma_core import facility_location


def objective(sim: torch.Tensor, picks: list[int]) -> float:
    """F(S) = sum_j max_{i in S} (sim_ij - min sim), the non-negative facility-location value."""
    shifted = sim - sim.min()
    return float(shifted[picks].max(dim=0).values.sum())


def assert_greedy(sim: torch.Tensor, picks: list[int]) -> None:
    """Each pick must be a best next token of a plain-Python greedy in float64 (exact ties in
    float32 may go either way, so a pick within 1e-5 of the best gain counts as the same)."""
    sim = sim.double()
    for step, pick in enumerate(picks):
        chosen = picks[:step]
        values = [objective(sim, chosen + [v]) if v not in chosen else -math.inf for v in range(sim.shape[0])]
        assert pick not in chosen
        assert values[pick] >= max(values) - 1e-5, f"step {step}: picked {pick}, gains {values}"


def random_sim(seed: int, n: int) -> torch.Tensor:
    x = torch.nn.functional.normalize(torch.randn(n, 5, generator=torch.Generator().manual_seed(seed)), dim=-1)
    return x @ x.T


@pytest.mark.parametrize("seed", range(8))
def test_matches_reference_greedy_and_bound(seed: int) -> None:
    n, k = 9, 3
    sim = random_sim(seed, n)
    picks = facility_location(sim, k).tolist()
    assert_greedy(sim, picks)
    optimum = max(objective(sim, list(s)) for s in itertools.combinations(range(n), k))
    assert objective(sim, picks) >= (1 - 1 / math.e) * optimum - 1e-5


def test_batched_equals_per_item() -> None:
    sims = torch.stack([random_sim(s, 16) for s in range(6)]).view(2, 3, 16, 16)
    batched = facility_location(sims, 5)
    assert batched.shape == (2, 3, 5)
    for i, j in itertools.product(range(2), range(3)):
        assert torch.equal(batched[i, j], facility_location(sims[i, j], 5))


def test_flat_tile_gives_distinct_indices() -> None:
    picks = facility_location(torch.ones(4, 16, 16), 8)
    assert all(len(set(row.tolist())) == 8 for row in picks)


def test_mask_excludes_padding_until_exhausted() -> None:
    mask = torch.tensor([False, True, False, True, False, True])
    picks = facility_location(random_sim(3, 6), 5, mask).tolist()
    assert len(set(picks)) == 5
    assert set(picks[:3]) == {0, 2, 4}


def test_padding_does_not_count_as_covered() -> None:
    sim = torch.eye(4)
    sim[3, 1] = sim[1, 3] = 1.0
    # Token 3 is padding: covering it must not make token 1 look better than token 0.
    mask = torch.tensor([False, False, False, True])
    assert facility_location(sim, 1, mask).tolist() == [0]
    assert facility_location(sim, 1).tolist() == [1]


def test_deterministic() -> None:
    sim = torch.stack([random_sim(s, 16) for s in range(4)])
    assert torch.equal(facility_location(sim, 6), facility_location(sim.clone(), 6))


@pytest.mark.parametrize("k", [0, 7])
def test_rejects_k_outside_range(k: int) -> None:
    with pytest.raises(ValueError, match=f"k={k}"):
        facility_location(torch.eye(6), k)


def test_near_ties_go_to_the_lowest_index_whatever_the_float_noise() -> None:
    """Near-identical tokens must not let 1e-6 noise flip the picks."""
    from toma_core.facility import TIE_TOLERANCE

    torch.manual_seed(0)
    base = torch.nn.functional.normalize(torch.randn(3, 8), dim=-1).repeat_interleave(4, dim=0)  # 3 groups of 4 twins
    picks = []
    for trial in range(20):
        tokens = base + 1e-6 * torch.randn(base.shape, generator=torch.Generator().manual_seed(trial))
        tokens = torch.nn.functional.normalize(tokens, dim=-1)
        picks.append(facility_location(tokens @ tokens.T, 3).tolist())
    assert all(p == picks[0] for p in picks)
    assert sorted(picks[0]) == [0, 4, 8]  # the first twin of each group
    assert TIE_TOLERANCE < 1e-2  # a "tie" stays a near-tie: F loses at most that fraction per pick


def test_a_clearly_better_later_token_still_wins() -> None:
    """The tolerance breaks near-ties only: a gain 1% above the first token's is picked."""
    sim = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    sim[2, :2] = 0.01  # token 2 covers a little of the others: larger first gain
    assert facility_location(sim, 1).tolist() == [2]
