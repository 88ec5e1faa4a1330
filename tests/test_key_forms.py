"""toma_core/keys_values.py's forms of the merged attention (no ComfyUI): the channel under a
caller's softmax scale, the form each kernel contract gets (choose_form), and the balanced plan
behind equal_mass (MergePlan.balanced)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.pack import pack_module

core = pack_module("toma_core")
kv = pack_module("toma_core.keys_values")
kernels = pack_module("toma_core.kernels")
cost = pack_module("toma_core.cost")


@pytest.mark.parametrize("scale", [None, 0.05, 0.3])
@pytest.mark.parametrize("head", [64, 128])
def test_mass_channel_under_a_callers_scale(head: int, scale: float | None) -> None:
    """A kernel handed scale s (ComfyUI's `scale` keyword) computes softmax(q' k'^T s) v': the
    channel gives softmax(q k^T s + log m) v; without s, the kernel's 1 / sqrt(e') gives the
    model's 1 / sqrt(e)."""
    gen = torch.Generator().manual_seed(head)
    q, k, v = (torch.randn(2, 3, n, head, generator=gen, dtype=torch.float64) for n in (10, 12, 12))
    bias = torch.rand(2, 12, generator=gen, dtype=torch.float64) * 3
    qp, kp, vp = kv.with_mass_channel(q, k, v, bias, scale)
    out = F.scaled_dot_product_attention(qp, kp, vp, scale=scale)[..., :head]
    s = 1 / math.sqrt(head) if scale is None else scale
    expected = ((q @ k.transpose(-1, -2)) * s + bias[:, None, None, :]).softmax(-1) @ v
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", list(pack_module("toma_core.kernels").KERNELS))
@pytest.mark.parametrize("head", [64, 128])
def test_the_channel_only_where_its_head_costs_no_dearer_bucket(name: str, head: int) -> None:
    """The channel where e' lands in e's bucket (or the kernel has none); otherwise never a head the
    kernel refuses or runs dearer: equal_mass over image keys alone, plain beside text keys."""
    kernel = kernels.KERNELS[name]
    wider = cost.padded_head(head)
    for image_only, other in ((True, kv.EQUAL_MASS), (False, kv.PLAIN)):
        form = kv.choose_form(kernel, head, image_only)
        if form == kv.CHANNEL:
            assert not kernel.buckets or kernel.bucket(wider) == kernel.bucket(head)
        else:
            assert form == other and kernel.cost_ratio(head, wider) != 1


def test_an_unknown_kernel_keeps_the_head_size() -> None:
    assert kv.choose_form(None, 128, True) == kv.EQUAL_MASS and kv.choose_form(None, 64, False) == kv.PLAIN


def features(batch: int = 2, frames: int = 1, side: int = 16, seed: int = 0) -> torch.Tensor:
    """(B, F side^2, 32) smooth random features (a coarse field upsampled, plus noise), as images are."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn(batch, 32, frames, side // 4, side // 4, generator=gen)
    field = F.interpolate(coarse, size=(frames, side, side), mode="trilinear").flatten(2).transpose(1, 2)
    return field + 0.3 * torch.randn(field.shape, generator=gen)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_balanced_plan_has_equal_masses(ratio: float) -> None:
    """Every destination of a full tile stands for n / k tokens (to rounding), each token still weighs
    about 1 in all (Sinkhorn's token normalisation), the destinations are the plan's own, and each
    merged token stays a convex mix of its tile's tokens (plan.BALANCE_TEMPERATURE)."""
    x = features()
    plan = core.make_plan(x, 16, 16, ratio, 4)
    balanced = plan.balanced()
    masses = balanced.cluster_sizes()
    torch.testing.assert_close(masses, torch.full_like(masses, 16 / plan.grid.k), rtol=1e-4, atol=1e-4)
    weights = balanced.assign.sum(-2)
    assert float((weights - 1).abs().mean()) < 0.02 and float((weights - 1).abs().max()) < 0.4
    assert torch.equal(balanced.dst_index, plan.dst_index) and balanced is plan.balanced()
    merged = balanced.merge(x)
    assert merged.shape == plan.merge(x).shape and torch.isfinite(merged).all()
    assert float(plan.size_bias().std()) > 0 and core.MergePlan(2, 256).balanced().num_kept == 256


def test_balanced_video_plan_balances_each_segment() -> None:
    video = pack_module("toma_core.video")
    x = features(batch=1, frames=4)
    plan = video.make_video_plan(x, [video.Segment(4, True, 2)], 16, 16, 0.5, 4)
    masses = plan.balanced().cluster_sizes()
    assert float(masses.max() - masses.min()) < 1e-3 * float(masses.max())
