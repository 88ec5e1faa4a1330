"""ToMA on UNet models in real ComfyUI: tiny random-weight SDXL and SD1.5 topologies sampled through
`comfy.sample.sample`. Skipped with a reason when ComfyUI is not importable.

Tiny SDXL at a 16x16 latent: no transformers at full resolution, depth 1 at 8x8 (input 4, 5,
output 3-5), depth 2 at 4x4 (input 7, 8, middle, output 0-2): 17 BasicTransformerBlocks. Tiny
SD1.5: depth 1 at 16x16, 8x8, 4x4 and in the 2x2 middle block. Token counts are measured, not
assumed: an `optimized_attention_override` records (query length, key length) of every
attention call.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import compat_support  # noqa: E402
from compat_support import CLIP_TEXT as TEXT  # noqa: E402
from compat_support import RUNTIME_LOGGER, patch, run_records, sample_with_noise  # noqa: E402

from harness.metrics import relative_error as rel  # noqa: E402
from harness.pack import pack_module  # noqa: E402

LATENT = (1, 4, 16, 16)

# Merged lengths at ratio 0.5, tile 4: a 16-token tile keeps 8.
SDXL_PLAIN = [64] * 2 + [16] * 4 + [16] * 2 + [16] * 6 + [64] * 3
"""Query length of attn1 per transformer block, in execution order (input 4,5; 7,8 x2; middle x2; output 0-2 x2; 3-5)."""


def record_attention(model: Any) -> tuple[Any, list[tuple[int, int]]]:
    """A clone whose attention calls append (query length, key length) to the returned list."""
    return compat_support.record_attention(model, lambda batch, q, k, mask: (q, k))


def self_attention(calls: list[tuple[int, int]]) -> list[int]:
    """Query lengths of the attn1 calls (attn2 has TEXT keys)."""
    return [q for q, k in calls if k != TEXT]


def tome(model: Any, ratio: float) -> Any:
    from comfy_extras.nodes_tomesd import TomePatchModel

    return TomePatchModel.execute(model, ratio).result[0]


# --- the test model itself is meaningful -------------------------------------------------


def test_tiny_sdxl_output_depends_on_transformers(tiny_sdxl: Any, tiny: Any) -> None:
    """Guard against vacuous comparisons: non-zero output that changes when a
    transformer block is disabled."""
    baseline = tiny.sample(tiny_sdxl, LATENT, steps=2)
    assert baseline.abs().max() > 0
    other = tiny_sdxl.clone()
    other.add_object_patch("diffusion_model.input_blocks.7.1.transformer_blocks.0.forward", lambda x, context=None, transformer_options={}: x)
    assert rel(tiny.sample(other, LATENT, steps=2), baseline) > 1e-3


# --- merging really happens, where selected ----------------------------------------------


@pytest.mark.parametrize("scope", ["block", "attention", "keys_values"])
def test_ratio_zero_is_bit_identical(tiny_sdxl: Any, tiny_sd15: Any, tiny: Any, toma: Any, scope: str) -> None:
    for model in (tiny_sdxl, tiny_sd15):
        baseline = tiny.sample(model, LATENT, seed=3)
        assert torch.equal(tiny.sample(patch(toma, model, ratio=0.0, blocks="all", scope=scope), LATENT, seed=3), baseline)


def test_sdxl_attention_runs_on_fewer_tokens_at_every_level(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    plain, plain_calls = record_attention(tiny_sdxl)
    merged, merged_calls = record_attention(patch(toma, tiny_sdxl))
    baseline = tiny.sample(plain, LATENT, steps=1)
    out = tiny.sample(merged, LATENT, steps=1)
    assert self_attention(plain_calls) == SDXL_PLAIN
    assert self_attention(merged_calls) == [n // 2 for n in SDXL_PLAIN]  # auto: 8x8 and 4x4 levels
    assert [(q, k) for q, k in merged_calls if k == TEXT] == [(n // 2, TEXT) for n in SDXL_PLAIN]  # attn2 on D queries
    assert all(k == q for q, k in merged_calls if k != TEXT)  # attn1 keys/values merged too
    assert rel(out, baseline) > 1e-3


def test_listed_blocks_merge_only_those(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    merged, calls = record_attention(patch(toma, tiny_sdxl, blocks="input:7-8,output:4"))
    tiny.sample(merged, LATENT, steps=1)
    expected = [64, 64] + [8] * 4 + [16] * 2 + [16] * 6 + [64, 32, 64]
    assert self_attention(calls) == expected


def test_builtin_tome_is_a_no_op_on_sdxl_but_toma_is_not(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    baseline = tiny.sample(tiny_sdxl, LATENT, seed=4)
    for ratio in (0.25, 0.5, 0.75):
        assert torch.equal(tiny.sample(tome(tiny_sdxl, ratio), LATENT, seed=4), baseline)
        assert rel(tiny.sample(patch(toma, tiny_sdxl, ratio=ratio), LATENT, seed=4), baseline) > 1e-3


def test_sd15_levels_and_auto(tiny_sd15: Any, tiny: Any, toma: Any) -> None:
    """SD1.5: transformers at full latent resolution too; auto merges the output blocks (the later half)
    at every level, full resolution included, and no input or middle block."""
    plain, plain_calls = record_attention(tiny_sd15)
    merged, merged_calls = record_attention(patch(toma, tiny_sd15, blocks="auto"))
    baseline = tiny.sample(plain, LATENT, steps=1)
    out = tiny.sample(merged, LATENT, steps=1)
    plain_q = self_attention(plain_calls)
    assert plain_q == [256, 256, 64, 64, 16, 16, 4, 16, 16, 16, 64, 64, 64, 256, 256, 256]
    expected = plain_q[:7] + [n // 2 for n in plain_q[7:]]  # input 1-8 and the middle run as they are
    assert self_attention(merged_calls) == expected
    assert rel(out, baseline) > 1e-3
    # The built-in ToMe does act on SD1.5 (full-resolution transformers): our test can see it.
    assert rel(tiny.sample(tome(tiny_sd15, 0.5), LATENT, steps=1), baseline) > 1e-4


def test_attention_scope_merges_attention_only(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    merged, calls = record_attention(patch(toma, tiny_sdxl, scope="attention"))
    out = tiny.sample(merged, LATENT, steps=1)
    assert self_attention(calls) == [n // 2 for n in SDXL_PLAIN]
    assert [q for q, k in calls if k == TEXT] == [n // 2 for n in SDXL_PLAIN]
    block = tiny.sample(patch(toma, tiny_sdxl), LATENT, steps=1)
    assert rel(out, block) > 1e-4  # not the same computation as whole-block merging
    assert torch.isfinite(out).all()


# --- isolation, schedule, per-sample ---------------------------------------------------------


def test_unpatched_model_unchanged_after_patched_runs(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    baseline = tiny.sample(tiny_sdxl, LATENT, seed=5)
    patched = patch(toma, tiny_sdxl)
    tiny.sample(patched, LATENT, seed=5)
    tiny.sample(patched, (1, 4, 12, 20), seed=5)
    tiny.sample(patch(toma, tiny_sdxl, scope="attention"), LATENT, seed=5)
    assert torch.equal(tiny.sample(tiny_sdxl, LATENT, seed=5), baseline)
    assert not tiny_sdxl.object_patches
    options = tiny_sdxl.model_options.get("transformer_options", {})
    assert toma.settings.TOMA_KEY not in options and not options.get("patches")
    module = tiny_sdxl.model.diffusion_model.input_blocks[4][1].transformer_blocks[0]
    assert getattr(module.__dict__.get("forward"), toma.unet.TOMA_MARK, None) is None


def test_bypass_equals_never_patched(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    """A fresh, never-patched clone after patched runs in the same process (node bypassed)."""
    patched = patch(toma, tiny_sdxl)
    first = tiny.sample(tiny_sdxl.clone(), LATENT, seed=6)
    tiny.sample(patched, LATENT, seed=6)
    assert torch.equal(tiny.sample(tiny_sdxl.clone(), LATENT, seed=6), first)


def test_deterministic(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    patched = patch(toma, tiny_sdxl)
    first = tiny.sample(patched, LATENT, seed=7)
    assert torch.equal(tiny.sample(patched, LATENT, seed=7), first)
    assert torch.equal(tiny.sample(patch(toma, tiny_sdxl), LATENT, seed=7), first)


@pytest.mark.parametrize("steps, bound", [(1, 1e-2), (2, 0.1)])
def test_batch_of_two_equals_two_single_runs(tiny_sdxl: Any, tiny: Any, toma: Any, steps: int, bound: float) -> None:
    """Per-sample plans, judged against ToMA's own effect (near-ties in the merge may flip)."""
    noise = torch.randn((2, *LATENT[1:]), generator=torch.Generator().manual_seed(0))
    patched = patch(toma, tiny_sdxl)
    batch = sample_with_noise(tiny, patched, noise, steps=steps)
    singles = torch.cat([sample_with_noise(tiny, patched, noise[i:i + 1], steps=steps) for i in range(2)])
    effect = rel(batch, sample_with_noise(tiny, tiny_sdxl, noise, steps=steps))
    assert effect > 1e-2
    assert rel(batch, singles) < bound * effect


def test_cond_and_uncond_get_their_own_destinations(tiny_sdxl: Any, tiny: Any, toma: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plans: list[Any] = []
    original = toma.runtime.make_plan

    def recording(*args: Any, **kwargs: Any) -> Any:
        plans.append(original(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(toma.runtime, "make_plan", recording)
    tiny.sample(patch(toma, tiny_sdxl), LATENT, steps=1, cfg=3.0)
    assert len(plans) == 2  # one per level (8x8, 4x4), cond and uncond in one batch of 2
    for plan in plans:
        assert plan.dst_index.shape[0] == 2
    assert any(not torch.equal(p.dst_index[0], p.dst_index[1]) for p in plans)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_cfg_one_and_above(tiny_sdxl: Any, tiny: Any, toma: Any, cfg: float) -> None:
    baseline = tiny.sample(tiny_sdxl, LATENT, cfg=cfg)
    assert torch.equal(tiny.sample(patch(toma, tiny_sdxl, ratio=0.0), LATENT, cfg=cfg), baseline)
    assert rel(tiny.sample(patch(toma, tiny_sdxl), LATENT, cfg=cfg), baseline) > 1e-3


@pytest.mark.parametrize("shape", [(1, 4, 18, 26), (1, 4, 17, 23), (1, 4, 8, 40), (1, 4, 10, 10)])
def test_any_resolution(tiny_sdxl: Any, tiny: Any, toma: Any, shape: tuple[int, ...]) -> None:
    merged, calls = record_attention(patch(toma, tiny_sdxl))
    plain, plain_calls = record_attention(tiny_sdxl)
    out = tiny.sample(merged, shape, steps=2)
    baseline = tiny.sample(plain, shape, steps=2)
    assert out.shape == baseline.shape and torch.isfinite(out).all()
    assert all(m < p for m, p in zip(self_attention(calls), self_attention(plain_calls)))
    assert torch.equal(tiny.sample(patch(toma, tiny_sdxl, ratio=0.0), shape, steps=2), baseline)


def test_heun_shares_one_plan_per_level_and_step(tiny_sdxl: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    out = tiny.sample(patch(toma, tiny_sdxl), LATENT, steps=3, sampler_name="heun")
    assert torch.isfinite(out).all()
    (run,) = run_records(caplog)
    assert (run.steps_merged, run.total_steps, run.calls_merged, run.total_calls) == (3, 3, 5, 5)
    assert run.plans_built == 6  # 2 levels x 3 steps


def test_denoise_and_split_sampling(tiny_sdxl: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    start = torch.randn(LATENT, generator=torch.Generator().manual_seed(4))
    baseline = tiny.sample(tiny_sdxl, None, latent_image=start, denoise=0.5)
    assert torch.equal(tiny.sample(patch(toma, tiny_sdxl, ratio=0.0), None, latent_image=start, denoise=0.5), baseline)
    patched = patch(toma, tiny_sdxl, end=0.5)
    kwargs = dict(seed=1, steps=6)
    tiny.sample(patched, LATENT, **kwargs)
    first = tiny.sample(patched, LATENT, start_step=0, last_step=3, force_full_denoise=False, **kwargs)
    tiny.sample(patched, None, latent_image=first, start_step=3, last_step=6, disable_noise=True, **kwargs)
    merged = [run.steps_merged for run in run_records(caplog)[-3:]]
    assert 0 < merged[0] < 6 and merged[1] + merged[2] == merged[0]


def test_two_samplers_and_resolution_change_do_not_leak(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    patched = patch(toma, tiny_sdxl)
    tiny.sample(patched, LATENT, seed=2)
    second = tiny.sample(patched, (1, 4, 12, 20), seed=2)
    assert torch.equal(second, tiny.sample(patch(toma, tiny_sdxl), (1, 4, 12, 20), seed=2))
    assert torch.equal(tiny.sample(patched, LATENT, seed=2), tiny.sample(patch(toma, tiny_sdxl), LATENT, seed=2))


def test_recompute_every_and_log_line(tiny_sdxl: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    tiny.sample(patch(toma, tiny_sdxl, every=2), LATENT, steps=4)
    tiny.sample(patch(toma, tiny_sdxl), LATENT, steps=2)
    reuse, run = run_records(caplog)
    assert reuse.plans_built == 4  # 2 levels x 2 epochs
    assert run.family == "unet" and run.tokens == {(4, 4): (16, 8), (8, 8): (64, 32)}
    assert (run.steps_merged, run.total_steps) == (2, 2) and run.block_runs_merged == 34 and run.unmerged_calls == run.unmerged_blocks == {}


def test_min_tokens_per_level(tiny_sdxl: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    merged, calls = record_attention(patch(toma, tiny_sdxl, min_tokens=32))
    tiny.sample(merged, LATENT, steps=1)
    assert self_attention(calls) == [32, 32] + [16] * 12 + [32] * 3
    assert run_records(caplog)[-1].unmerged_blocks.get("level below min_tokens=32") == 12


# --- composition with other patches ------------------------------------------------------


def test_foreign_attention_patches_see_merged_tokens(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    """IP-Adapter-style attn2 patch (extra image tokens appended to the text context) still runs
    inside merged blocks and still changes the result."""
    seen: list[int] = []
    extra_tokens = torch.randn((1, 4, 64), generator=torch.Generator().manual_seed(9))

    def ip_adapter_like(n, context, value, extra):
        seen.append(n.shape[1])
        more = extra_tokens.to(context).expand(context.shape[0], -1, -1)
        return n, torch.cat([context, more], 1), torch.cat([value, more], 1)

    other = tiny_sdxl.clone()
    other.set_model_attn2_patch(ip_adapter_like)
    for scope, first_seen in (("block", 32), ("attention", 64)):
        merged, calls = record_attention(patch(toma, other, scope=scope))
        seen.clear()
        out = tiny.sample(merged, LATENT, steps=1)
        without = tiny.sample(patch(toma, tiny_sdxl, scope=scope), LATENT, steps=1)
        assert [q for q, k in calls if k == TEXT + 4] == [n // 2 for n in SDXL_PLAIN]
        assert rel(out, without) > 1e-4
        # block scope: the patch runs inside the merged block; attention scope: patches run in
        # registration order, and this one was added before ToMA's.
        assert seen[0] == first_seen


def test_attention_replace_keeps_block_unmerged(tiny_sdxl: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """SAG / PAG / IP-Adapter-plus style attn replace patches: those blocks run on all tokens."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    seen: list[int] = []

    def replace(q, k, v, extra):
        seen.append(q.shape[1])
        from comfy.ldm.modules.attention import optimized_attention

        return optimized_attention(q, k, v, extra["n_heads"])

    other = tiny_sdxl.clone()
    other.set_model_attn1_replace(replace, "middle", 0, 0)
    other.set_model_attn2_replace(replace, "input", 4)
    merged, calls = record_attention(patch(toma, other))
    tiny.sample(merged, LATENT, steps=1)
    assert seen == [64, 16]  # input 4 (attn2) and middle depth 0 (attn1) at full N
    expected = [n // 2 for n in SDXL_PLAIN]
    expected[0] = 64
    del expected[6]  # the replaced attn1 of middle depth 0 bypasses the recording override
    assert self_attention(calls) == expected
    assert run_records(caplog)[-1].unmerged_blocks.get("attn1/attn2 replace patch present") == 2


def test_builtin_sag_and_pag_run(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    from comfy_extras.nodes_pag import PerturbedAttentionGuidance
    from comfy_extras.nodes_sag import SelfAttentionGuidance

    for order in ("toma_first", "toma_last"):
        for guided in (
            lambda m: SelfAttentionGuidance.execute(m, 0.5, 2.0).result[0],
            lambda m: PerturbedAttentionGuidance.execute(m, 3.0).result[0],
        ):
            model = guided(patch(toma, tiny_sdxl)) if order == "toma_first" else patch(toma, guided(tiny_sdxl))
            out = tiny.sample(model, LATENT, steps=2)
            assert torch.isfinite(out).all()


@pytest.mark.parametrize("ratio", [0.3, 0.5])
def test_sag_with_attention_scope(tiny_sdxl: Any, tiny: Any, toma: Any, ratio: float, caplog: pytest.LogCaptureFixture) -> None:
    """SAG factors the middle block's attention map into a grid: its block must stay unmerged in
    scope "attention" too, in either node order (measured: it crashes on merged maps of 8 or 45 tokens)."""
    from comfy_extras.nodes_sag import SelfAttentionGuidance

    def sag(model: Any) -> Any:
        return SelfAttentionGuidance.execute(model, 0.5, 2.0).result[0]

    for model in (sag(patch(toma, tiny_sdxl, ratio=ratio, scope="attention")), patch(toma, sag(tiny_sdxl), ratio=ratio, scope="attention")):
        merged, calls = record_attention(model)
        assert torch.isfinite(tiny.sample(merged, LATENT, steps=2)).all()
        assert min(self_attention(calls)) < 16  # the other 4x4 blocks still merge
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    tiny.sample(sag(patch(toma, tiny_sdxl, ratio=ratio, scope="attention")), LATENT, steps=1)
    # SAG's middle depth-0 block, once in the CFG call and once in SAG's own guidance call
    assert run_records(caplog)[-1].unmerged_blocks.get("attn1/attn2 replace patch present") == 2


def test_cond_and_uncond_in_separate_calls(tiny_sdxl: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Text lengths 77 and 80 cannot be batched: cond and uncond run as two batch-1 calls."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    pos = tiny.make_conditioning(tiny_sdxl, 1234, text_len=77)
    neg = tiny.make_conditioning(tiny_sdxl, 1235, text_len=80)
    merged, calls = record_attention(patch(toma, tiny_sdxl))
    out = tiny.sample(merged, LATENT, positive=pos, negative=neg, steps=2)
    baseline = tiny.sample(tiny_sdxl, LATENT, positive=pos, negative=neg, steps=2)
    assert torch.isfinite(out).all() and rel(out, baseline) > 1e-3
    assert {k for q, k in calls if k in (77, 80)} == {77, 80}
    run = run_records(caplog)[-1]
    assert run.calls_merged == run.total_calls == 4 and run.plans_built == 8  # 2 steps x 2 calls x 2 levels


def test_controlnet_still_works(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    import comfy.cldm.cldm
    import comfy.controlnet
    import comfy.model_management as mm

    config = {k: v for k, v in tiny.tiny_sdxl_config().items() if k not in ("out_channels", "use_temporal_attention", "use_temporal_resblock")}
    net = comfy.cldm.cldm.ControlNet(hint_channels=3, **config)
    tiny.init_weights(net, seed=11)
    control = comfy.controlnet.ControlNet(net, load_device=mm.get_torch_device())
    hint = torch.rand((1, 3, LATENT[2] * 8, LATENT[3] * 8), generator=torch.Generator().manual_seed(1))

    def conditioning(strength: float) -> list:
        ((ctx, extras),) = tiny.make_conditioning(tiny_sdxl, 1234)
        extras = dict(extras, control=control.copy().set_cond_hint(hint, strength), control_apply_to_uncond=False)
        return [[ctx, extras]]

    patched, calls = record_attention(patch(toma, tiny_sdxl))
    strong = tiny.sample(patched, LATENT, positive=conditioning(1.0), steps=2)
    weak = tiny.sample(patched, LATENT, positive=conditioning(0.0), steps=2)
    assert torch.isfinite(strong).all() and rel(strong, weak) > 1e-4
    assert min(self_attention(calls)) == 8  # the UNet's blocks merged; the ControlNet's are not patched


def test_lora_order_does_not_matter(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    key = "diffusion_model.input_blocks.7.1.transformer_blocks.0.ff.net.2.weight"
    weight = tiny_sdxl.model.state_dict()[key]
    delta = torch.randn(weight.shape, generator=torch.Generator().manual_seed(3)) * 0.1

    def lora(model: Any) -> Any:
        clone = model.clone()
        clone.add_patches({key: ("diff", (delta,))}, 1.0)
        return clone

    first = tiny.sample(patch(toma, lora(tiny_sdxl)), LATENT, steps=2)
    last = tiny.sample(lora(patch(toma, tiny_sdxl)), LATENT, steps=2)
    assert torch.equal(first, last)
    assert rel(first, tiny.sample(patch(toma, tiny_sdxl), LATENT, steps=2)) > 1e-5


# --- node-level behaviour -------------------------------------------------------------------


def test_reapplying_replaces(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    once = patch(toma, tiny_sdxl)
    twice = patch(toma, patch(toma, tiny_sdxl, ratio=0.25, blocks="all", scope="attention"))
    assert set(twice.object_patches) == set(once.object_patches)
    assert not twice.model_options["transformer_options"].get("patches", {}).get("attn1_patch")
    import comfy.patcher_extension as pe

    assert not twice.get_wrappers(pe.WrappersMP.APPLY_MODEL, toma.unet.REPLACE_KEY)
    attention = patch(toma, twice, scope="attention")
    assert len(attention.get_wrappers(pe.WrappersMP.APPLY_MODEL, toma.unet.REPLACE_KEY)) == 1 and not attention.object_patches
    assert torch.equal(tiny.sample(twice, LATENT), tiny.sample(once, LATENT))
    narrow = patch(toma, once, blocks="middle")
    assert len(narrow.object_patches) == 2


def test_foreign_object_patch_runs_on_merged_tokens(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    """Another pack's object patch on a block's forward stays in place and runs inside the merge;
    re-applying ToMA wraps it once, and ToMA off restores it."""
    key = "diffusion_model.input_blocks.4.1.transformer_blocks.0.forward"
    module = tiny_sdxl.model.diffusion_model.input_blocks[4][1].transformer_blocks[0]
    seen: list[int] = []

    def foreign(x, context=None, transformer_options={}):
        seen.append(x.shape[1])
        return type(module).forward(module, x, context=context, transformer_options=transformer_options)

    other = tiny_sdxl.clone()
    other.add_object_patch(key, foreign)
    twice = patch(toma, patch(toma, other, ratio=0.25))
    tiny.sample(twice, LATENT, steps=1)
    assert seen == [32]  # cond + uncond batched: one call, merged 64 -> 32
    assert twice.object_patches[key].toma_foreign is foreign
    off = patch(toma, twice, blocks="middle")
    assert off.object_patches[key] is foreign


def test_bad_blocks_are_refused_at_node_time(tiny_sdxl: Any, tiny_sd15: Any, toma: Any) -> None:
    with pytest.raises(ValueError, match="input:4-8,middle,output:0-5"):
        patch(toma, tiny_sdxl, blocks="double:0-3")
    with pytest.raises(ValueError, match=r"selects none.*input 4 \(1/2\)"):
        patch(toma, tiny_sdxl, blocks="input:0-2")
    assert len(patch(toma, tiny_sd15, blocks="input:1-2").object_patches) == 2


def test_advanced_node_on_sdxl(tiny_sdxl: Any, tiny: Any, toma: Any) -> None:
    nodes = toma.nodes
    out = nodes.ToMAPatch.execute(tiny_sdxl, 0.0, 4, 0.0, 1.0, 1, 1)
    assert torch.equal(tiny.sample(out.result[0], LATENT), tiny.sample(tiny_sdxl, LATENT))
    adv = nodes.ToMAPatchAdvanced.execute(
        tiny_sdxl, 0.5, 4, 0.0, 1.0, 1, "input:4-8,middle,output:0-5", 0, "cosine", 0.0, "tile", False, "block", False, 1, "delta",
    )
    assert rel(tiny.sample(adv.result[0], LATENT), tiny.sample(tiny_sdxl, LATENT)) > 1e-3
    with pytest.raises(ValueError, match="proportional_attention=True is available for Flux-family models only"):
        nodes.ToMAPatchAdvanced.execute(tiny_sdxl, 0.5, 4, 0.0, 1.0, 1, "auto", 0, "cosine", 0.0, "tile", True, "block", False, 1, "delta")


def test_bench_sdxl_runs(comfy: Any) -> None:
    """bench/speed/bench_sdxl.py end to end on a tiny size (the table's rows and columns)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "bench.speed.bench_sdxl", "--channels", "32", "--latent", "16",
         "--rounds", "1", "--calls", "1", "--threads", "1"],
        cwd=root, capture_output=True, text=True, timeout=300, env={**os.environ, "COMFYUI_PATH": str(comfy)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line[:16].strip() for line in result.stdout.splitlines()[2:]]
    assert rows[:4] == ["unpatched", "ToMA 0.25", "ToMA 0.5", "ToMA 0.75"]
    assert "ToMA-attn 0.5" in rows and "ToMe 0.5" in rows


@pytest.mark.parametrize(
    "family, depth, expected",
    [
        # SDXL (comfy.supported_models.SDXL's unet config): 10 blocks at 1/2 (64x64 at 1024^2), 60 at 1/4 (32x32); auto takes output 0-5, 36.
        ("SDXL", ([0, 0, 2, 2, 10, 10], [0, 0, 0, 2, 2, 2, 10, 10, 10], 10), {2: 10, 4: 60}),
        # SD1.5: one block per transformer at 1, 1/2, 1/4 and the 1/8 middle; auto takes output 3-11, 9.
        ("SD15", ([1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0], 1), {1: 5, 2: 5, 4: 5, 8: 1}),
    ],
)
def test_real_topology_sites_and_auto(comfy: Any, toma: Any, family: str, depth: tuple, expected: dict[int, int]) -> None:
    """find_sites on the real SDXL / SD1.5 configs, built on the meta device (no memory)."""
    from collections import Counter

    import comfy.ops
    from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

    sdxl = family == "SDXL"
    unet = UNetModel(
        image_size=32, in_channels=4, out_channels=4, model_channels=320, num_res_blocks=[2] * (3 if sdxl else 4),
        channel_mult=[1, 2, 4] if sdxl else [1, 2, 4, 4], transformer_depth=depth[0], transformer_depth_output=depth[1],
        transformer_depth_middle=depth[2], use_spatial_transformer=True, use_linear_in_transformer=sdxl, legacy=False,
        num_classes="sequential" if sdxl else None, adm_in_channels=2816 if sdxl else None,
        context_dim=2048 if sdxl else 768, num_heads=-1 if sdxl else 8, num_head_channels=64 if sdxl else -1,
        device="meta", operations=comfy.ops.disable_weight_init,
    )
    sites = toma.unet.find_sites(unet)
    assert Counter(s.downsample for s in sites) == expected
    auto = pack_module("nodes.families.unet_blocks").parse_unet_blocks("auto")
    chosen = [s for s in sites if auto.selects(s.block, s.downsample)]
    assert len(chosen) == (36 if sdxl else 9) and all(s.block[0] == "output" for s in chosen)
    if sdxl:
        assert {s.block for s in sites if s.downsample == 4} == {("input", 7), ("input", 8), ("middle", 0), ("output", 0), ("output", 1), ("output", 2)}


@pytest.mark.parametrize("name", ["tiny_sdxl", "tiny_sd15"])
def test_cross_attention_context_reaches_attention_exactly(name: str, tiny: Any, toma: Any, request: pytest.FixtureRequest) -> None:
    """Which rows merged: every BasicTransformerBlock's attn2 gets the text context's keys and
    values exactly as unpatched, queried by the merged tokens of its attn1, whose queries, keys and
    values are shortened (every block, blocks "all")."""
    import family_checks as fc

    model = request.getfixturevalue(name)
    pos, neg = tiny.make_conditioning(model, 1234), tiny.make_conditioning(model, 1235)
    plain = fc.attention_inputs(tiny, model, LATENT, pos, neg)
    merged = fc.attention_inputs(tiny, patch(toma, model, blocks="all"), LATENT, pos, neg)
    assert len(plain) == len(merged) and len(plain) % 2 == 0
    shortened = 0
    for (p_self, m_self), (p_cross, m_cross) in zip(zip(plain[::2], merged[::2]), zip(plain[1::2], merged[1::2])):
        n, d = p_self[0].shape[1], m_self[0].shape[1]
        assert p_self[1].shape[1] == n != TEXT and all(t.shape[1] == d for t in m_self)
        shortened += d < n
        assert p_cross[1].shape[1] == TEXT and p_cross[0].shape[1] == n and m_cross[0].shape[1] == d
        assert torch.equal(m_cross[1], p_cross[1]) and torch.equal(m_cross[2], p_cross[2])
    assert shortened == len(plain) // 2


@pytest.mark.parametrize("name, n", [("tiny_sdxl", 64), ("tiny_sd15", 256)])
def test_keys_values_merge_only_attn1_keys(name: str, n: int, tiny: Any, toma: Any, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> None:
    """Scope keys_values, which rows merged: the first block's attn1 keeps its N queries and gets N - D
    merged keys and values, each weighed by its log-mass (no pass-through rows: attn1 holds the image
    alone); every attn2 keeps its N queries and the text context's keys and values exactly; every
    block of the selection runs merged."""
    import family_checks as fc

    model = request.getfixturevalue(name)
    pos, neg = tiny.make_conditioning(model, 1234), tiny.make_conditioning(model, 1235)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    fc.check_keys_values_rows(tiny, toma, model, LATENT, pos, neg, lambda plain, merged: [], n // 2)
    run = fc.summary(caplog)
    plain = fc.attention_inputs(tiny, model, LATENT, pos, neg)
    merged = fc.attention_inputs(tiny, patch(toma, model, blocks="all", scope="keys_values"), LATENT, pos, neg)
    assert len(plain) == len(merged) == 2 * run.block_runs_merged and run.unmerged_blocks == {}, run
    for (p_self, m_self), (p_cross, m_cross) in zip(zip(plain[::2], merged[::2]), zip(plain[1::2], merged[1::2])):
        assert m_self[0].shape[1] == p_self[0].shape[1] and m_self[1].shape[1] < p_self[1].shape[1]
        assert m_cross[0].shape[1] == p_cross[0].shape[1]
        assert torch.equal(m_cross[1], p_cross[1]) and torch.equal(m_cross[2], p_cross[2])
