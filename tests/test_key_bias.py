"""Proportional attention's key bias and how it combines with an existing attention mask."""

from __future__ import annotations

import pytest
import torch

from harness.pack import pack_module

flux = pack_module("nodes.families.flux")


def test_no_bias_keeps_the_mask_object() -> None:
    mask = torch.zeros(2, 5, 5)
    assert flux.add_key_bias(mask, None, 1, 5, torch.float32) is mask
    assert flux.add_key_bias(None, None, 1, 5, torch.float32) is None


def test_bias_lands_on_the_merged_keys_only() -> None:
    bias = torch.tensor([[0.5, 1.0], [2.0, 3.0]])
    out = flux.add_key_bias(None, bias, 2, 6, torch.bfloat16)
    assert out.shape == (2, 1, 1, 6) and out.dtype == torch.bfloat16
    assert torch.equal(out[0, 0, 0].float(), torch.tensor([0, 0, 0.5, 1.0, 0, 0]))
    assert torch.equal(out[1, 0, 0].float(), torch.tensor([0, 0, 2.0, 3.0, 0, 0]))


@pytest.mark.parametrize("shape", [(4, 4), (2, 4, 4), (2, 3, 4, 4)])
def test_additive_masks_of_any_rank_add_up(shape: tuple[int, ...]) -> None:
    mask = torch.randn(shape)
    bias = torch.rand(2, 2)
    out = flux.add_key_bias(mask, bias, 1, 4, torch.float32)
    assert out.ndim == 4 and out.shape[-2:] == (4, 4)
    expected = mask.reshape((1,) * (4 - mask.ndim) + shape) if mask.ndim < 3 else mask
    expected = expected.unsqueeze(1) if expected.ndim == 3 else expected
    torch.testing.assert_close(out - expected, torch.cat([torch.zeros(2, 1), bias, torch.zeros(2, 1)], 1).view(2, 1, 1, 4).expand_as(out))


def test_boolean_mask_becomes_additive() -> None:
    keep = torch.tensor([[True, False], [True, True]])
    out = flux.add_key_bias(keep, torch.ones(1, 1), 1, 2, torch.float32)
    assert out.shape == (1, 1, 2, 2)
    assert torch.equal(out[0, 0], torch.tensor([[0.0, float("-inf")], [0.0, 1.0]]))
