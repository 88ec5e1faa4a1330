"""Stand-ins for the attention kernels users select, each written from its published head-size
contract (sources: ../shared/research/attention_kernels.md; the lines cited per stand-in), and
installed the way users install them: ComfyUI's own flag (its attention function becomes the
model's `optimized_attention`, with ComfyUI's error-and-fallback code running around the kernel) or
KJNodes' "Patch Sage Attention KJ" override (the real pack node, no try/except).

Every stand-in records each call (head size, bucket, query and key lengths, its output) and computes
the attention itself in fp32: softmax(q k^T scale) v, scale = the caller's or 1 / sqrt(head).
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch


@dataclass
class StandIn:
    """One kernel: `bucket(head)` -> the head size it runs at, or raises as the kernel does."""

    name: str
    sizes: tuple[int, ...]
    exact: bool = False
    calls: list[dict] = field(default_factory=list)

    def bucket(self, head: int) -> int:
        for size in self.sizes:
            if head == size or (head < size and not self.exact):
                return size
        raise ValueError(f"Unsupported head_dim: {head}")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, heads_first: bool) -> torch.Tensor:
        """q, k, v (B, H, L, e) when heads_first, else (B, L, H, e); the output in q's layout and dtype."""
        head = q.shape[-1]
        bucket = self.bucket(head)
        if not heads_first:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        logits = q.float() @ k.float().transpose(-1, -2) * (scale or 1 / math.sqrt(head))
        out = (logits.softmax(-1) @ v.float()).to(q.dtype)
        self.calls.append({"head": head, "bucket": bucket, "queries": q.shape[2], "keys": k.shape[2], "out": out.detach().clone()})
        return out if heads_first else out.transpose(1, 2)


def sage2() -> StandIn:
    # thu-ml/SageAttention@d1a57a5 sageattention/core.py (~760): a head below 64 is padded to 64,
    # below 128 to 128; above 128 `raise ValueError(f"Unsupported head_dim: {headdim_og}")`.
    return StandIn("sage2", (64, 128))


def sage1() -> StandIn:
    # sageattention 1.0.6 (PyPI, Triton) core.py (~92): `assert headdim in [64, 96, 128]`.
    return StandIn("sage1", (64, 96, 128), exact=True)


def sage3() -> StandIn:
    # SageAttention 3 (Blackwell) sageattn3 api.cu (~260): head 64, 128 or 256 only.
    return StandIn("sage3", (64, 128, 256), exact=True)


def flash(version: str) -> StandIn:
    # Dao-AILab/flash-attention@0251105 csrc/flash_attn/flash_api.cpp rounds the head up to the kernels
    # of static_switch.h: 32, 64, 96, 128, 160, 192, 256 through 2.7.4; 2.8.0 dropped the 160 kernel.
    sizes = (32, 64, 96, 128, 160, 192, 256) if version < "2.8" else (32, 64, 96, 128, 192, 256)
    return StandIn(f"flash {version}", sizes)


def kitchen() -> StandIn:
    # comfy-kitchen 0.2.31 sage_attention.py: int8 attention pads the head to 128 or 256.
    return StandIn("kitchen_int8", (128, 256))


def sage_module(kernel: StandIn, cuda: bool, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A `sageattention` package whose sageattn is the stand-in: 2.x (cuda: it has the CUDA kernels'
    functions, e.g. sageattn_qk_int8_pv_fp16_cuda) or the Triton-only 1.0.6."""
    module = types.ModuleType("sageattention")

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, attn_mask=None, **kwargs):
        assert attn_mask is None and not is_causal
        return kernel.attend(q, k, v, sm_scale, tensor_layout == "HND")

    sageattn.__module__ = "sageattention.core"
    module.sageattn = sageattn
    if cuda:
        module.sageattn_qk_int8_pv_fp16_cuda = sageattn
    monkeypatch.setitem(sys.modules, "sageattention", module)
    return module


MODEL_MODULES = ("comfy.ldm.modules.attention", "comfy.ldm.wan.model", "comfy.ldm.flux.math")
"""The modules whose `optimized_attention` the tiny models read (each imports it by name at import)."""


def use_function(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """ComfyUI's attention function `name` as the models' optimized_attention, as its flag selects it
    at import (comfy/ldm/modules/attention.py: `optimized_attention = attention_sage` & co.)."""
    import importlib

    import comfy.ldm.modules.attention as attention

    chosen = getattr(attention, name, None)
    if chosen is None:
        pytest.skip(f"this ComfyUI has no comfy.ldm.modules.attention.{name}")
    for module in MODEL_MODULES:
        monkeypatch.setattr(importlib.import_module(module), "optimized_attention", chosen)
    return attention


def install_flag(kind: str, kernel: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """ComfyUI's own flag for `kind` with `kernel` under it: --use-sage-attention (sage 2 / 1.0.6),
    --use-flash-attention (flash_attn 2.7 / 2.8), --use-ck-attention (comfy-kitchen int8, 0.33)."""
    if kind in ("sage2", "sage1"):
        attention = use_function("attention_sage", monkeypatch)
        module = sage_module(kernel, kind == "sage2", monkeypatch)
        monkeypatch.setattr(attention, "sageattn", module.sageattn, raising=False)
    elif kind.startswith("flash"):
        attention = use_function("attention_flash", monkeypatch)
        package = types.ModuleType("flash_attn")
        package.__version__ = kernel.name.split()[1] + ".0"
        monkeypatch.setitem(sys.modules, "flash_attn", package)

        def flash_attn_func(q, k, v, dropout_p=0.0, causal=False, softmax_scale=None):
            return kernel.attend(q, k, v, softmax_scale, heads_first=False)

        monkeypatch.setattr(attention, "flash_attn_func", flash_attn_func, raising=False)
    elif kind == "kitchen_int8":
        attention = use_function("attention_comfy_kitchen_int8", monkeypatch)

        def int8_attention(q, k, v, scale=None, attn_mask=None):
            assert attn_mask is None
            return kernel.attend(q, k, v, scale, heads_first=True)

        monkeypatch.setattr(attention, "comfy_kitchen", types.SimpleNamespace(int8_attention=int8_attention))
    else:
        raise ValueError(kind)


def install_kjnodes(mode: str, kernel: StandIn, model: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """KJNodes' "Patch Sage Attention KJ" (the 2026-08 snapshot's PathchSageAttentionKJ) on a clone
    of `model` in `mode` ("auto": sageattention's sageattn; "sageattn3": sageattn3_blackwell), its
    sage import pointed at the stand-in; the node calls it with no try/except
    (nodes/model_optimization_nodes.py attention_override_sage)."""
    from harness import third_party as tp

    sage_module(kernel, True, monkeypatch)
    blackwell = types.ModuleType("sageattn3")

    def sageattn3_blackwell(q, k, v, is_causal=False, attn_mask=None, per_block_mean=False):
        return kernel.attend(q, k, v, None, heads_first=True)

    blackwell.sageattn3_blackwell = sageattn3_blackwell
    monkeypatch.setitem(sys.modules, "sageattn3", blackwell)
    try:
        nodes = tp.pack_module(tp.KJNODES_2026, "nodes.model_optimization_nodes")
    except ImportError as error:
        pytest.skip(f"{tp.KJNODES_2026} does not import on this ComfyUI: {error}")
    return nodes.PathchSageAttentionKJ().patch(model, mode)[0]
