"""Checks every DiT family beyond Flux, SDXL and Wan must pass on its tiny ComfyUI model (the family test files
call them with their model, latent and conditioning):

- ratio 0 (every block) is bit-identical to the unpatched model, in scope block and keys_values;
- at ratio 0.5 the attention runs on fewer tokens (lengths recorded by an attention override);
- the unpatched model is bit-identical after patched runs and keeps no ToMA state;
- under CFG a batch of two equals two single runs, and each sample of a batch gets its own
  destinations (per-sample plans);
- odd latent sizes run, merge, and stay bit-identical at ratio 0;
- scope keys_values keeps every query and pass-through key exact and merges only image keys.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from compat_support import patch, record_attention, run_records

from harness.metrics import relative_error as rel


def lengths_of(model: Any) -> tuple[Any, list[int]]:
    """A clone of `model` recording each attention call's key length."""
    return record_attention(model, lambda batch, q, k, mask: k)


def sample(tiny: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list, **kw: Any) -> torch.Tensor:
    kw.setdefault("steps", 2)
    return tiny.sample(model, latent, positive=pos, negative=neg, **kw)


SCOPES = ("block", "keys_values")
"""The scopes every family takes (nodes/settings.py SCOPES; "attention" is Flux's and the UNet's alone)."""


def check_ratio_zero(tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list,
                     scopes: tuple[str, ...] = SCOPES, **kw: Any) -> torch.Tensor:
    """Ratio 0 on every block equals the unpatched model bit for bit, in each of `scopes`; returns the
    unpatched output. kw: sampler arguments (cfg, steps)."""
    baseline = sample(tiny, model, latent, pos, neg, **kw)
    assert baseline.abs().sum() > 0
    for scope in scopes:
        assert torch.equal(sample(tiny, patch(toma, model, ratio=0.0, blocks="all", scope=scope), latent, pos, neg, **kw), baseline), scope
    return baseline


def merged_lengths(tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list, cfg: float = 2.0, **settings: Any) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    """(unpatched key lengths, merged key lengths, unpatched output, merged output) of 1-step runs
    at ratio 0.5, tile 4, every block (unless `settings` says otherwise)."""
    settings = {"ratio": 0.5, "tile_size": 4, "blocks": "all"} | settings
    plain, plain_lengths = lengths_of(model)
    merged, lengths = lengths_of(patch(toma, model, **settings))
    base = sample(tiny, plain, latent, pos, neg, steps=1, cfg=cfg)
    out = sample(tiny, merged, latent, pos, neg, steps=1, cfg=cfg)
    assert torch.isfinite(out).all()
    return plain_lengths, lengths, base, out


def check_clone_untouched(tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list) -> None:
    """Patched runs (two sizes) leave the unpatched model bit-identical and free of ToMA state."""
    baseline = sample(tiny, model, latent, pos, neg, seed=5)
    patched = patch(toma, model)
    sample(tiny, patched, latent, pos, neg, seed=5)
    odd = (*latent[:-2], latent[-2] + 2, latent[-1] + 6)
    sample(tiny, patched, odd, pos, neg, seed=5)
    assert torch.equal(sample(tiny, model, latent, pos, neg, seed=5), baseline)
    options = model.model_options.get("transformer_options", {})
    assert toma.settings.TOMA_KEY not in options
    assert not options.get("patches_replace", {}).get("dit")
    assert not model.object_patches


def check_per_sample(tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list, monkeypatch: Any,
                     builder: tuple[Any, str] | None = None) -> None:
    """A batch of two noises equals two single runs (1 step, judged against ToMA's own effect), and
    each sample of the CFG batch gets its own destinations. builder: (module, name) of the plan
    builder the family calls (default: runtime.make_plan)."""
    import comfy.sample

    gen = torch.Generator().manual_seed(0)
    noise = torch.randn((2, *latent[1:]), generator=gen)
    patched = patch(toma, model)

    def run(m: Any, n: torch.Tensor) -> torch.Tensor:
        empty = torch.zeros_like(n)
        return comfy.sample.sample(m, n, 1, 2.0, "euler", "simple", pos, neg, empty, seed=0, disable_pbar=True)

    module, name = builder or (toma.runtime, "make_plan")
    plans: list[Any] = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: plans.append(original(*a, **k)) or plans[-1])
    batch = run(patched, noise)
    monkeypatch.setattr(module, name, original)
    singles = torch.cat([run(patched, noise[i:i + 1]) for i in range(2)])
    effect = rel(batch, run(model, noise))
    assert effect > 1e-3
    assert rel(batch, singles) < 1e-3 * effect
    assert plans and all(p.dst_index.shape[0] == 4 for p in plans)  # 2 noises x (cond, uncond) in one call
    assert all(not torch.equal(p.dst_index[0], p.dst_index[1]) for p in plans)  # noise 0 vs noise 1


def check_odd_size(tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list, full_length: int) -> None:
    """An odd latent merges (every attention shorter than `full_length`) and is exact at ratio 0."""
    merged, lengths = lengths_of(patch(toma, model, tile_size=4, blocks="all"))
    out = sample(tiny, merged, latent, pos, neg)
    baseline = sample(tiny, model, latent, pos, neg)
    assert out.shape == baseline.shape and torch.isfinite(out).all()
    assert lengths and max(lengths) < full_length
    assert torch.equal(sample(tiny, patch(toma, model, ratio=0.0), latent, pos, neg), baseline)


def summary(caplog: Any) -> Any:
    """The record (nodes/run/report.py RunRecord) of the last run's ToMA summary line."""
    records = run_records(caplog)
    assert records
    return records[-1]


def attention_inputs(tiny: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list, **kw: Any) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v) of every attention call of a 1-step, cfg-1 run, tokens on axis 1 as (B, L, ...)
    whatever layout the model hands its attention (skip_reshape: (B, H, L, d))."""
    calls: list[tuple[torch.Tensor, ...]] = []

    def override(func, q, k, v, heads, *args, **kwargs):
        tensors = (q, k, v)
        if kwargs.get("skip_reshape"):
            tensors = tuple(t.transpose(1, 2) for t in tensors)
        calls.append(tuple(t.detach().clone() for t in tensors))
        return func(q, k, v, heads, *args, **kwargs)

    override.hands_on = True  # ComfyUI's own function runs: the kernel ToMA reads (nodes/machinery/kernel_choice.py)
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    kw = {"steps": 1, "cfg": 1.0} | kw
    sample(tiny, clone, latent, pos, neg, **kw)
    return calls


def check_passthrough_rows(
    tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list,
    kept: Any, merged_tokens: int, **settings: Any,
) -> None:
    """Which rows merged: at the first attention whose sequence ToMA shortened, every token that
    must pass through (text, padding, reference, register tokens) reaches the attention exactly as
    unpatched (q, k and v after the model's projections, norms and rope: its rope row and
    modulation are its own), and the rows ToMA removed number N - D.

    kept(plain_length, merged_length) -> [(start in the unpatched sequence, start in the merged
    one, count), ...]: the pass-through spans. merged_tokens: N - D, the rows merging removes. A
    merge of the wrong tokens (text instead of image) changes a pass-through row; a merge of none
    finds no shortened attention. settings: ToMA settings (default ratio 0.5, tile 4, every block).
    """
    settings = {"ratio": 0.5, "tile_size": 4, "blocks": "all"} | settings
    plain = attention_inputs(tiny, model, latent, pos, neg)
    merged = attention_inputs(tiny, patch(toma, model, **settings), latent, pos, neg)
    assert len(plain) == len(merged)
    first = next((i for i, (p, m) in enumerate(zip(plain, merged)) if p[1].shape[1] != m[1].shape[1]), None)
    assert first is not None, "no attention ran on merged tokens"
    p_len, m_len = plain[first][1].shape[1], merged[first][1].shape[1]
    assert p_len - m_len == merged_tokens
    spans = kept(p_len, m_len)
    assert spans and all(count > 0 for _, _, count in spans)
    for p_t, m_t in zip(plain[first], merged[first]):
        for p_start, m_start, count in spans:
            torch.testing.assert_close(m_t[:, m_start:m_start + count], p_t[:, p_start:p_start + count], rtol=1e-5, atol=1e-6)


def heads_first_inputs(tiny: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
    """(q, k, v) of every attention call of a 1-step, cfg-1 run as (B, L, H, e), whatever layout the
    model hands its attention ((B, L, H e) split by the call's `heads`; SD3's values come as (B, L, H, e)),
    and the run's output."""
    calls: list[tuple[torch.Tensor, ...]] = []

    def override(func, q, k, v, heads, *args, **kwargs):
        tensors = (q, k, v)
        if kwargs.get("skip_reshape"):
            tensors = tuple(t.transpose(1, 2) for t in tensors)
        else:
            tensors = tuple(t if t.ndim == 4 else t.unflatten(-1, (heads, -1)) for t in tensors)
        calls.append(tuple(t.detach().clone() for t in tensors))
        return func(q, k, v, heads, *args, **kwargs)

    override.hands_on = True  # ComfyUI's own function runs: the kernel ToMA reads (nodes/machinery/kernel_choice.py)
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    return calls, sample(tiny, clone, latent, pos, neg, steps=1, cfg=1.0)


def outside(spans: list[tuple[int, int]], length: int) -> list[int]:
    """The rows of [0, length) in none of the (start, count) spans."""
    inside = {row for start, count in spans for row in range(start, start + count)}
    return [row for row in range(length) if row not in inside]


def check_keys_values_rows(
    tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], pos: list, neg: list,
    kept: Any, merged_tokens: int, **settings: Any,
) -> None:
    """Scope keys_values, which rows merged: at the first merged attention (the first selected block's
    self-attention, whose inputs equal the unpatched run's) every query reaches the kernel as
    unpatched (beside the constant mass channel, toma_core/keys_values.py), the pass-through key
    and value rows of `kept` (see check_passthrough_rows) exactly (keys scaled by sqrt(e'/e)), with mass
    0, and N - D = `merged_tokens` image keys fewer, each with a log-mass >= 0 that weighs it as the
    tokens it stands for: every other row is an image row, and sum_d m_d M k_d = sum_i k_i over them
    (each token's assignment weights sum to 1 over its destinations, toma_core/plan.py), for keys and
    values. The block's later attention calls (cross-attention) keep their keys; the run's output is
    finite and changed."""
    settings = {"ratio": 0.5, "tile_size": 4, "blocks": "all", "scope": "keys_values"} | settings
    plain, base = heads_first_inputs(tiny, model, latent, pos, neg)
    merged, out = heads_first_inputs(tiny, patch(toma, model, **settings), latent, pos, neg)
    assert torch.isfinite(out).all() and rel(out, base) > 1e-4
    assert len(plain) == len(merged)
    first = next((i for i, (p, m) in enumerate(zip(plain, merged)) if p[1].shape[1] != m[1].shape[1]), None)
    assert first is not None, "no attention ran on merged keys"
    (q_p, k_p, v_p), (q_m, k_m, v_m) = plain[first], merged[first]
    e, e_pad = q_p.shape[-1], q_m.shape[-1]
    assert q_m.shape[:-1] == q_p.shape[:-1]
    assert k_p.shape[1] - k_m.shape[1] == merged_tokens
    scale = (e_pad / e) ** 0.5 if e_pad > e else 1.0
    torch.testing.assert_close(q_m[..., :e], q_p, rtol=1e-5, atol=1e-5)
    spans = kept(k_p.shape[1], k_m.shape[1])
    for p_t, m_t, t_scale in ((k_p, k_m, scale), (v_p, v_m, 1.0)):
        for p_start, m_start, count in spans:
            torch.testing.assert_close(m_t[:, m_start:m_start + count, :, :e] / t_scale, p_t[:, p_start:p_start + count], rtol=1e-5, atol=1e-6)
    assert e_pad > e, "no log-mass channel"
    assert torch.equal(q_m[..., e], torch.ones_like(q_m[..., e]))
    mass = k_m[..., e]
    assert (mass > -1e-4).all()
    for _, m_start, count in spans:
        assert torch.equal(mass[:, m_start:m_start + count], torch.zeros_like(mass[:, m_start:m_start + count]))
    assert mass.max() > 0
    image_p = outside([(start, count) for start, _, count in spans], k_p.shape[1])
    image_m = outside([(start, count) for _, start, count in spans], k_m.shape[1])
    assert len(image_p) - len(image_m) == merged_tokens
    weight = (mass[:, image_m] / e_pad ** 0.5).exp()[..., None]
    for p_t, m_t, t_scale in ((k_p, k_m, scale), (v_p, v_m, 1.0)):
        torch.testing.assert_close((weight * m_t[:, image_m, :, :e] / t_scale).sum(1), p_t[:, image_p].sum(1), rtol=1e-4, atol=1e-4)
    later = [(p, m) for p, m in zip(plain[first + 1:], merged[first + 1:]) if p[0].shape[1] != p[1].shape[1]]
    assert all(p[1].shape == m[1].shape for p, m in later)


def require(model: Any, name: str) -> Any:
    """`model`, or skip naming the `comfy.supported_models` class this ComfyUI lacks (one newer than 0.3.64)."""
    if model is None:
        pytest.skip(f"this ComfyUI has no comfy.supported_models.{name} (it came after ComfyUI 0.3.64)")
    return model
