"""Regression: a hard assignment (temperature 0) never leaves a destination empty when a tile
holds identical tokens (argmax ties used to send them all to the first destination, so the other
merged tokens were all-zero vectors). Found by bench/tokens/fidelity.py on flat image regions."""

from __future__ import annotations

import torch

from toma_core import make_plan


def _two_valued_tile() -> torch.Tensor:
    x = torch.ones(1, 16, 8)
    x[0, :, 0] = (torch.arange(16) % 2).float()  # only two distinct tokens in the 4x4 tile
    return x


def test_hard_assignment_has_no_empty_destination():
    x = _two_valued_tile()
    plan = make_plan(x, 4, 4, 0.5, 4, temperature=0.0)
    merged = plan.merge(x)
    assert bool((merged.norm(dim=-1) > 0).all())
    assert torch.equal(merged, x[:, plan.dst_index[0]])  # each merged token equals its destination


def test_hard_assignment_is_a_left_inverse():
    x = torch.randn(2, 12 * 10, 6, generator=torch.Generator().manual_seed(0))
    x[:, :40] = 0.5  # a flat region: many ties
    for tile in (3, 4):
        plan = make_plan(x, 12, 10, 0.5, tile, temperature=0.0)
        eye = torch.eye(plan.num_kept).expand(2, -1, -1)
        assert torch.allclose(plan.merge(plan.unmerge(eye)), eye)  # M U = I
