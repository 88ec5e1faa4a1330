"""ToMA on Flux-family models in real ComfyUI: tiny random-weight Flux sampled through
`comfy.sample.sample`. Skipped with a reason when ComfyUI is not importable.

Token counts are measured, not assumed: an `optimized_attention_override` on the model records the
sequence length of every attention call.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import compat_support  # noqa: E402
import family_checks as fc  # noqa: E402
from compat_support import FLUX_TEXT as TEXT  # noqa: E402
from compat_support import (  # noqa: E402
    RUNTIME_LOGGER,
    patch,
    run_records,
    runs_for,
    sample_with_noise,
)

from harness.metrics import relative_error as rel  # noqa: E402
from harness.tiny_models import FLUX_LATENT  # noqa: E402


def record_attention(model: Any) -> tuple[Any, list[int]]:
    """A clone of `model` whose attention calls append their sequence length to the returned list."""
    return compat_support.record_attention(model, lambda batch, q, k, mask: q)


def zero_then_merged(tiny: Any, toma: Any, model: Any, pos: list, neg: list, steps: int = 4) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """With this conditioning, ratio 0 (every block) must equal the unpatched model bit for bit;
    then (unpatched output, output at ratio 0.5 with every block merged after `steps` steps,
    attention lengths of that run)."""
    baseline = tiny.sample(model, FLUX_LATENT, positive=pos, negative=neg)
    zero = patch(toma, model, ratio=0.0, blocks="all")
    assert torch.equal(tiny.sample(zero, FLUX_LATENT, positive=pos, negative=neg), baseline)
    merged, lengths = record_attention(patch(toma, model, blocks="all"))
    out = tiny.sample(merged, FLUX_LATENT, positive=pos, negative=neg, steps=steps)
    return baseline, out, lengths


@pytest.mark.parametrize("scope", ["block", "attention", "keys_values"])
def test_ratio_zero_is_bit_identical(tiny_flux: Any, tiny: Any, toma: Any, scope: str) -> None:
    baseline = tiny.sample(tiny_flux, FLUX_LATENT, seed=3)
    assert torch.equal(tiny.sample(patch(toma, tiny_flux, ratio=0.0, blocks="all", scope=scope), FLUX_LATENT, seed=3), baseline)


def test_attention_runs_on_fewer_tokens(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    plain, plain_lengths = record_attention(tiny_flux)
    merged, merged_lengths = record_attention(patch(toma, tiny_flux, ratio=0.5, tile_size=4, blocks="all"))
    baseline = tiny.sample(plain, FLUX_LATENT, steps=2)
    out = tiny.sample(merged, FLUX_LATENT, steps=2)
    assert set(plain_lengths) == {TEXT + 64}
    assert set(merged_lengths) == {TEXT + 32}  # 8x8 grid, 2x2 tiles of 16 keep 8 each
    assert len(merged_lengths) == len(plain_lengths) == 2 * 4  # 2 steps x (2 double + 2 single)
    assert rel(out, baseline) > 1e-3


def test_scope_attention_merges_double_block_attention(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    """Scope attention: every attention, double (attention only) and single (whole
    block), runs on T + D tokens; another override on the model still sees every call; the
    image differs from both the unpatched and the block-scope run."""
    plain = tiny.sample(tiny_flux, FLUX_LATENT, steps=2)
    merged, lengths = record_attention(patch(toma, tiny_flux, ratio=0.5, tile_size=4, blocks="all", scope="attention"))
    out = tiny.sample(merged, FLUX_LATENT, steps=2)
    block = tiny.sample(patch(toma, tiny_flux, ratio=0.5, tile_size=4, blocks="all"), FLUX_LATENT, steps=2)
    assert lengths == [TEXT + 32] * 8
    assert rel(out, plain) > 1e-3 and rel(out, block) > 1e-3
    zero = patch(toma, tiny_flux, ratio=0.0, blocks="all", scope="attention")
    assert torch.equal(tiny.sample(zero, FLUX_LATENT, steps=2), plain)


def test_scope_attention_double_only_keeps_single_blocks_whole(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    merged, lengths = record_attention(patch(toma, tiny_flux, blocks="double:0-1", scope="attention", proportional_attention=True))
    tiny.sample(merged, FLUX_LATENT, steps=1)
    assert lengths == [TEXT + 32, TEXT + 32, TEXT + 64, TEXT + 64]


def test_auto_and_listed_blocks_merge_only_those(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    merged, lengths = record_attention(patch(toma, tiny_flux, blocks="double:1,single:0"))
    tiny.sample(merged, FLUX_LATENT, steps=1)
    assert lengths == [TEXT + 64, TEXT + 32, TEXT + 32, TEXT + 64]


def test_unpatched_model_unchanged_after_patched_runs(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    baseline = tiny.sample(tiny_flux, FLUX_LATENT, seed=5)
    patched = patch(toma, tiny_flux)
    tiny.sample(patched, FLUX_LATENT, seed=5)
    tiny.sample(patched, (1, 16, 12, 20), seed=5)
    assert torch.equal(tiny.sample(tiny_flux, FLUX_LATENT, seed=5), baseline)
    assert toma.settings.TOMA_KEY not in tiny_flux.model_options.get("transformer_options", {})
    assert not tiny_flux.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit")


def test_deterministic(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    patched = patch(toma, tiny_flux)
    first = tiny.sample(patched, FLUX_LATENT, seed=7)
    assert torch.equal(tiny.sample(patched, FLUX_LATENT, seed=7), first)
    assert torch.equal(tiny.sample(patch(toma, tiny_flux), FLUX_LATENT, seed=7), first)


@pytest.mark.parametrize("steps, bound", [(1, 1e-4), (2, 0.1)])
def test_batch_of_two_equals_two_single_runs(tiny_flux: Any, tiny: Any, toma: Any, steps: int, bound: float) -> None:
    """Per-sample plans, judged against ToMA's own effect (a shared plan would be most of it).

    After one step the batch equals the single runs to float noise. Later steps start from
    inputs that differ by float noise, which can flip near-ties in the greedy selection of this
    random-weight model; the difference then grows (measured: 2.5% of the effect after 2
    steps, 17% after 4), so only one and two steps are checked.
    """
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn((2, *FLUX_LATENT[1:]), generator=gen)
    patched = patch(toma, tiny_flux)
    batch = sample_with_noise(tiny, patched, noise, steps=steps)
    singles = torch.cat([sample_with_noise(tiny, patched, noise[i:i + 1], steps=steps) for i in range(2)])
    plain = sample_with_noise(tiny, tiny_flux, noise, steps=steps)
    effect = rel(batch, plain)
    assert effect > 1e-2
    assert rel(batch, singles) < bound * effect


REFS = 4 * 6
"""Reference tokens of the Kontext reference latent (1, 16, 8, 12) of `kontext_conditioning`."""


def kontext_conditioning(tiny: Any, model: Any, method: str | None = None) -> tuple[list, list]:
    """(positive with one reference latent, negative without); method: the conditioning's
    reference_latents_method (comfy.model_base.Flux.extra_conds), None for the model's default."""
    ref = torch.randn((1, 16, 8, 12), generator=torch.Generator().manual_seed(2))
    pos = tiny.make_conditioning(model, 1234, reference_latents=[ref])
    if method is not None:
        pos[0][1]["reference_latents_method"] = method
    return pos, tiny.make_conditioning(model, 1235)


def text_and_references(refs: int) -> Any:
    """check_passthrough_rows' kept(): the T text rows first, the `refs` reference rows last."""

    def kept(plain_length: int, merged_length: int) -> list[tuple[int, int, int]]:
        return [(0, 0, TEXT)] + ([(plain_length - refs, merged_length - refs, refs)] if refs else [])

    return kept


def test_kontext_reference_tokens_pass_through(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    pos, neg = kontext_conditioning(tiny, tiny_flux)
    _, out, lengths = zero_then_merged(tiny, toma, tiny_flux, pos, neg, steps=1)
    assert sorted(set(lengths)) == [TEXT + 32, TEXT + 32 + REFS]  # uncond alone, cond with refs
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("blocks", ["all", "single:0"])
@pytest.mark.parametrize("method", [None, "offset", "index"])
def test_text_and_reference_rows_pass_through_exactly(tiny_flux: Any, tiny: Any, toma: Any, method: str | None, blocks: str) -> None:
    """Text rows (Flux.1: no text position ids) and Kontext reference rows ("offset" and "index"
    positions) reach the first merged double / single block's attention exactly as unpatched."""
    if method is None:
        pos, neg = tiny.make_conditioning(tiny_flux, 1234), tiny.make_conditioning(tiny_flux, 1235)
    else:
        pos, neg = kontext_conditioning(tiny, tiny_flux, method)
    kept = text_and_references(0 if method is None else REFS)
    fc.check_passthrough_rows(tiny, toma, tiny_flux, FLUX_LATENT, pos, neg, kept, 32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, tiny_flux, FLUX_LATENT, pos, neg, kept, 32, blocks=blocks)


@pytest.fixture(scope="module")
def global_modulation_flux(tiny: Any) -> Any:
    """A tiny Flux with Flux.2's global modulation (comfy.ldm.flux.model.FluxParams.global_modulation):
    the reference method "index_timestep_zero" needs it (a Flux.1 block cannot take the doubled vec,
    ComfyUI fails there unpatched)."""
    import dataclasses

    import comfy.ldm.flux.model

    if "global_modulation" not in {f.name for f in dataclasses.fields(comfy.ldm.flux.model.FluxParams)}:
        pytest.skip("ComfyUI 0.3.64 has no comfy.ldm.flux global modulation nor reference method index_timestep_zero")
    return tiny.build_flux(seed=0, global_modulation=True)


@pytest.mark.parametrize("blocks", ["all", "single:0"])
def test_timestep_zero_references_keep_their_modulation(global_modulation_flux: Any, tiny: Any, toma: Any, blocks: str) -> None:
    """Reference method "index_timestep_zero": comfy.ldm.flux.model.Flux modulates the reference
    tokens with timestep zero through spans over the full token rows. Merged, the reference rows
    still reach the first merged double / single block's attention exactly as unpatched (their
    own modulation), and ratio 0 is bit-identical."""
    model = global_modulation_flux
    pos, neg = kontext_conditioning(tiny, model, "index_timestep_zero")
    fc.check_ratio_zero(tiny, toma, model, FLUX_LATENT, pos, neg)
    fc.check_passthrough_rows(tiny, toma, model, FLUX_LATENT, pos, neg, text_and_references(REFS), 32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, model, FLUX_LATENT, pos, neg, text_and_references(REFS), 32, blocks=blocks)


def later_replacement(patched: Any) -> Any:
    """`patched` with a replacement put on every ToMA key after ToMA, handing ToMA its own original_block."""
    replaced = patched.clone()
    dit = replaced.model_options["transformer_options"]["patches_replace"]["dit"]
    for (group, index), toma_block in list(dit.items()):
        replaced.set_model_patch_replace(
            lambda args, extra, inner=toma_block: inner(args, {"original_block": lambda a: extra["original_block"](a)}),
            "dit", group, index,
        )
    return replaced


def test_timestep_zero_spans_move_under_a_later_replacement(global_modulation_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The modulation spans reach the block's forward (ToMA's object patch moves them), not the
    replace args: a replacement put on the keys after ToMA leaves every block run merged, with
    the output of ToMA alone."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    pos, neg = kontext_conditioning(tiny, global_modulation_flux, "index_timestep_zero")
    patched = patch(toma, global_modulation_flux, blocks="all")
    alone = tiny.sample(patched, FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=1.0)
    assert torch.equal(tiny.sample(later_replacement(patched), FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=1.0), alone)
    assert run_records(caplog)[-1].block_runs_merged == 8


def test_timestep_zero_block_whose_forward_patch_was_replaced_runs_unmerged(global_modulation_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Another node's object patch of a block's forward, put after ToMA, replaces ToMA's (which
    moves the spans): that block's merged result is discarded and it runs unmerged with the layout
    reason, so the output equals ToMA on the other blocks only."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    pos, neg = kontext_conditioning(tiny, global_modulation_flux, "index_timestep_zero")
    replaced = patch(toma, global_modulation_flux, blocks="all").clone()
    block = replaced.get_model_object("diffusion_model").single_blocks[0]
    replaced.add_object_patch("diffusion_model.single_blocks.0.forward", partial(type(block).forward, block))
    out = tiny.sample(replaced, FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=1.0)
    run = run_records(caplog)[-1]
    assert runs_for(run.unmerged_blocks, "modulation spans not moved") == 2 and run.block_runs_merged == 6, run
    others = patch(toma, global_modulation_flux, blocks="double:0-1,single:1")
    assert torch.equal(out, tiny.sample(others, FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=1.0))


def cut_timestep_zero(model: Any) -> Any:
    """A clone of a Flux whose timestep-zero spans start 8 rows before the image's end: an object
    patch of comfy.ldm.flux.model.Flux.forward_orig shifting its timestep_zero_index."""
    cut = model.clone()
    dm = cut.get_model_object("diffusion_model")

    def forward_orig(*args: Any, timestep_zero_index: Any = None, **kwargs: Any) -> Any:
        spans = None if timestep_zero_index is None else [[first - 8, end] for first, end in timestep_zero_index]
        return type(dm).forward_orig(dm, *args, timestep_zero_index=spans, **kwargs)

    cut.add_object_patch("diffusion_model.forward_orig", forward_orig)
    return cut


def test_timestep_zero_spans_toma_cannot_move_run_unmerged(global_modulation_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Modulation spans with a boundary inside the image rows cannot follow the merge: every block
    of the call with timestep-zero references runs unmerged, counted with the layout reason, and
    the output equals the unpatched model's."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    model = cut_timestep_zero(global_modulation_flux)
    pos, neg = kontext_conditioning(tiny, model, "index_timestep_zero")
    patched = later_replacement(patch(toma, model, blocks="all"))
    plain = tiny.sample(model, FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=1.0)
    assert torch.equal(tiny.sample(patched, FLUX_LATENT, positive=pos, negative=neg, steps=2, cfg=1.0), plain)
    run = run_records(caplog)[-1]
    assert run.block_runs_merged == 0 and runs_for(run.unmerged_blocks, "per-span modulation") == 8, run


@pytest.mark.parametrize("shape", [(1, 16, 18, 26), (1, 16, 17, 23), (1, 16, 2, 30), (1, 16, 10, 10)])
def test_any_resolution(tiny_flux: Any, tiny: Any, toma: Any, shape: tuple[int, ...]) -> None:
    merged, lengths = record_attention(patch(toma, tiny_flux, tile_size=4))
    out = tiny.sample(merged, shape, steps=2)
    baseline = tiny.sample(tiny_flux, shape, steps=2)
    h, w = -(-shape[2] // 2), -(-shape[3] // 2)
    assert out.shape == baseline.shape and torch.isfinite(out).all()
    assert max(lengths) < TEXT + h * w
    assert torch.equal(tiny.sample(patch(toma, tiny_flux, ratio=0.0), shape, steps=2), baseline)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_cfg_one_and_above(tiny_flux: Any, tiny: Any, toma: Any, cfg: float) -> None:
    baseline = tiny.sample(tiny_flux, FLUX_LATENT, cfg=cfg)
    assert torch.equal(tiny.sample(patch(toma, tiny_flux, ratio=0.0), FLUX_LATENT, cfg=cfg), baseline)
    assert rel(tiny.sample(patch(toma, tiny_flux), FLUX_LATENT, cfg=cfg), baseline) > 1e-3


def test_heun_shares_one_plan_per_step(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    patched = patch(toma, tiny_flux)
    out = tiny.sample(patched, FLUX_LATENT, steps=3, sampler_name="heun")
    assert torch.isfinite(out).all()
    (run,) = run_records(caplog)
    assert (run.steps_merged, run.total_steps, run.calls_merged, run.total_calls) == (3, 3, 5, 5)  # heun: 2 evaluations per step except the last
    assert run.plans_built == 3


def test_denoise_below_one(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    start = torch.randn(FLUX_LATENT, generator=torch.Generator().manual_seed(4))
    baseline = tiny.sample(tiny_flux, None, latent_image=start, denoise=0.5)
    assert torch.equal(tiny.sample(patch(toma, tiny_flux, ratio=0.0), None, latent_image=start, denoise=0.5), baseline)
    tiny.sample(patch(toma, tiny_flux, end=0.75), None, latent_image=start, denoise=0.5, steps=4)
    assert run_records(caplog)[-1].total_steps == 4


def test_split_sampling_uses_sigma_window(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """KSamplerAdvanced-style halves: merging for the first half of sigma only."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    patched = patch(toma, tiny_flux, end=0.5)
    kwargs = dict(seed=1, steps=6)
    tiny.sample(patched, FLUX_LATENT, **kwargs)
    first = tiny.sample(patched, FLUX_LATENT, start_step=0, last_step=3, force_full_denoise=False, **kwargs)
    tiny.sample(patched, None, latent_image=first, start_step=3, last_step=6, disable_noise=True, **kwargs)
    runs = run_records(caplog)
    assert len(runs) == 3
    merged = [run.steps_merged for run in runs]
    assert 0 < merged[0] < 6  # the sigma window, not a step count, decides
    assert merged[1] == 3 and merged[1] + merged[2] == merged[0]


def test_two_resolutions_do_not_leak(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    patched = patch(toma, tiny_flux)
    tiny.sample(patched, FLUX_LATENT, seed=2)
    second = tiny.sample(patched, (1, 16, 12, 20), seed=2)
    assert torch.equal(second, tiny.sample(patch(toma, tiny_flux), (1, 16, 12, 20), seed=2))


def test_recompute_every_reuses_plans(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    tiny.sample(patch(toma, tiny_flux, every=2), FLUX_LATENT, steps=4)
    assert run_records(caplog)[-1].plans_built == 2


def merge_every_node(toma: Any, model: Any, merge_every: int, recompute_every: int = 1) -> Any:
    """The Advanced node as a user wires it: ratio 0.5, tile 4, every block, this schedule."""
    return toma.nodes.ToMAPatchAdvanced.execute(
        model, 0.5, 4, 0.0, 1.0, recompute_every,
        "all", 0, "cosine", 0.001, "tile", False, "block", False, merge_every, "delta",
    ).result[0]


def test_merge_every_merges_every_other_step(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """merge_every=2 over 4 Euler steps: steps 0 and 2 run every block on merged
    tokens, steps 1 and 3 on all of them; merge_every=1 is the default schedule, bit for bit."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    model, lengths = record_attention(merge_every_node(toma, tiny_flux, 2))
    out = tiny.sample(model, FLUX_LATENT, steps=4)
    blocks = 4  # 2 double + 2 single, one call per step (cond and uncond batched)
    merged_steps = [0, 2]
    assert lengths == [TEXT + (32 if step in merged_steps else 64) for step in range(4) for _ in range(blocks)]
    (run,) = run_records(caplog)
    assert (run.steps_merged, run.total_steps, run.calls_merged, run.total_calls) == (2, 4, 2, 4) and run.plans_built == 2
    assert run.unmerged_calls.get("between merge steps (merge_every=2)") == 2 and "merge every 2," in run.settings
    every_step = tiny.sample(merge_every_node(toma, tiny_flux, 1), FLUX_LATENT, steps=4)
    assert torch.equal(every_step, tiny.sample(patch(toma, tiny_flux, blocks="all"), FLUX_LATENT, steps=4))
    plain = tiny.sample(tiny_flux, FLUX_LATENT, steps=4)
    assert rel(out, plain) > 1e-3 and rel(out, every_step) > 1e-3


def test_merge_every_with_recompute_every_counts_sampling_steps(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """recompute_every counts sampling steps: with merge_every=2, recompute_every=2 re-selects at
    every merged step; recompute_every=3 lets step 2 reuse step 0's plan (2 steps old)."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    for recompute, plans in ((2, 2), (3, 1)):
        tiny.sample(merge_every_node(toma, tiny_flux, 2, recompute), FLUX_LATENT, steps=4)
        run = run_records(caplog)[-1]
        assert (run.steps_merged, run.total_steps) == (2, 4) and run.plans_built == plans, run


def test_merge_every_with_separate_cfg_calls(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Kontext cond (with reference tokens) and uncond run as two calls per step: both follow
    their step's decision."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    ref = torch.randn((1, 16, 8, 12), generator=torch.Generator().manual_seed(2))
    pos = tiny.make_conditioning(tiny_flux, 1234, reference_latents=[ref])
    neg = tiny.make_conditioning(tiny_flux, 1235)
    tiny.sample(merge_every_node(toma, tiny_flux, 2), FLUX_LATENT, positive=pos, negative=neg, steps=4)
    run = run_records(caplog)[-1]
    assert (run.steps_merged, run.total_steps, run.calls_merged, run.total_calls) == (2, 4, 4, 8)


def test_merge_every_with_heun(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Heun's corrector of step i runs at sigma i+1, step i+1's sigma, and follows that step's
    decision: with merge_every=2 over 3 steps the calls at sigma 0 and sigma 2 merge (1 + 2 of 5)."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    tiny.sample(merge_every_node(toma, tiny_flux, 2), FLUX_LATENT, steps=3, sampler_name="heun")
    run = run_records(caplog)[-1]
    assert (run.steps_merged, run.total_steps, run.calls_merged, run.total_calls) == (2, 3, 3, 5) and run.plans_built == 2


@pytest.mark.parametrize("scope", ["block", "keys_values"])
def test_one_log_line_per_run(tiny_flux: Any, tiny: Any, toma: Any, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    patched = patch(toma, tiny_flux, scope=scope)
    tiny.sample(patched, FLUX_LATENT, steps=2)
    tiny.sample(patched, FLUX_LATENT, steps=2)
    runs = run_records(caplog)
    assert len(runs) == 2
    run = runs[0]
    assert run.tokens.get((8, 8)) == (64, 32) and (run.steps_merged, run.total_steps) == (2, 2) and run.plans_built == 2
    assert run.block_runs_merged == 8 and run.unmerged_calls == run.unmerged_blocks == {}


def test_unsupported_model_is_refused(tiny_flux: Any, toma: Any) -> None:
    class Patcher:
        def get_model_object(self, name: str) -> Any:
            return torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match=r"torch\.nn\.modules\.linear\.Linear.*supported families: Flux"):
        toma.patching.patch_model(Patcher(), toma.settings.ToMASettings())
    with pytest.raises(ValueError, match="double range 0-7"):
        patch(toma, tiny_flux, blocks="double:0-7")


def test_reapplying_replaces(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    import comfy.patcher_extension as pe

    once = patch(toma, tiny_flux, ratio=0.5)
    twice = patch(toma, patch(toma, tiny_flux, ratio=0.25, blocks="double:0"), ratio=0.5)
    for kind in (pe.WrappersMP.OUTER_SAMPLE, pe.WrappersMP.APPLY_MODEL):
        assert len(twice.get_wrappers(kind, toma.settings.TOMA_KEY)) == 1
    assert torch.equal(tiny.sample(twice, FLUX_LATENT), tiny.sample(once, FLUX_LATENT))
    off = patch(toma, once, ratio=0.0, blocks="double:0")
    assert set(off.model_options["transformer_options"]["patches_replace"]["dit"]) == {("double_block", 0)}


def test_foreign_replacement_stays_outermost(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    """Another pack's block replacement keeps working; ToMA merges only around the real block."""
    seen: list[int] = []

    def foreign(args: dict, extra: dict) -> dict:
        seen.append(args["img"].shape[1])
        return extra["original_block"](args)

    other = tiny_flux.clone()
    other.set_model_patch_replace(foreign, "dit", "double_block", 0)
    merged, lengths = record_attention(patch(toma, other, blocks="all"))
    tiny.sample(merged, FLUX_LATENT, steps=1)
    assert seen == [64]  # the foreign function sees all N image tokens
    assert set(lengths) == {TEXT + 32}


def test_hooks_called_without_transformer_options(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Caching packs call block replacements from their own forward loop, without the model call's
    transformer_options (ComfyUI 0.33's Flux blocks need a dict there: an empty one): use the fallback."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)

    def strip(args: dict, extra: dict) -> dict:
        return extra["original_block"](dict(args, transformer_options={}))

    other = tiny_flux.clone()
    for i in range(2):
        other.set_model_patch_replace(strip, "dit", "double_block", i)
        other.set_model_patch_replace(strip, "dit", "single_block", i)
    tiny.sample(patch(toma, other), FLUX_LATENT, steps=2)
    assert run_records(caplog)[-1].block_runs_merged == 8


def test_nodes_schema_and_execute(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    nodes = toma.nodes
    basic = nodes.ToMAPatch.define_schema()
    assert basic.node_id == "ToMAPatch" and basic.display_name == "ToMA Patch"
    assert [i.id for i in basic.inputs] == [
        "model", "ratio", "tile_size", "start_percent", "end_percent", "recompute_every", "merge_every",
    ]
    advanced = nodes.ToMAPatchAdvanced.define_schema()
    assert advanced.display_name == "ToMA Patch (Advanced)"
    assert [i.id for i in advanced.inputs][6:] == [  # merge_every last: saved workflows keep their values
        "blocks", "min_tokens", "similarity", "temperature", "budget", "proportional_attention", "scope", "verbose",
        "merge_every", "unmerge", "tile_frames", "destinations", "destination_penalty",
    ]
    for schema in (basic, advanced):
        assert schema.category == "model_patches/ToMA" and schema.description
        assert all(i.tooltip for i in schema.inputs) and all(o.tooltip for o in schema.outputs)
    defaults = {i.id: i.default for i in basic.inputs[1:]}
    assert defaults == {
        "ratio": toma.settings.NODE_RATIO, "tile_size": toma.settings.NODE_TILE_SIZE,
        "start_percent": toma.settings.NODE_START_PERCENT, "end_percent": 1.0, "recompute_every": 1, "merge_every": 1,
    }
    out = nodes.ToMAPatch.execute(tiny_flux, 0.0, 4, 0.0, 1.0, 1, 1)
    assert torch.equal(tiny.sample(out.result[0], FLUX_LATENT), tiny.sample(tiny_flux, FLUX_LATENT))
    with pytest.raises(ValueError, match="ratio=0.99"):
        nodes.ToMAPatch.execute(tiny_flux, 0.99, 4, 0.0, 1.0, 1, 1)
    adv = nodes.ToMAPatchAdvanced.execute(tiny_flux, 0.5, 4, 0.0, 1.0, 1, "all", 1000, "cosine", 0.001, "tile", False, "block", False, 1, "delta")
    assert torch.equal(tiny.sample(adv.result[0], FLUX_LATENT), tiny.sample(tiny_flux, FLUX_LATENT))  # min_tokens
    adaptive = nodes.ToMAPatchAdvanced.execute(
        tiny_flux, 0.5, 4, 0.0, 1.0, 1, blocks="all", min_tokens=0, similarity="cosine", temperature=0.001,
        budget="adaptive", proportional_attention=True, scope="block", verbose=False, merge_every=1, unmerge="delta",
    )
    chosen = adaptive.result[0].model_options["transformer_options"][toma.settings.TOMA_KEY].config.settings
    assert (chosen.budget, chosen.proportional_attention) == ("adaptive", True)
    with pytest.raises(ValueError, match="budget='global'"):
        nodes.ToMAPatchAdvanced.execute(tiny_flux, 0.5, 4, 0.0, 1.0, 1, "all", 0, "cosine", 0.001, "global", False, "block", False, 1, "delta")


def test_entrypoint_lists_the_nodes(comfy: Any) -> None:
    """The V3 entrypoint lists the pack's three nodes and no V1 mapping."""
    import asyncio

    from harness.pack import import_pack_init

    module = import_pack_init()
    assert not hasattr(module, "NODE_CLASS_MAPPINGS")
    extension = asyncio.run(module.comfy_entrypoint())
    ids = [node.define_schema().node_id for node in asyncio.run(extension.get_node_list())]
    assert ids == ["ToMAPatch", "ToMAPatchAdvanced", "ToMACompare"]


def test_example_workflow_matches_comfy_and_schema(comfy: Any, toma: Any) -> None:
    """Core node types exist in ComfyUI's nodes.py; our node's widget values fit its schema."""
    from workflow_check import EXAMPLES, FLUX_TEMPLATE, FRONTEND_ONLY, PACK_NODES, check_workflow

    import nodes as comfy_nodes

    path = EXAMPLES / f"{FLUX_TEMPLATE}.json"
    workflow = check_workflow(path)
    for node in workflow["nodes"]:
        if node["type"] not in PACK_NODES | FRONTEND_ONLY:
            assert node["type"] in comfy_nodes.NODE_CLASS_MAPPINGS, node["type"]
    schema = toma.nodes.ToMAPatch.define_schema()
    toma_node = next(node for node in workflow["nodes"] if node["type"] == "ToMAPatch")
    widgets = [i for i in schema.inputs if i.id != "model"]
    assert len(toma_node["widgets_values"]) == len(widgets)
    for spec, value in zip(widgets, toma_node["widgets_values"]):
        assert spec.min <= value <= spec.max, spec.id


def test_attention_mask_is_merged_with_the_tokens(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A Flux `attention_mask` cond (B, T+N, T+N) keeps its destinations' rows and columns."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    length = TEXT + 64
    mask = torch.zeros((1, length, length))
    mask[:, :, 200:TEXT] = -10000.0  # hide some text tokens from everyone
    pos = tiny.make_conditioning(tiny_flux, 1234)
    pos[0][1].update(attention_mask=mask, attention_mask_img_shape=(8, 8))
    neg = tiny.make_conditioning(tiny_flux, 1235)
    _, out, lengths = zero_then_merged(tiny, toma, tiny_flux, pos, neg, steps=2)
    assert set(lengths) == {TEXT + 32} and torch.isfinite(out).all()
    run = run_records(caplog)[-1]
    assert run.unmerged_calls == run.unmerged_blocks == {} and run.block_runs_merged == 16


def build_tiny_chroma(tiny: Any) -> Any:
    """A tiny comfy.model_base.Chroma (hidden 64, 2 + 2 blocks; input already 2x2-patchified: 64 ch)."""
    import comfy.supported_models

    config = {
        "image_model": "chroma", "in_channels": 64, "out_channels": 64, "context_in_dim": 64,
        "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 4, "depth": 2, "depth_single_blocks": 2,
        "axes_dim": [4, 6, 6], "theta": 10000, "patch_size": 2, "qkv_bias": True,
        "in_dim": 64, "out_dim": 64, "hidden_dim": 32, "n_layers": 2,
    }
    return tiny.build(comfy.supported_models.Chroma, config)


CHROMA_TEXT = 32


def chroma_conditioning(mask: torch.Tensor | None = None) -> tuple[list, list]:
    """(positive, negative) for the tiny Chroma: 32 text tokens; `mask` (1, T+N, T+N) on the positive
    as a Chroma text mask (the attention_mask cond, comfy.model_base.Flux.extra_conds)."""
    gen = torch.Generator().manual_seed(0)
    pos, neg = ([[torch.randn(1, CHROMA_TEXT, 64, generator=gen), {"pooled_output": torch.zeros(1, 8)}]] for _ in range(2))
    if mask is not None:
        pos[0][1].update(attention_mask=mask, attention_mask_img_shape=(8, 8))
    return pos, neg


def chroma_text_mask() -> torch.Tensor:
    """(1, T+N, T+N): text tokens 20..31 hidden from every query, 10..13 from the text queries only."""
    length = CHROMA_TEXT + 64
    mask = torch.zeros((1, length, length))
    mask[:, :, 20:CHROMA_TEXT] = -10000.0
    mask[:, :CHROMA_TEXT, 10:14] = -10000.0
    return mask


@pytest.fixture(scope="module")
def tiny_chroma(tiny: Any) -> Any:
    return build_tiny_chroma(tiny)


def test_chroma(tiny_chroma: Any, tiny: Any, toma: Any) -> None:
    pos, neg = chroma_conditioning()
    baseline, out, lengths = zero_then_merged(tiny, toma, tiny_chroma, pos, neg)
    assert set(lengths) == {32 + 32} and rel(out, baseline) > 1e-3


@pytest.mark.parametrize("blocks", ["all", "single:0"])
@pytest.mark.parametrize("masked", [False, True])
def test_chroma_text_rows_pass_through_exactly(tiny_chroma: Any, tiny: Any, toma: Any, blocks: str, masked: bool) -> None:
    """Which rows merged on Chroma (comfy.ldm.chroma.model.Chroma, [txt; img] as Flux): the T text
    rows reach the first merged double / single block's attention exactly as unpatched, with and
    without a text mask; the image rows lose N - D."""
    pos, neg = chroma_conditioning(chroma_text_mask() if masked else None)

    def kept(plain: int, merged: int) -> list[tuple[int, int, int]]:
        return [(0, 0, CHROMA_TEXT)]

    fc.check_passthrough_rows(tiny, toma, tiny_chroma, FLUX_LATENT, pos, neg, kept, 32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, tiny_chroma, FLUX_LATENT, pos, neg, kept, 32, blocks=blocks)


def test_chroma_text_mask_keeps_its_text_rows_and_columns(tiny_chroma: Any, tiny: Any, toma: Any) -> None:
    """The text mask reaches every merged attention T + D square, with the text queries' rows and
    the text keys' columns as unpatched (the image rows and columns, zero here, stay zero)."""
    pos, neg = chroma_conditioning(chroma_text_mask())
    plain_model, plain = compat_support.record_attention(tiny_chroma, lambda batch, q, k, mask: mask)
    merged_model, merged = compat_support.record_attention(patch(toma, tiny_chroma, blocks="all", tile_size=4), lambda batch, q, k, mask: mask)
    tiny.sample(plain_model, FLUX_LATENT, positive=pos, negative=neg, steps=1, cfg=1.0)
    tiny.sample(merged_model, FLUX_LATENT, positive=pos, negative=neg, steps=1, cfg=1.0)
    t, d = CHROMA_TEXT, CHROMA_TEXT + 32
    assert len(merged) == len(plain) == 4
    for p_mask, m_mask in zip(plain, merged):
        assert p_mask.shape[-2:] == (t + 64, t + 64) and m_mask.shape[-2:] == (d, d)
        assert torch.equal(m_mask[..., :t, :t], p_mask[..., :t, :t])
        assert torch.equal(m_mask[..., t:, :t], p_mask[..., t:d, :t])  # every image query: the same text columns
        assert torch.equal(m_mask[..., :t, t:], p_mask[..., :t, t:d])
        assert (p_mask[..., :t, 10:14] < 0).all() and (p_mask[..., t:, 10:14] == 0).all()


def test_chroma_text_mask_under_keys_values(tiny_chroma: Any, tiny: Any, toma: Any) -> None:
    """Scope keys_values: the text mask reaches every merged attention with all T + N query rows and
    T + D key columns: the text columns as unpatched, each image column one of the unpatched
    image columns (its destination's; image keys 0-7 hidden from the text queries here)."""
    mask = chroma_text_mask()
    mask[:, :CHROMA_TEXT, CHROMA_TEXT:CHROMA_TEXT + 8] = -10000.0
    pos, neg = chroma_conditioning(mask)
    plain_model, plain = compat_support.record_attention(tiny_chroma, lambda batch, q, k, mask: mask)
    settings = {"blocks": "all", "tile_size": 4, "scope": "keys_values"}
    merged_model, merged = compat_support.record_attention(patch(toma, tiny_chroma, **settings), lambda batch, q, k, mask: mask)
    tiny.sample(plain_model, FLUX_LATENT, positive=pos, negative=neg, steps=1, cfg=1.0)
    out = tiny.sample(merged_model, FLUX_LATENT, positive=pos, negative=neg, steps=1, cfg=1.0)
    t, n = CHROMA_TEXT, 64
    assert len(merged) == len(plain) == 4 and torch.isfinite(out).all()
    for p_mask, m_mask in zip(plain, merged):
        assert p_mask.shape[-2:] == (t + n, t + n) and m_mask.shape[-2:] == (t + n, t + 32)
        assert torch.equal(m_mask[..., :t], p_mask[..., :t].expand_as(m_mask[..., :t]))
        columns = p_mask[0].reshape(-1, t + n)[:, t:].T
        assert all(any(torch.equal(c, p) for p in columns) for c in m_mask[0].reshape(-1, t + 32)[:, t:].T)
        assert (m_mask[..., :t, t:] < 0).any() and (m_mask[..., :t, t:] == 0).any()


def test_proportional_attention_biases_merged_keys_by_cluster_size(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    """Each merged key's logit gets log(cluster size): text keys 0, image keys' exp sum to N."""
    zero = patch(toma, tiny_flux, 0.0, blocks="all", proportional_attention=True)
    assert torch.equal(tiny.sample(zero, FLUX_LATENT, steps=2), tiny.sample(tiny_flux, FLUX_LATENT, steps=2))
    recorded, calls = compat_support.record_attention(
        patch(toma, tiny_flux, 0.5, blocks="all", proportional_attention=True), lambda batch, q, k, mask: (k, mask),
    )
    out = tiny.sample(recorded, FLUX_LATENT, steps=2, cfg=1.0)
    n = (FLUX_LATENT[2] // 2) * (FLUX_LATENT[3] // 2)
    assert calls and all(length == TEXT + n // 2 for length, _ in calls)
    for length, mask in calls:
        assert mask is not None and mask.shape == (1, 1, 1, length)
        assert torch.equal(mask[..., :TEXT], torch.zeros_like(mask[..., :TEXT]))
        torch.testing.assert_close(mask[..., TEXT:].float().exp().sum(), torch.tensor(float(n)))
        assert float(mask[..., TEXT:].max()) > 0, "some merged token stands for more than one token"
    plain = tiny.sample(patch(toma, tiny_flux, 0.5, blocks="all"), FLUX_LATENT, steps=2, cfg=1.0)
    assert rel(out, plain) > 1e-4


def tiny_flux_controlnet(tiny: Any) -> Any:
    """An XLabs-style ControlNetFlux with the tiny Flux's config and random weights, as
    comfy.controlnet.load_controlnet_flux_xlabs_mistoline wraps it (hint image at 8x the latent)."""
    import comfy.controlnet
    import comfy.ldm.flux.controlnet
    import comfy.model_management as mm
    import comfy.ops

    config = {k: v for k, v in tiny.tree_config(tiny.tiny_flux_config()).items() if k != "image_model"}
    net = comfy.ldm.flux.controlnet.ControlNetFlux(operations=comfy.ops.disable_weight_init, **config)
    tiny.init_weights(net, seed=21)
    return comfy.controlnet.ControlNet(net, load_device=mm.get_torch_device(), extra_conds=["y", "guidance"])


def test_flux_controlnet_residuals_reach_merged_blocks(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    """ControlNet residuals are added to all N image tokens after each block."""
    control = tiny_flux_controlnet(tiny)
    hint = torch.rand((1, 3, FLUX_LATENT[2] * 8, FLUX_LATENT[3] * 8), generator=torch.Generator().manual_seed(1))

    def conditioning(strength: float) -> list:
        ((ctx, extras),) = tiny.make_conditioning(tiny_flux, 1234)
        return [[ctx, dict(extras, control=control.copy().set_cond_hint(hint, strength), control_apply_to_uncond=False)]]

    n = (FLUX_LATENT[2] // 2) * (FLUX_LATENT[3] // 2)
    plain = tiny.sample(tiny_flux, FLUX_LATENT, positive=conditioning(1.0), steps=2)
    zero = tiny.sample(patch(toma, tiny_flux, 0.0, blocks="all"), FLUX_LATENT, positive=conditioning(1.0), steps=2)
    assert torch.equal(zero, plain)
    recorded, calls = compat_support.record_attention(patch(toma, tiny_flux, 0.5, blocks="all"))
    strong = tiny.sample(recorded, FLUX_LATENT, positive=conditioning(1.0), steps=2)
    weak = tiny.sample(patch(toma, tiny_flux, 0.5, blocks="all"), FLUX_LATENT, positive=conditioning(0.0), steps=2)
    assert torch.isfinite(strong).all() and rel(strong, weak) > 1e-4 and rel(strong, plain) > 1e-4
    assert calls and {k for _, _, k in calls} == {TEXT + n // 2}, "every main-model block ran merged"


def test_ratio_zero_says_nothing_merged_and_a_real_run_says_what_it_gained(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Ratio 0 used to log "256->256 tokens | merged 4/4 steps ... 16 block runs merged"."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    tiny.sample(patch(toma, tiny_flux, 0.0, blocks="all"), FLUX_LATENT, steps=4)
    zero = run_records(caplog)[-1]
    assert zero.tokens == {} and (zero.steps_merged, zero.total_steps) == (0, 4) and zero.block_runs_merged == 0, zero
    assert zero.unmerged_calls.get("ratio 0 (nothing to merge)") == 4 and zero.gain is None, zero
    tiny.sample(patch(toma, tiny_flux, 0.5, 0.5, blocks="all"), FLUX_LATENT, steps=4)
    run = run_records(caplog)[-1]
    assert run.total_steps == 4 and 0 < run.steps_merged < 4, run  # merged and unmerged calls to compare
    assert run.gain is not None and run.gain.measured, run  # merged calls measured against unmerged ones
