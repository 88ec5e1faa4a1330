"""Scope keys_values beside the sparse and radial attentions users put on video models, in real
ComfyUI code on tiny Wan models, the other node installed before or after ToMA:

- ComfyUI's "Model Sparse Attention" (stand-in: nodes_sparse_attention.py beside this file): in a
  block whose self-attention it would run sparse (head 128, q / k / v of one shape, in its sigma
  window), ToMA steps aside: the sparse kernel gets every key, as without ToMA, and the run line
  counts the block under the reason; outside its window ToMA merges and the sparse override hands the
  merged call on. On a model whose head size the sparse kernel does not take it never runs sparse, and
  ToMA merges every block.
- ComfyUI-RadialAttn (stand-in: radial_attn_nodes.py): in its window and blocks the radial function
  gets every key (ToMA steps aside, counted), elsewhere ToMA merges.

Nothing is silently off: every call the other node runs sparse or radial without ToMA it runs so with
ToMA, and each block ToMA leaves is on the run line. nodes/machinery/foreign_attention.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import compat_support  # noqa: E402
from compat_support import RUNTIME_LOGGER, run_records  # noqa: E402

from harness.pack import pack_module  # noqa: E402

LATENT = (1, 16, 5, 12, 16)
"""(B, C, F, H, W): 5 x 6 x 8 = 240 tokens per sample."""
KV = {"scope": "keys_values", "blocks": "all", "tile_size": 4}
ORDERS = ["toma_first", "toma_last"]
STEPS = 4


@pytest.fixture(scope="module")
def wan(comfy: Any) -> Any:
    from harness import tiny_wan

    return tiny_wan


@pytest.fixture(scope="module")
def wan128(wan: Any) -> Any:
    """A tiny Wan 2.1 T2V with Wan's head size: 2 heads of 128, 2 blocks."""
    return wan.build_wan("t2v", dim=256, ffn_dim=256, num_heads=2, num_layers=2)


@pytest.fixture(scope="module")
def foreign() -> Any:
    return pack_module("nodes.machinery.foreign_attention")


def sample(wan: Any, tiny: Any, model: Any) -> torch.Tensor:
    latent = (LATENT[0], wan.latent_channels(model), *LATENT[2:])
    return tiny.sample(model, latent, seed=0, steps=STEPS, positive=wan.conditioning(model, 1, latent), negative=wan.conditioning(model, 2, latent))


def sparse(model: Any) -> tuple[Any, Any]:
    import nodes_sparse_attention

    return nodes_sparse_attention.apply_block_sparse_attention(model, start_percent=0.5, end_percent=1.0, min_tokens=64)


def chained(toma: Any, model: Any, other: Any, order: str) -> tuple[Any, Any]:
    """(model with ToMA keys_values and `other`(model) -> (model, record), in that order, the record)."""
    if order == "toma_first":
        return other(compat_support.patch(toma, model, **KV))
    patched, record = other(model)
    return compat_support.patch(toma, patched, **KV), record


def count(calls: list, kind: str) -> int:
    return sum(1 for what, _ in calls if what == kind)


@pytest.mark.parametrize("order", ORDERS)
def test_model_sparse_attention_keeps_its_sparse_calls(
    wan: Any, wan128: Any, tiny: Any, toma: Any, foreign: Any, order: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Every self-attention the sparse node runs sparse without ToMA it runs sparse with ToMA, on every
    key; ToMA counts those block runs under its reason and merges the others (outside the window)."""
    alone, plain = sparse(wan128)
    base = sample(wan, tiny, alone)
    sparse_calls = [shape for what, shape in plain.calls if what == "sparse"]
    assert 0 < len(sparse_calls) < STEPS * 2, plain.calls
    model, record = chained(toma, wan128, sparse, order)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    out = sample(wan, tiny, model)
    run = run_records(caplog)[-1]
    assert [shape for what, shape in record.calls if what == "sparse"] == sparse_calls
    assert run.unmerged_blocks == {foreign.SPARSE_ASIDE.reason: len(sparse_calls)}, run
    assert run.block_runs_merged == STEPS * 2 - len(sparse_calls) > 0, run
    handed_on = [shape for _, shape in record.calls if len(shape) == 4]  # ToMA's merged calls come heads first (B, H, D, e)
    assert len(handed_on) == run.block_runs_merged and all(shape[2] < 240 for shape in handed_on), record.calls
    assert torch.isfinite(out).all() and not torch.equal(out, base)


@pytest.mark.parametrize("order", ORDERS)
def test_model_sparse_attention_off_head_size_merges_every_block(
    wan: Any, tiny: Any, toma: Any, order: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Head size 16: the sparse node would run every call dense, so ToMA merges every block and the
    sparse node hands each merged call on (both apply, nothing lost)."""
    model16 = wan.build_wan("t2v", num_layers=2)
    alone, plain = sparse(model16)
    sample(wan, tiny, alone)
    model, record = chained(toma, model16, sparse, order)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    out = sample(wan, tiny, model)
    run = run_records(caplog)[-1]
    assert count(record.calls, "sparse") == count(plain.calls, "sparse") == 0
    assert run.block_runs_merged == STEPS * 2 and run.unmerged_blocks == {}, run
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("scope", ["keys_values", "block"])
@pytest.mark.parametrize("order", ORDERS)
def test_radial_attention_keeps_its_radial_calls(
    wan: Any, tiny: Any, toma: Any, foreign: Any, order: str, scope: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """RadialAttn from block 1 after 1 dense step: every self-attention that runs radial without ToMA
    runs radial with ToMA on every key (scope block: on every token of the block), counted on the run
    line; the other block runs merge."""
    import radial_attn_nodes

    monkeypatch.setitem(KV, "scope", scope)
    aside = foreign.RADIAL_ASIDE if scope == "keys_values" else foreign.RADIAL_BLOCK

    model = wan.build_wan("t2v", num_layers=3)

    def radial(m: Any) -> tuple[Any, list]:
        return radial_attn_nodes.patch_radial_attn(m, monkeypatch, dense_block=1, dense_timestep=1, last_dense_timestep=0)

    alone, plain = radial(model)
    sample(wan, tiny, alone)
    radial_calls = [shape for what, shape in plain if what == "radial"]
    if not radial_calls:
        pytest.skip("this ComfyUI's Wan sets no transformer_options['block_index'] (0.3.64): RadialAttn never runs radial")
    patched, calls = chained(toma, model, radial, order)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    out = sample(wan, tiny, patched)
    run = run_records(caplog)[-1]
    assert [shape for what, shape in calls if what == "radial"] == radial_calls
    assert run.unmerged_blocks == {aside.reason: len(radial_calls)}, run
    assert run.block_runs_merged == STEPS * 3 - len(radial_calls) > 0, run
    assert torch.isfinite(out).all()
