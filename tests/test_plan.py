"""Invariants of merge plans: shapes, identities, exact round trips, per-sample plans, dtypes."""

from __future__ import annotations

import pytest
import torch

from toma_core import (
    BUDGETS,
    SIMILARITIES,
    UNMERGES,
    MergePlan,
    TiledMergePlan,
    make_plan,
)

GRIDS = [(64, 48, 4), (37, 53, 4), (1, 100, 4), (3, 3, 4), (5, 7, 3), (16, 16, 8), (2, 9, 2)]


def tokens(b: int, n: int, c: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, n, c, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("h,w,t", GRIDS)
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("budget", BUDGETS)
def test_shapes_and_indices(h: int, w: int, t: int, ratio: float, budget: str) -> None:
    x = tokens(2, h * w, 12)
    plan = make_plan(x, h, w, ratio, t, budget=budget)
    d = plan.num_kept
    assert 1 <= d <= h * w
    if t > 1 and h * w >= 4:
        assert d < h * w, "a grid with more than one token per tile must merge something"
    assert abs(d / (h * w) - (1 - ratio)) < 0.2
    assert plan.merge(x).shape == (2, d, 12)
    assert plan.unmerge(plan.merge(x)).shape == x.shape
    assert plan.dst_index.shape == (2, d)
    for row in plan.dst_index:
        assert len(set(row.tolist())) == d, "destinations must be distinct"
        assert 0 <= int(row.min()) and int(row.max()) < h * w


@pytest.mark.parametrize("h,w,t", GRIDS)
def test_ratio_zero_is_exact_identity(h: int, w: int, t: int) -> None:
    x = tokens(2, h * w, 12)
    plan = make_plan(x, h, w, 0.0, t)
    assert plan.num_kept == h * w
    assert plan.merge(x) is x and plan.unmerge(x) is x
    out = x * 3 + 1
    assert plan.unmerge_residual(x, x, out) is out
    assert torch.equal(plan.dst_index[1], torch.arange(h * w))


def test_tile_one_keeps_every_token() -> None:
    x = tokens(1, 64, 8)
    assert type(make_plan(x, 8, 8, 0.9, 1)) is MergePlan


@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize("temperature", [1e-3, 0.0])
@pytest.mark.parametrize("budget", BUDGETS)
def test_constant_clusters_round_trip_exactly(similarity: str, temperature: float, budget: str) -> None:
    # 2x2 blocks of identical tokens in 4x4 tiles, ratio 0.75 keeps 4 per tile: one per block.
    h = w = 8
    cells = tokens(2, (h // 2) * (w // 2), 16).view(2, h // 2, w // 2, 16)
    x = cells.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).reshape(2, h * w, 16)
    plan = make_plan(x, h, w, 0.75, 4, similarity=similarity, temperature=temperature, budget=budget)
    assert plan.num_kept == 16
    torch.testing.assert_close(plan.unmerge(plan.merge(x)), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("h,w,t", GRIDS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_merge_rows_sum_to_one(h: int, w: int, t: int, budget: str) -> None:
    plan = make_plan(tokens(2, h * w, 12), h, w, 0.5, t, budget=budget)
    assert isinstance(plan, TiledMergePlan)
    sums = plan.merge_matrix.sum(-1)[plan.slot_valid.expand_as(plan.merge_matrix[..., 0])]
    torch.testing.assert_close(sums, torch.ones_like(sums))
    unmerge_rows = plan.assign.sum(-2)[~plan.grid.pad_mask().expand(2, -1, -1)]
    torch.testing.assert_close(unmerge_rows, torch.ones_like(unmerge_rows))


def test_hard_assignment_unmerge_is_right_inverse() -> None:
    x = tokens(2, 24 * 20, 8)
    plan = make_plan(x, 24, 20, 0.5, 4, temperature=0.0)
    y = tokens(2, plan.num_kept, 8, seed=5)
    torch.testing.assert_close(plan.merge(plan.unmerge(y)), y)


def test_destinations_are_per_sample() -> None:
    a, b = tokens(1, 256, 16, seed=1), tokens(1, 256, 16, seed=2)
    batch = make_plan(torch.cat([a, b]), 16, 16, 0.5, 4)
    single_a, single_b = make_plan(a, 16, 16, 0.5, 4), make_plan(b, 16, 16, 0.5, 4)
    assert not torch.equal(batch.dst_index[0], batch.dst_index[1])
    assert torch.equal(batch.dst_index[0], single_a.dst_index[0])
    assert torch.equal(batch.dst_index[1], single_b.dst_index[0])
    x = torch.cat([a, b])
    torch.testing.assert_close(batch.merge(x)[1:], single_b.merge(b))


def test_merge_other_widths_and_take() -> None:
    x = tokens(2, 12 * 12, 8)
    plan = make_plan(x, 12, 12, 0.5, 4)
    wide = tokens(2, 144, 40, seed=3)
    assert plan.unmerge(plan.merge(wide)).shape == wide.shape
    positions = torch.arange(144).view(1, 1, 144, 1).float()
    taken = plan.take(positions, dim=2)
    assert taken.shape == (2, 1, plan.num_kept, 1)
    assert torch.equal(taken[:, 0, :, 0].long(), plan.dst_index)


@pytest.mark.parametrize("unmerge", ["delta", "hard"])
def test_residual_form_keeps_token_detail(unmerge: str) -> None:
    x = tokens(1, 64, 8)
    plan = make_plan(x, 8, 8, 0.5, 4, temperature=0.05, unmerge=unmerge)
    merged = plan.merge(x)
    torch.testing.assert_close(plan.unmerge_residual(x, merged, merged), x)


def test_unmerge_variants() -> None:
    """hard: every token takes one destination's value (one-hot rows of U), the soft U's largest;
    output: a block that changes nothing still replaces each token by its destinations' mix."""
    x = tokens(2, 64, 8)
    soft, hard, output = (make_plan(x, 8, 8, 0.5, 4, temperature=0.05, unmerge=u) for u in UNMERGES)
    eye = torch.eye(soft.num_kept).expand(2, -1, -1)
    u_soft, u_hard = soft.unmerge(eye), hard.unmerge(eye)
    assert torch.equal((u_hard > 0).sum(-1), torch.ones(2, 64, dtype=torch.long))
    assert torch.equal(u_hard.argmax(-1), u_soft.argmax(-1))
    assert not torch.allclose(u_soft, u_hard)
    merged = output.merge(x)
    torch.testing.assert_close(output.unmerge_residual(x, merged, merged), output.unmerge(merged))
    assert not torch.allclose(output.unmerge_residual(x, merged, merged), x)


def test_hard_unmerge_equals_soft_at_temperature_zero() -> None:
    x = tokens(2, 64, 8)
    soft, hard = (make_plan(x, 8, 8, 0.5, 4, temperature=0.0, unmerge=u) for u in ("delta", "hard"))
    y = tokens(2, soft.num_kept, 8, seed=1)
    assert torch.equal(soft.unmerge(y), hard.unmerge(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_is_finite(dtype: torch.dtype) -> None:
    x = (tokens(2, 32 * 24, 64) * 30).to(dtype)
    plan = make_plan(x, 32, 24, 0.5, 4)
    merged = plan.merge(x)
    out = plan.unmerge_residual(x, merged, merged * 2)
    assert merged.dtype == dtype and out.dtype == dtype
    assert torch.isfinite(merged).all() and torch.isfinite(out).all()


def test_float_features_in_other_dtype_than_tokens() -> None:
    x = tokens(1, 64, 8)
    plan = make_plan(x.half(), 8, 8, 0.5, 4)
    assert plan.merge(x.double()).dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"ratio": 1.0}, r"ratio=1.0 is outside \[0, 0.95\]"),
        ({"ratio": -0.1}, r"ratio=-0.1 is outside \[0, 0.95\]"),
        ({"tile_size": 0}, r"tile_size=0 must be an integer >= 1"),
        ({"height": 9}, r"does not match the grid"),
        ({"similarity": "dot"}, r"similarity='dot' is not supported"),
        ({"temperature": -1.0}, r"temperature=-1.0 must be >= 0"),
        ({"budget": "global"}, r"budget='global' is not supported"),
        ({"unmerge": "copy"}, r"unmerge='copy' is not supported"),
    ],
)
def test_illegal_arguments_raise_clear_errors(kwargs: dict, match: str) -> None:
    args = {"height": 8, "width": 8, "ratio": 0.5, "tile_size": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        make_plan(tokens(1, 64, 4), **args)


def half_flat_tokens(seed: int = 0) -> torch.Tensor:
    """(1, 16*16, 8): the left half one constant token, the right half random."""
    x = tokens(1, 256, 8, seed=seed).view(1, 16, 16, 8)
    x[:, :, :8] = x[:, :1, :1]
    return x.reshape(1, 256, 8)


def kept_per_half(plan: TiledMergePlan) -> tuple[int, int]:
    cols = plan.dst_index[0] % 16
    return int((cols < 8).sum()), int((cols >= 8).sum())


def test_adaptive_budget_moves_tokens_from_flat_to_detailed_tiles() -> None:
    x = half_flat_tokens()
    tile = make_plan(x, 16, 16, 0.5, 4)
    adaptive = make_plan(x, 16, 16, 0.5, 4, budget="adaptive")
    assert adaptive.num_kept == tile.num_kept == 128
    assert kept_per_half(tile) == (64, 64)
    flat, detailed = kept_per_half(adaptive)
    assert flat == 8, "each flat tile keeps exactly its one mandatory destination"
    assert detailed == 120
    error = {name: (plan.unmerge(plan.merge(x)) - x).norm() for name, plan in (("tile", tile), ("adaptive", adaptive))}
    assert error["adaptive"] < 0.5 * error["tile"]


def test_adaptive_budget_is_per_sample() -> None:
    a, b = half_flat_tokens(1), half_flat_tokens(2).flip(1)
    plan = make_plan(torch.cat([a, b]), 16, 16, 0.5, 4, budget="adaptive")
    single = make_plan(b, 16, 16, 0.5, 4, budget="adaptive")
    assert torch.equal(plan.dst_index[1], single.dst_index[0])
    assert not torch.equal(plan.dst_index[0], plan.dst_index[1])
    torch.testing.assert_close(plan.merge(torch.cat([a, b]))[1:], single.merge(b))


@pytest.mark.parametrize("similarity", ["cosine", "centered_cosine"])
@pytest.mark.parametrize("temperature", [1e-3, 0.0])
def test_zero_tokens_merge_with_each_other(similarity: str, temperature: float) -> None:
    # A flat patch becomes an all-zero token after a LayerNorm: zero tokens are alike, so one
    # destination covers them all and they come back as exact zeros. (neg_sq_dist is left out:
    # there a short non-zero token may rightly join the zero cluster.)
    x = tokens(1, 16, 8)
    x[:, ::2] = 0
    plan = make_plan(x, 4, 4, 0.5, 4, similarity=similarity, temperature=temperature)
    torch.testing.assert_close(plan.unmerge(plan.merge(x))[:, ::2], x[:, ::2], rtol=0, atol=1e-6)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("h,w,t", [(16, 16, 4), (37, 53, 4), (3, 3, 4)])
def test_cluster_sizes_count_every_token_once(h: int, w: int, t: int, budget: str) -> None:
    x = tokens(2, h * w, 8)
    plan = make_plan(x, h, w, 0.5, t, budget=budget)
    sizes = plan.cluster_sizes()
    assert sizes.shape == (2, plan.num_kept) and bool((sizes > 0).all())
    torch.testing.assert_close(sizes.sum(-1), torch.full((2,), float(h * w)))
    hard = make_plan(x, h, w, 0.5, t, budget=budget, temperature=0.0)
    members = hard.unmerge(torch.eye(hard.num_kept).expand(2, -1, -1))
    torch.testing.assert_close(hard.cluster_sizes(), members.sum(1))
    assert torch.equal(make_plan(x, h, w, 0.0, t).cluster_sizes(), torch.ones(2, h * w))
    torch.testing.assert_close(plan.size_bias(), sizes.log())
    assert make_plan(x, h, w, 0.0, t).size_bias() is None
