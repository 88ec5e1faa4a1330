"""ToMA on Wan 2.1 / 2.2 video models in real ComfyUI: tiny random-weight Wan models of
ComfyUI's own classes (tiny_wan.py), sampled through `comfy.sample.sample` on the CPU.

Token counts are measured: an `optimized_attention_override` records every attention call
(self-attention: query and key over the image tokens; cross-attention: keys over the text). Plans
are read from inside the block (an object patch on a block's forward finds the call's context),
so frame-segment rules are checked on the plans the run really used.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import compat_support  # noqa: E402
from compat_support import RUNTIME_LOGGER  # noqa: E402

from harness.metrics import relative_error as rel  # noqa: E402

LATENT = (1, 16, 5, 12, 16)
"""(B, C, F, H, W): a 5 x 6 x 8 token grid (240 tokens per call and sample)."""


@pytest.fixture(scope="module")
def wan(comfy: Any) -> Any:
    from harness import tiny_wan

    return tiny_wan


@pytest.fixture(scope="module")
def t2v(wan: Any) -> Any:
    return wan.build_wan("t2v")


def patch(toma: Any, model: Any, **kwargs: Any) -> Any:
    """ToMA at ratio 0.5 from the first step, every block unless `blocks` says otherwise."""
    kwargs.setdefault("blocks", "all")
    return compat_support.patch(toma, model, kwargs.pop("ratio", 0.5), **kwargs)


def latent_of(wan: Any, model: Any, shape: tuple[int, ...] = LATENT) -> tuple[int, ...]:
    return (shape[0], wan.latent_channels(model), *shape[2:])


def run(wan: Any, tiny: Any, model: Any, shape: tuple[int, ...] = LATENT, steps: int = 2, seed: int = 0, **kwargs: Any) -> torch.Tensor:
    """Sample `model` (cfg 2: cond and uncond batched) with fixed conditioning."""
    latent = latent_of(wan, model, shape)
    kwargs.setdefault("positive", wan.conditioning(model, 1, latent))
    kwargs.setdefault("negative", wan.conditioning(model, 2, latent))
    return tiny.sample(model, latent, seed=seed, steps=steps, **kwargs)


def self_attention_lengths(calls: list, text_len: int) -> list[int]:
    """Query lengths of the self-attention calls (keys as long as queries, not the text)."""
    return [q for _, q, k in calls if q == k and k != text_len]


def kept_tokens(toma: Any, frames: int, height: int, width: int, ratio: float = 0.5, tile: int = 4) -> int:
    """D of a video whose frame 0 (spatial tiles) and frames 1.. (tiles of the settings' default
    tile_frames) are separate segments."""
    grid = toma.core.TileGrid
    first = grid(height, width, tile, ratio).num_kept
    if frames == 1:
        return first
    tile_frames = toma.settings.ToMASettings().tile_frames
    return first + grid(height, width, tile, ratio, frames=frames - 1, tile_frames=tile_frames).num_kept


def record_plans(model: Any, block: int = 0) -> tuple[Any, list]:
    """A clone whose block `block` appends (plan, x, e, freqs) of every merged run to the list."""
    import comfy.ldm.wan.model

    found: list = []
    settings_key = "comfyui_toma_call"
    clone = model.clone()
    module = clone.get_model_object(f"diffusion_model.blocks.{block}")

    def forward(x, e, freqs, context, context_img_len=257, transformer_options={}):
        ctx = transformer_options.get(settings_key)
        if ctx is not None and ctx.plans:
            found.append((next(iter(ctx.plans.values())), x, e, freqs))
        return comfy.ldm.wan.model.WanAttentionBlock.forward(module, x, e, freqs, context, context_img_len, transformer_options)

    clone.add_object_patch(f"diffusion_model.blocks.{block}.forward", forward)
    return clone, found


@pytest.mark.parametrize("kind", ["t2v", "i2v", "ti2v"])
def test_ratio_zero_is_bit_identical(wan: Any, tiny: Any, toma: Any, kind: str) -> None:
    model = wan.build_wan(kind)
    mask = {"noise_mask": wan.first_frame_mask(latent_of(wan, model))} if kind == "ti2v" else {}
    plain = run(wan, tiny, model, **mask)
    assert plain.abs().sum() > 0
    for scope in ("block", "keys_values"):
        assert torch.equal(run(wan, tiny, patch(toma, model, ratio=0.0, blocks="all", scope=scope), **mask), plain), scope


@pytest.mark.parametrize("kind", ["t2v", "i2v", "ti2v"])
def test_keys_values_merge_only_the_video_keys(wan: Any, tiny: Any, toma: Any, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """Scope keys_values, which rows merged: the first block's self-attention keeps its N queries and
    gets N - D video keys and values fewer (T2V, I2V, the 5B TI2V), the cross-attention to the text
    (and I2V's CLIP image tokens) keeps every key; the run line counts the 3 blocks merged."""
    import family_checks as fc

    model = wan.build_wan(kind)
    latent = latent_of(wan, model)
    pos, neg = wan.conditioning(model, 1, latent), wan.conditioning(model, 2, latent)
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        fc.check_keys_values_rows(tiny, toma, model, latent, pos, neg, lambda plain, merged: [], 240 - kept_tokens(toma, 5, 6, 8))
    record = compat_support.run_records(caplog)[-1]
    assert record.block_runs_merged == 3 and record.unmerged_blocks == record.unmerged_calls == {}, record


def test_self_attention_runs_on_merged_tokens_and_text_is_never_merged(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    plain, plain_calls = compat_support.record_attention(t2v)
    run(wan, tiny, plain)
    merged, calls = compat_support.record_attention(patch(toma, t2v, blocks="blocks:1-2"))
    out = run(wan, tiny, merged)
    n = 5 * 6 * 8
    d = kept_tokens(toma, 5, 6, 8)
    assert self_attention_lengths(plain_calls, wan.TEXT_LEN) == [n] * 3 * 2
    # per step: block 0 unmerged, blocks 1 and 2 on D tokens
    assert self_attention_lengths(calls, wan.TEXT_LEN) == [n, d, d] * 2
    assert d < n
    cross = [(q, k) for _, q, k in calls if k == wan.TEXT_LEN]
    assert cross == [(n, wan.TEXT_LEN), (d, wan.TEXT_LEN), (d, wan.TEXT_LEN)] * 2
    assert torch.isfinite(out).all() and rel(out, run(wan, tiny, t2v)) > 1e-3


def test_blocks_auto_all_and_list(wan: Any, toma: Any, t2v: Any) -> None:
    deep = wan.build_wan("t2v", num_layers=40)
    assert toma.patching.detect_family(deep).name == "wan"
    for spec, expected in (("auto", "blocks:5-39"), ("AUTO", "blocks:5-39"), ("all", "blocks:0-39"), ("blocks:5-9,20", "blocks:5-9,20")):
        patched = patch(toma, deep, blocks=spec)
        config = patched.model_options["transformer_options"]["comfyui_toma"].config
        assert config.adapter.blocks == expected
    dit = patch(toma, deep, blocks="blocks:3").model_options["transformer_options"]["patches_replace"]["dit"]
    assert list(dit) == [("double_block", 3)]
    with pytest.raises(ValueError, match="0-39"):
        patch(toma, deep, blocks="blocks:40")
    with pytest.raises(ValueError, match=r"item 'double:5' is not 'auto', 'all' or group\[:range\]; this model's only group is 'blocks' \(e\.g\. 'blocks:0-39'\)$"):
        patch(toma, deep, blocks="double:5")


@pytest.mark.parametrize("shape", [(1, 16, 1, 12, 16), (1, 16, 3, 7, 9), (1, 16, 4, 10, 6), (2, 16, 6, 5, 11)])
def test_odd_frame_counts_and_sizes(wan: Any, tiny: Any, toma: Any, t2v: Any, shape: tuple[int, ...]) -> None:
    merged, calls = compat_support.record_attention(patch(toma, t2v))
    out = run(wan, tiny, merged, shape=shape)
    frames, height, width = shape[2], -(-shape[3] // 2), -(-shape[4] // 2)
    d = kept_tokens(toma, frames, height, width)
    assert out.shape == latent_of(wan, t2v, shape) and torch.isfinite(out).all()
    assert set(self_attention_lengths(calls, wan.TEXT_LEN)) == {d}


def test_batch_and_cfg_get_per_sample_plans(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    """A batch of two equals two single runs after one step, judged against ToMA's own effect
    (a plan shared by the samples would be most of that effect)."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn((2, *LATENT[1:]), generator=gen)
    patched = patch(toma, t2v)
    cond = {"positive": wan.conditioning(t2v, 1), "negative": wan.conditioning(t2v, 2)}
    batch = compat_support.sample_with_noise(tiny, patched, noise, steps=1, **dict(cond))
    singles = torch.cat([compat_support.sample_with_noise(tiny, patched, noise[i:i + 1], steps=1, **dict(cond)) for i in range(2)])
    plain = compat_support.sample_with_noise(tiny, t2v, noise, steps=1, **dict(cond))
    effect = rel(batch, plain)
    assert effect > 1e-3
    assert rel(batch, singles) < 1e-4 * effect + 1e-6
    recorder, found = record_plans(patched)
    compat_support.sample_with_noise(tiny, recorder, noise, steps=1, **dict(cond))
    plan = found[0][0]
    assert plan.batch == 4  # two latents x (cond, uncond)
    # cond and uncond of one latent share block 0's input; the two latents differ
    assert not torch.equal(plan.dst_index[0], plan.dst_index[1])


def frame_zero_is_pure(plan: Any, frames: int, per_frame: int, first: int = 0) -> bool:
    """Merging an indicator of frame `first` gives 0 or 1 in every merged token: no merged token
    mixes that frame with another."""
    indicator = torch.zeros(plan.batch, frames * per_frame, 1)
    indicator[:, first * per_frame:(first + 1) * per_frame] = 1.0
    merged = plan.merge(indicator)
    return bool(((merged - merged.round()).abs() < 1e-5).all()) and bool((merged > 0.5).any())


@pytest.mark.parametrize("tile_frames", [1, 3])
def test_i2v_frame_zero_never_merges_with_noisy_frames(wan: Any, tiny: Any, toma: Any, tile_frames: int) -> None:
    model = wan.build_wan("i2v")
    recorder, found = record_plans(patch(toma, model, tile_frames=tile_frames))
    run(wan, tiny, recorder)
    assert found
    for plan, x, _, _ in found:
        assert x.shape[1] == plan.num_kept < plan.num_tokens
        assert frame_zero_is_pure(plan, 5, 48)
        assert (plan.frame_counts is None) == (tile_frames > 1)


def test_ti2v_per_frame_modulation_is_exact(wan: Any, tiny: Any, toma: Any) -> None:
    """Wan 2.2-5B under a first-frame noise mask: vec is per frame (B, F, 6, C); with spatial
    tiles the merged tokens are frame-major with equal counts, so the block's own per-frame
    expansion gives the same output as an explicit per-merged-token vec (B, D, 6, C), bit for bit."""
    import comfy.ldm.wan.model

    model = wan.build_wan("ti2v")
    latent = latent_of(wan, model)
    recorder, found = record_plans(patch(toma, model, tile_frames=1))
    run(wan, tiny, recorder, noise_mask=wan.first_frame_mask(latent))
    assert found
    for plan, x, e, freqs in found:
        assert e.ndim == 4 and e.shape[1] == 5 and frame_zero_is_pure(plan, 5, 48)
        frame = plan.frame_of_kept(48)
        per_token = e.gather(1, frame.view(*frame.shape, 1, 1).expand(-1, -1, *e.shape[2:]))
        block = recorder.get_model_object("diffusion_model.blocks.0")
        context = torch.randn(x.shape[0], wan.TEXT_LEN, 64, generator=torch.Generator().manual_seed(3))
        args = {"freqs": freqs, "context": context}
        cls = comfy.ldm.wan.model.WanAttentionBlock
        assert torch.equal(cls.forward(block, x, e, **args), cls.forward(block, x, per_token, **args))


@pytest.mark.parametrize("options", [{"budget": "adaptive"}, {"tile_frames": 2}])
def test_ti2v_unequal_frame_counts_get_a_per_token_vec(wan: Any, tiny: Any, toma: Any, options: dict) -> None:
    """Per-sample budgets or tiles across frames: each merged token gets its destination frame's
    modulation row, and frame 0 (timestep 0) still never merges with the noisy frames."""
    model = wan.build_wan("ti2v")
    recorder, found = record_plans(patch(toma, model, **({"tile_frames": 1} | options)))
    out = run(wan, tiny, recorder, noise_mask=wan.first_frame_mask(latent_of(wan, model)))
    assert found and torch.isfinite(out).all()
    for plan, x, e, _ in found:
        assert plan.frame_counts is None and frame_zero_is_pure(plan, 5, 48)
        assert e.shape[:2] == (x.shape[0], plan.num_kept)


def test_fun_reference_frame_passes_through(wan: Any, tiny: Any, toma: Any) -> None:
    model = wan.build_wan("fun_ref")
    ref = torch.randn((1, 16, 1, 12, 16), generator=torch.Generator().manual_seed(5))
    latent = latent_of(wan, model)
    cond = wan.conditioning(model, 1, latent, reference_latents=[ref])
    recorder, found = record_plans(patch(toma, model))
    out = run(wan, tiny, recorder, positive=cond, negative=wan.conditioning(model, 2, latent, reference_latents=[ref]))
    assert found and torch.isfinite(out).all()
    plan, x, _, _ = found[0]
    assert plan.num_tokens == 6 * 48
    assert torch.equal(plan.dst_index[:, :48], torch.arange(48).expand(plan.batch, -1))
    assert x.shape[1] == 48 + kept_tokens(toma, 5, 6, 8)


def test_phantom_frames_pass_through(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    extra = torch.randn((1, 16, 2, 12, 16), generator=torch.Generator().manual_seed(6))
    cond = wan.conditioning(t2v, 1, time_dim_concat=extra)
    recorder, found = record_plans(patch(toma, t2v))
    out = run(wan, tiny, recorder, positive=cond, negative=wan.conditioning(t2v, 2, time_dim_concat=extra))
    assert found and out.shape == latent_of(wan, t2v) and torch.isfinite(out).all()
    plan = found[0][0]
    assert plan.num_tokens == 7 * 48
    assert torch.equal(plan.dst_index[:, -96:], torch.arange(5 * 48, 7 * 48).expand(plan.batch, -1))


def test_vace_blocks_stay_unmerged(wan: Any, tiny: Any, toma: Any) -> None:
    model = wan.build_wan("vace")
    merged, calls = compat_support.record_attention(patch(toma, model))
    out = run(wan, tiny, merged, steps=1)
    lengths = self_attention_lengths(calls, wan.TEXT_LEN)
    d = kept_tokens(toma, 5, 6, 8)
    # 3 main blocks merged, a vace block after each at full N
    assert sorted(lengths) == [d, d, d, 240, 240, 240] and torch.isfinite(out).all()
    assert "VACE" in merged.model_options["transformer_options"]["comfyui_toma"].config.adapter.blocks


def test_s2v_runs_unmerged_and_says_so(wan: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    model = wan.build_wan("s2v")
    plain = run(wan, tiny, model, steps=1)
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        out = run(wan, tiny, patch(toma, model), steps=1)
    assert torch.equal(out, plain)
    assert any("S2V" in r.getMessage() and "unmerged" in r.getMessage() for r in caplog.records)


def test_other_wan_variants_are_refused_with_their_class(wan: Any, toma: Any) -> None:
    with pytest.raises(ValueError, match="CameraWanModel"):
        patch(toma, wan.build_wan("camera"))


def test_unsupported_settings_are_refused(toma: Any, t2v: Any) -> None:
    with pytest.raises(ValueError, match="scope"):
        patch(toma, t2v, scope="attention")
    with pytest.raises(ValueError, match="proportional_attention"):
        patch(toma, t2v, proportional_attention=True)


def test_unmerge_setting_reaches_the_wan_plan(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    recorder, found = record_plans(patch(toma, t2v, unmerge="output"))
    run(wan, tiny, recorder, steps=1)
    plan = found[0][0]
    x = torch.randn(plan.batch, plan.num_tokens, 4, generator=torch.Generator().manual_seed(7))
    merged = plan.merge(x)
    assert torch.allclose(plan.unmerge_residual(x, merged, merged), plan.unmerge(merged))


def test_compile_clean_under_torch_compile(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    """TorchCompileModel over the patched Wan (counting backend, tests/integration/test_compat_compile.py):
    with a sigma window, one graph for merged calls and one for unmerged calls, no graph break, and
    nothing recompiled in a second run (the frame segments are decided eagerly, per call)."""
    from test_compat_compile import compiled_runs, with_sdpa

    cond = {"positive": wan.conditioning(t2v, 1), "negative": wan.conditioning(t2v, 2)}
    _, plain_graphs, plain_breaks = compiled_runs(with_sdpa(t2v), tiny, latent=LATENT, **cond)
    assert plain_graphs == [1] and plain_breaks == 0
    patched = compat_support.patch(toma, with_sdpa(t2v), 0.5, 0.0, 0.5, blocks="all")
    outputs, graphs, breaks = compiled_runs(patched, tiny, runs=2, latent=LATENT, steps=4, **cond)
    assert graphs == [2, 0] and breaks == 0
    assert rel(outputs[0], tiny.sample(patched, LATENT, steps=4, **cond)) < 1e-5


def test_advanced_node_tile_frames_reaches_the_wan_plan(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    """tile_frames follows unmerge on the Advanced node (the destination inputs come after it); the
    basic node keeps the settings' default."""
    nodes = toma.nodes
    assert [i.id for i in nodes.ToMAPatchAdvanced.define_schema().inputs][-4:-2] == ["unmerge", "tile_frames"]
    assert "tile_frames" not in [i.id for i in nodes.ToMAPatch.define_schema().inputs]
    out = nodes.ToMAPatchAdvanced.execute(
        t2v, 0.5, 4, 0.0, 1.0, 1, blocks="all", min_tokens=0, similarity="cosine", temperature=0.001, budget="tile",
        proportional_attention=False, scope="block", verbose=False, merge_every=1, unmerge="delta", tile_frames=4,
    )
    recorder, found = record_plans(out.result[0])
    run(wan, tiny, recorder, steps=1)
    segments = [part.grid.tt for part in found[0][0].parts if hasattr(part, "grid")]
    assert segments == [1, 4]  # frame 0 alone, frames 1-4 in one tile depth


def test_ratio_zero_is_reported_as_such_not_as_a_bypass(wan: Any, tiny: Any, toma: Any, t2v: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A plain Wan at ratio 0 used to log "ToMA was bypassed" and warn that another node replaced the
    forward loop, with no other node in the graph."""
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        run(wan, tiny, patch(toma, t2v, ratio=0.0))
    record = compat_support.run_records(caplog)[-1]
    warnings = [r.getMessage() for r in caplog.records if r.name == RUNTIME_LOGGER and r.levelno >= logging.WARNING]
    assert record.family == "wan" and record.unmerged_calls.get("ratio 0 (nothing to merge)") == 2, record
    assert record.status != "bypassed", record
    assert warnings == []


def wan_attention(wan: Any, tiny: Any, model: Any, merged: Any, **extras: Any) -> tuple[list, list]:
    """(q, k, v) of every attention call of a 1-step cfg-1 run of `model` and of `merged` (tokens on
    axis 1); extras go into both conditionings (reference_latents, time_dim_concat)."""
    import family_checks as fc

    latent = latent_of(wan, model)
    pos, neg = wan.conditioning(model, 1, latent, **extras), wan.conditioning(model, 2, latent, **extras)
    return fc.attention_inputs(tiny, model, latent, pos, neg), fc.attention_inputs(tiny, merged, latent, pos, neg)


@pytest.mark.parametrize("kind", ["t2v", "i2v"])
def test_cross_attention_keys_and_values_pass_through_exactly(wan: Any, tiny: Any, toma: Any, kind: str) -> None:
    """Wan's self-attention (WanSelfAttention) holds only the video tokens and is shortened by
    N - D; the text (WanT2VCrossAttention) and the CLIP image tokens of I2V
    (WanI2VCrossAttention's k_img, v_img) are cross-attention keys and values that reach every
    merged block's attention exactly as unpatched, queried by the D merged tokens."""
    model = wan.build_wan(kind)
    plain, merged = wan_attention(wan, tiny, model, patch(toma, model))
    n, d = 5 * 6 * 8, kept_tokens(toma, 5, 6, 8)
    assert len(plain) == len(merged)
    cross_lengths = set()
    for (p_q, p_k, p_v), (m_q, m_k, m_v) in zip(plain, merged):
        assert p_q.shape[1] == n and m_q.shape[1] == d
        if p_k.shape[1] == n:
            assert m_k.shape[1] == d
            continue
        cross_lengths.add(p_k.shape[1])
        assert torch.equal(m_k, p_k) and torch.equal(m_v, p_v)
    assert cross_lengths == ({wan.TEXT_LEN, 257} if kind == "i2v" else {wan.TEXT_LEN})


@pytest.mark.parametrize("kind", ["fun_ref", "phantom"])
def test_pass_through_frame_rows_reach_attention_exactly(wan: Any, tiny: Any, toma: Any, kind: str) -> None:
    """Which rows merged: a Fun reference frame (reference_latent through ref_conv, prepended) and
    Phantom frames (time_dim_concat, appended) reach the first merged block's self-attention exactly
    as unpatched (their rope rows their own); the video rows lose N - D."""
    import family_checks as fc

    frames = 1 if kind == "fun_ref" else 2
    extra = torch.randn((1, 16, frames, 12, 16), generator=torch.Generator().manual_seed(5))
    model = wan.build_wan("fun_ref" if kind == "fun_ref" else "t2v")
    latent = latent_of(wan, model)
    extras = {"reference_latents": [extra]} if kind == "fun_ref" else {"time_dim_concat": extra}
    pos, neg = wan.conditioning(model, 1, latent, **extras), wan.conditioning(model, 2, latent, **extras)
    rows = frames * 48

    def kept(plain: int, merged: int) -> list[tuple[int, int, int]]:
        return [(0, 0, rows)] if kind == "fun_ref" else [(plain - rows, merged - rows, rows)]

    fc.check_passthrough_rows(tiny, toma, model, latent, pos, neg, kept, 240 - kept_tokens(toma, 5, 6, 8), blocks="all")
    fc.check_keys_values_rows(tiny, toma, model, latent, pos, neg, kept, 240 - kept_tokens(toma, 5, 6, 8), blocks="all")


BERNINI = ((5, 12, 16), (1, 9, 7))
"""(F', H', W') of Bernini's context_latents (BerniniConditioning): a source video of the latent's
size (v2v, 240 tokens) and a reference image at its own aspect, padded to the patch (ceil(9/2) x
ceil(7/2) = 20)."""

BERNINI_TOKENS = 5 * 6 * 8 + 5 * 4


def bernini_conds(wan: Any, model: Any, latent: tuple[int, ...]) -> tuple[list, list]:
    """Positive and negative conditioning with the same context_latents, or skip on a ComfyUI
    whose WanModel has no Bernini in-context tokens (0.3.64)."""
    import inspect

    import comfy.ldm.wan.model

    if "context_latents" not in inspect.getsource(comfy.ldm.wan.model.WanModel.forward_orig):
        pytest.skip("this ComfyUI's WanModel has no Bernini context_latents (they came after ComfyUI 0.3.64)")
    gen = torch.Generator().manual_seed(8)
    lats = [torch.randn((1, latent[1], *shape), generator=gen) for shape in BERNINI]
    return wan.conditioning(model, 1, latent, context_latents=lats), wan.conditioning(model, 2, latent, context_latents=lats)


def test_bernini_ratio_zero_is_bit_identical(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    import family_checks as fc

    latent = latent_of(wan, t2v)
    pos, neg = bernini_conds(wan, t2v, latent)
    baseline = fc.check_ratio_zero(tiny, toma, t2v, latent, pos, neg)
    assert not torch.equal(baseline, run(wan, tiny, t2v))  # the in-context tokens reach the model


def test_bernini_blocks_merge_the_video_and_keep_the_in_context_tokens(wan: Any, tiny: Any, toma: Any, t2v: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Every block merges the video's frames (the plan covers the 240 video tokens, not the 260
    in-context tokens after them) with no layout reason; the output has the video's shape and differs
    from unpatched."""
    latent = latent_of(wan, t2v)
    pos, neg = bernini_conds(wan, t2v, latent)
    recorder, found = record_plans(patch(toma, t2v))
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        out = run(wan, tiny, recorder, positive=pos, negative=neg)
    record = compat_support.run_records(caplog)[-1]
    d = kept_tokens(toma, 5, 6, 8)
    assert record.family == "wan" and record.unmerged_blocks == {} and record.unmerged_calls == {}, record
    assert record.block_runs_merged == 3 * 2 and record.tokens == {(6, 8): (240, d)}, record
    assert found and all(plan.num_tokens == 240 and x.shape[1] == d + BERNINI_TOKENS for plan, x, _, _ in found)
    assert out.shape == latent and torch.isfinite(out).all()
    assert rel(out, run(wan, tiny, t2v, positive=pos, negative=neg)) > 1e-3


def test_bernini_tokens_reach_attention_exactly(wan: Any, tiny: Any, toma: Any, t2v: Any) -> None:
    """The in-context tokens (after the video, with their own source-id rope rows) reach the first
    merged block's self-attention exactly as unpatched; the video rows lose N - D."""
    import family_checks as fc

    latent = latent_of(wan, t2v)
    pos, neg = bernini_conds(wan, t2v, latent)

    def kept(plain: int, merged: int) -> list[tuple[int, int, int]]:
        return [(plain - BERNINI_TOKENS, merged - BERNINI_TOKENS, BERNINI_TOKENS)]

    fc.check_passthrough_rows(tiny, toma, t2v, latent, pos, neg, kept, 240 - kept_tokens(toma, 5, 6, 8), blocks="all")
    fc.check_keys_values_rows(tiny, toma, t2v, latent, pos, neg, kept, 240 - kept_tokens(toma, 5, 6, 8), blocks="all")


def test_bernini_beside_a_per_frame_vec_runs_unmerged(wan: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Wan 2.2-5B under a noise mask (vec (B, F, 6, C)) with in-context tokens: the block's repeat_e
    spreads the F rows over the video and the tail together, which no merged layout reproduces, so
    its blocks run unmerged with that reason (not a layout one) and the output is unpatched's."""
    model = wan.build_wan("ti2v")
    latent = latent_of(wan, model)
    pos, neg = bernini_conds(wan, model, latent)
    mask = wan.first_frame_mask(latent)
    plain = run(wan, tiny, model, positive=pos, negative=neg, noise_mask=mask)
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        out = run(wan, tiny, patch(toma, model), positive=pos, negative=neg, noise_mask=mask)
    record = compat_support.run_records(caplog)[-1]
    assert torch.equal(out, plain)
    assert record.block_runs_merged == 0 and compat_support.runs_for(record.unmerged_blocks, "in-context tokens") == 3 * 2, record
    assert compat_support.warnings_of(caplog) == []


def test_vace_blocks_see_every_token_exactly_as_unpatched(wan: Any, tiny: Any, toma: Any) -> None:
    """VaceWanModel's vace blocks run beside the merged main blocks on the full N tokens of their
    own stream (fed from the model's input x, not from the main blocks): every attention of theirs
    gets its q, k, v exactly as unpatched, while the main blocks' self-attention holds D tokens."""
    model = wan.build_wan("vace")
    plain, merged = wan_attention(wan, tiny, model, patch(toma, model))
    n, d = 5 * 6 * 8, kept_tokens(toma, 5, 6, 8)
    full = [(p, m) for p, m in zip(plain, merged) if m[0].shape[1] == n]
    assert len(plain) == len(merged) and len(full) == len(plain) // 2 == 6  # 3 vace blocks x (self, cross)
    assert sum(m[1].shape[1] == d for m in merged) == 3
    for p_call, m_call in full:
        for p_t, m_t in zip(p_call, m_call):
            assert torch.equal(m_t, p_t)


def test_vace_blocks_keep_every_key_under_keys_values(wan: Any, tiny: Any, toma: Any) -> None:
    """Scope keys_values on VaceWanModel: the 3 main blocks' self-attention loses N - D keys and
    keeps its N queries; the vace blocks' attention (self and cross) is exactly as unpatched."""
    model = wan.build_wan("vace")
    plain, merged = wan_attention(wan, tiny, model, patch(toma, model, scope="keys_values"))
    n, d = 5 * 6 * 8, kept_tokens(toma, 5, 6, 8)
    assert len(plain) == len(merged)
    assert all(m[0].shape[1] == n for m in merged)
    shortened = [m for m in merged if m[1].shape[1] == d]
    exact = [p for p, m in zip(plain, merged) if all(p_t.shape == m_t.shape and torch.equal(p_t, m_t) for p_t, m_t in zip(p, m))]
    assert len(shortened) == 3 and len(exact) >= 6  # 3 vace blocks x (self, cross)
