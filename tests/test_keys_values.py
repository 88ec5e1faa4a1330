"""toma_core/keys_values.py: the keys/values merge and its log-mass channel (no ComfyUI)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.pack import pack_module

core = pack_module("toma_core")
kv = pack_module("toma_core.keys_values")
cost = pack_module("toma_core.cost")
constants = pack_module("toma_core.cost_constants")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(e) + bias) v for (B, H, L, e), bias (B, L_k) on the keys."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    return logits.softmax(-1) @ v


def flat_plan(batch: int = 2, side: int = 8, ratio: float = 0.5, seed: int = 0) -> tuple[object, torch.Tensor]:
    """A plan over a side x side grid whose tokens repeat within 2 x 1 pairs (each pair one value), and
    the features it was built from (B, N, C)."""
    gen = torch.Generator().manual_seed(seed)
    half = torch.randn(batch, side, side // 2, 16, generator=gen)
    features = half.repeat_interleave(2, dim=2).flatten(1, 2)
    return core.make_plan(features, side, side, ratio, 2, temperature=0.0), features


@pytest.mark.parametrize("head", [7, 8, 32, 64, 128])
def test_mass_channel_is_the_biased_attention(head: int) -> None:
    """The padded q / k / v through an unbiased kernel give softmax(q k / sqrt(e) + bias) v in their first
    e channels, and the padded head size is the next multiple of 8 above e."""
    gen = torch.Generator().manual_seed(head)
    q, k, v = (torch.randn(2, 3, n, head, generator=gen, dtype=torch.float64) for n in (10, 12, 12))
    bias = torch.rand(2, 12, generator=gen, dtype=torch.float64) * 3
    qp, kp, vp = kv.with_mass_channel(q, k, v, bias)
    assert qp.shape[-1] == kp.shape[-1] == vp.shape[-1] == cost.padded_head(head)
    assert qp.shape[-1] % constants.HEAD_MULTIPLE == 0 and qp.shape[-1] > head
    out = F.scaled_dot_product_attention(qp, kp, vp)[..., :head]
    torch.testing.assert_close(out, attention(q, k, v, bias))


def test_merged_keys_with_mass_are_exact_for_repeated_tokens() -> None:
    """Keys and values that repeat within each merged cluster (a hard plan over 2 x 1 pairs): attention
    over the D merged keys with their log-mass equals attention over all N; without the mass it differs."""
    plan, features = flat_plan()
    assert plan.num_kept == plan.num_tokens // 2
    heads, e, text = 2, 8, 3
    gen = torch.Generator().manual_seed(1)
    proj = torch.randn(16, heads * e, generator=gen)
    k_img = (features @ proj).unflatten(-1, (heads, e)).transpose(1, 2)
    v_img = (features @ proj.flip(1)).unflatten(-1, (heads, e)).transpose(1, 2)
    k = torch.cat([torch.randn(2, heads, text, e, generator=gen), k_img], dim=2)
    v = torch.cat([torch.randn(2, heads, text, e, generator=gen), v_img], dim=2)
    q = torch.randn(2, heads, 20, e, generator=gen)
    exact = attention(q, k, v)
    k_m, v_m = kv.merge_key_rows(k, plan, text), kv.merge_key_rows(v, plan, text)
    assert k_m.shape[2] == text + plan.num_kept
    torch.testing.assert_close(k_m[:, :, :text], k[:, :, :text])
    bias = kv.key_bias(plan, text, k_m.shape[2], q)
    assert torch.equal(bias[:, :text], torch.zeros_like(bias[:, :text]))
    torch.testing.assert_close(bias[:, text:], torch.full_like(bias[:, text:], math.log(2)))
    torch.testing.assert_close(attention(q, k_m, v_m, bias), exact, rtol=1e-4, atol=1e-5)
    assert (attention(q, k_m, v_m) - exact).abs().max() > 1e-3


def test_keys_are_merged_per_sample() -> None:
    """Each sample's keys merge with its own destinations: sample 1's merged keys are those of a
    plan built from sample 1 alone."""
    plan, features = flat_plan(batch=2, seed=3)
    single = core.make_plan(features[1:], 8, 8, 0.5, 2, temperature=0.0)
    k = torch.randn(2, 2, 64, 8, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(kv.merge_key_rows(k, plan, 0)[1:], kv.merge_key_rows(k[1:], single, 0))


def test_shared_keys_expand_to_the_plan_batch() -> None:
    plan, _ = flat_plan(batch=2)
    k = torch.randn(1, 2, 64 + 5, 8)
    assert kv.merge_key_rows(k, plan, 5).shape == (2, 2, 5 + plan.num_kept, 8)


def test_no_op_plan_has_no_bias_and_merges_nothing() -> None:
    plan = core.MergePlan(2, 64)
    k = torch.randn(2, 2, 70, 8)
    assert kv.key_bias(plan, 3, 70, k) is None
    assert torch.equal(kv.merge_key_rows(k, plan, 3), k)


def test_take_span_keeps_rows_around_the_image() -> None:
    """take_span gives the destinations' rows in place of the N image rows; the rows before and after stay."""
    plan, _ = flat_plan(batch=2)
    rows = torch.arange(3 + 64 + 2, dtype=torch.float32).view(1, -1, 1)
    taken = kv.take_span(rows, 1, 3, plan)
    assert taken.shape == (2, 3 + plan.num_kept + 2, 1)
    assert torch.equal(taken[:, :3, 0], rows[0, :3, 0].expand(2, -1))
    assert torch.equal(taken[:, -2:, 0], rows[0, -2:, 0].expand(2, -1))
    assert torch.equal(taken[:, 3:-2, 0], (plan.dst_index + 3).float())
