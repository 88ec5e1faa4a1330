"""Scope keys_values beside what else hooks attention, in real ComfyUI on tiny models:

- an attention function chosen for the model (ComfyUI 0.33's ModelPatcher.set_model_optimized_attention,
  what its "ModelAttentionBackend" node calls, or an optimized_attention_override a pack puts in the
  model's transformer_options) keeps running in ToMA's merged blocks, in either node order, and
  receives the merged keys and values;
- ComfyUI 0.33's experimental Flux KV Cache node (comfy_extras/nodes_flux.py FluxKVCache: the
  reference images' keys cached on the first call, then stripped from the image and appended by an
  attn1 patch) on a tiny Flux.2 Klein with two reference latents, ToMA before and after it: every
  block merges, the output is finite, and the cached reference keys reach the attention unmerged
  (scope block reads the same layout).

The node, the method and the KV cache are new in ComfyUI 0.33: on 0.3.64 those tests skip naming what is missing. TorchCompileModel
with scope keys_values: tests/integration/test_compat_compile.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import RUNTIME_LOGGER, patch, run_records  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402
from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402

KV = {"scope": "keys_values", "blocks": "all", "tile_size": 4}
ORDERS = ["toma_first", "toma_last"]


def require_selection() -> None:
    import comfy.model_patcher

    if not hasattr(comfy.model_patcher.ModelPatcher, "set_model_optimized_attention"):
        pytest.skip("ComfyUI 0.3.64 has no ModelPatcher.set_model_optimized_attention (it came with ComfyUI 0.33)")


def with_chosen_attention(model: Any, calls: list, how: str) -> Any:
    """A clone whose attention is a chosen function: ComfyUI's SDPA attention, recording each call's
    (query length, key length, head size) first; put there by ModelPatcher.set_model_optimized_attention
    or, as a pack would on ComfyUI 0.3.64, as transformer_options["optimized_attention_override"]."""
    from comfy.ldm.modules.attention import attention_pytorch

    def chosen(q, k, v, heads, *args, **kwargs):
        heads_first = kwargs.get("skip_reshape")
        tokens = 2 if heads_first else 1
        calls.append((q.shape[tokens], k.shape[tokens], q.shape[-1] if heads_first else q.shape[-1] // heads))
        kwargs.pop("transformer_options", None)
        return attention_pytorch(q, k, v, heads, *args, **kwargs)

    clone = model.clone()
    if how == "set_model_optimized_attention":
        require_selection()
        clone.set_model_optimized_attention(chosen)
    else:
        clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = lambda func, *a, **kw: chosen(*a, **kw)
    return clone


@pytest.mark.parametrize("how", ["set_model_optimized_attention", "transformer_options"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", ["tiny_flux", "tiny_sdxl"])
def test_chosen_attention_runs_on_the_merged_keys(
    name: str, order: str, how: str, tiny: Any, toma: Any, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture,
) -> None:
    """Every attention call still reaches the chosen function; in the merged blocks it gets all the
    queries and fewer keys at the model's own head size (a function ToMA does not know never gets
    the log-mass channel's wider head: toma_core/keys_values.py choose_form): on Flux's joint
    attention the plain form, ToMA's keys_values without the mass, up to the kernels' rounding; on
    the UNet's image-only attn1 the equal-mass form (the run line names it)."""
    model = request.getfixturevalue(name)
    latent = FLUX_LATENT if name == "tiny_flux" else UNET_LATENT
    plain_calls: list = []
    tiny.sample(with_chosen_attention(model, plain_calls, how), latent, steps=1, cfg=1.0)
    calls: list = []
    if order == "toma_first":
        chained = with_chosen_attention(patch(toma, model, **KV), calls, how)
    else:
        chained = patch(toma, with_chosen_attention(model, calls, how), **KV)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    out = tiny.sample(chained, latent, steps=1, cfg=1.0)
    run = run_records(caplog)[-1]
    merged = [(p, c) for p, c in zip(plain_calls, calls) if c[1] < p[1]]
    assert len(calls) == len(plain_calls) and run.block_runs_merged == len(merged) > 0, run
    assert all(c[0] == p[0] and c[2] == p[2] for p, c in merged)
    assert torch.isfinite(out).all()
    form = "plain" if name == "tiny_flux" else "equal_mass"
    assert run.attention and all(what.endswith(f" as {form}") for what in run.attention), run
    if name == "tiny_flux":
        alone = tiny.sample(patch(toma, model, **KV, key_mass=False), latent, steps=1, cfg=1.0)
        assert rel(out, alone) < 1e-4


@pytest.mark.parametrize("order", ORDERS)
def test_attention_backend_node_in_either_order(tiny_flux: Any, tiny: Any, toma: Any, order: str, caplog: pytest.LogCaptureFixture) -> None:
    """ComfyUI 0.33's ModelAttentionBackend node ("pytorch attention") before or after ToMA: every
    block merges and the output is ToMA's alone, up to the kernels' rounding."""
    require_selection()
    from comfy_extras.nodes_model_advanced import ModelAttentionBackend

    def backend(model: Any) -> Any:
        return ModelAttentionBackend().patch(model, "pytorch attention")[0]

    chained = backend(patch(toma, tiny_flux, **KV)) if order == "toma_first" else patch(toma, backend(tiny_flux), **KV)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    out = tiny.sample(chained, FLUX_LATENT, steps=2, cfg=1.0)
    run = run_records(caplog)[-1]
    assert run.block_runs_merged == 2 * 4 and run.unmerged_blocks == {}, run
    assert rel(out, tiny.sample(patch(toma, tiny_flux, **KV), FLUX_LATENT, steps=2, cfg=1.0)) < 1e-4


TEXT = 512
"""Text rows of the tiny Flux.2: comfy.model_base.Flux2 left-pads the prompt to 512."""
REFS = 4 * 6 + 6 * 4
"""Reference tokens of the two reference latents (4 x 6 and 6 x 4 tokens at patch 1)."""
LATENT = (1, 128, 8, 8)
"""An 8 x 8 token grid: N = 64, D = 32."""


def kv_cache(model: Any) -> Any:
    from comfy_extras import nodes_flux

    node = getattr(nodes_flux, "FluxKVCache", None)
    if node is None:
        pytest.skip("ComfyUI 0.3.64 has no comfy_extras.nodes_flux.FluxKVCache (the Flux KV Cache node came with ComfyUI 0.33)")
    return node.execute(model).result[0]


@pytest.fixture(scope="module")
def klein(tiny: Any) -> Any:
    return fc.require(tiny_dits.build_flux2(seed=1, guidance_embed=False), "Flux2")


def reference_conditioning() -> tuple[list, list]:
    pos = tiny_dits.conditioning("flux2", 1, 12)
    gen = torch.Generator().manual_seed(3)
    pos[0][1]["reference_latents"] = [torch.randn((1, 128, h, w), generator=gen) for h, w in ((4, 6), (6, 4))]
    return pos, tiny_dits.conditioning("flux2", 2, 12)


def kernel_inputs(tiny: Any, model: Any) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
    """(q, k, v) as (B, L, H, e) of every attention call of a 2-step, cfg-1 run (the first call fills
    the cache, the second reads it), and the output."""
    calls: list = []

    def recorder(func, q, k, v, heads, *args, **kwargs):
        calls.append(tuple(t.transpose(1, 2).detach().clone() for t in (q, k, v)))
        return func(q, k, v, heads, *args, **kwargs)

    recorder.hands_on = True  # it hands every call on to ComfyUI's function (nodes/machinery/kernel_choice.py)
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = recorder
    pos, neg = reference_conditioning()
    out = tiny.sample(clone, LATENT, steps=2, cfg=1.0, positive=pos, negative=neg)
    return calls, out


@pytest.mark.parametrize("order", ORDERS)
def test_flux_kv_cache_references_stay_unmerged(klein: Any, tiny: Any, toma: Any, order: str, caplog: pytest.LogCaptureFixture) -> None:
    """Flux KV Cache with ToMA keys_values on Klein (2 double + 2 single blocks, 2 calls): every block
    run merges; the first call's attention holds the image and its references ([txt; img; ref]
    queries, T + D + R keys), the cached calls' the text and image alone as queries and the R cached
    reference keys after the D merged ones, with no log-mass; at the first block of the cached call
    they are the unpatched cache's keys and values exactly (keys
    scaled by sqrt(e'/e), toma_core/keys_values.py). The output is finite and merged."""
    plain_cache = kv_cache(klein)
    chained = patch(toma, plain_cache, **KV) if order == "toma_last" else kv_cache(patch(toma, klein, **KV))
    plain, base = kernel_inputs(tiny, plain_cache)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    merged, out = kernel_inputs(tiny, chained)
    run = run_records(caplog)[-1]
    assert run.block_runs_merged == 2 * 4 and run.unmerged_blocks == run.unmerged_calls == {}, run
    assert torch.isfinite(out).all() and rel(out, base) > 1e-4
    assert len(plain) == len(merged) == 2 * 4
    for i, ((q_p, k_p, v_p), (q_m, k_m, v_m)) in enumerate(zip(plain, merged)):
        cached = i >= 4
        e, e_pad = q_p.shape[-1], q_m.shape[-1]
        assert q_m.shape[1] == q_p.shape[1] == TEXT + 64 + (0 if cached else REFS)
        assert k_p.shape[1] == TEXT + 64 + REFS and k_m.shape[1] == TEXT + 32 + REFS
        assert torch.equal(k_m[:, -REFS:, :, e], torch.zeros_like(k_m[:, -REFS:, :, e]))
        if i == 4:  # double block 0 of the cached call: the cache the first call filled, before any merged block
            torch.testing.assert_close(k_m[:, -REFS:, :, :e] / (e_pad / e) ** 0.5, k_p[:, -REFS:], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(v_m[:, -REFS:, :, :e], v_p[:, -REFS:], rtol=1e-5, atol=1e-6)


def test_flux_kv_cache_under_scope_block(klein: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Scope block reads the same cached-reference layout: every block run merges (the image's
    queries too), and at the first block of the cached call the R cached reference keys come after
    the T + D merged sequence's, exactly the unpatched cache's."""
    plain_cache = kv_cache(klein)
    plain, base = kernel_inputs(tiny, plain_cache)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    merged, out = kernel_inputs(tiny, patch(toma, plain_cache, blocks="all", tile_size=4))
    run = run_records(caplog)[-1]
    assert run.block_runs_merged == 2 * 4 and run.unmerged_blocks == run.unmerged_calls == {}, run
    assert torch.isfinite(out).all() and rel(out, base) > 1e-4
    assert [(m[0].shape[1], m[1].shape[1]) for m in merged] == [(TEXT + 32 + REFS,) * 2] * 4 + [(TEXT + 32, TEXT + 32 + REFS)] * 4
    (_, k_p, v_p), (_, k_m, v_m) = plain[4], merged[4]
    torch.testing.assert_close(k_m[:, -REFS:], k_p[:, -REFS:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v_m[:, -REFS:], v_p[:, -REFS:], rtol=1e-5, atol=1e-6)
