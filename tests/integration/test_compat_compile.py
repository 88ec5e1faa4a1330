"""ToMA under ComfyUI's TorchCompileModel, with a counting Dynamo backend.

TorchCompileModel compiles the whole ``diffusion_model`` (ToMA's block hooks included) and swaps
it in from an APPLY_MODEL wrapper. The backend here counts the graphs Dynamo hands it (one per
graph break or recompile) and returns ``gm.forward`` (no inductor: seconds, not minutes).
Attention goes through SDPA via ``optimized_attention_override`` on every model, compiled or
not: ComfyUI's CPU default (sub-quadratic attention) graph-breaks by itself.

Measured on tiny Flux and tiny SDXL, ComfyUI 0.3.64, torch 2.14 (CPU): without ToMA 1 graph and
0 breaks per run. With ToMA and a sigma window (merged and unmerged steps in one run): 2 graphs
(merged, unmerged), 0 breaks, nothing new in a second run; recompute_every > 1 or Heun add one
graph (a call that reuses the plan of an earlier call). Before toma_core and the runtime's plan
cache were made compile-clean: 31 graphs and 7 breaks (toma_core), then 3 + 2 graphs per run
(recompiles on the plan cache key: epoch, uuids, cache contents read inside the compiled region).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import (  # noqa: E402
    RUNTIME_LOGGER,
    CountingBackend,
    Toma,
    run_records,
    warnings_of,
)

from harness.metrics import relative_error as rel  # noqa: E402
from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402

STEPS = 3


def with_sdpa(model: Any) -> Any:
    """A clone whose attention runs through torch SDPA (graph-break-free on CPU)."""
    import comfy.ldm.modules.attention as attention

    def sdpa(func, q, k, v, heads, *args, **kwargs):
        kwargs.pop("transformer_options", None)
        kwargs.pop("_inside_attn_wrapper", None)
        return attention.attention_pytorch(q, k, v, heads, *args, **kwargs)

    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = sdpa
    return clone


def compiled_runs(model: Any, tiny: Any, runs: int = 1, latent: tuple[int, ...] | None = None, **sample_kwargs: Any) -> tuple[list[torch.Tensor], list[int], int]:
    """Sample `runs` times through TorchCompileModel; (outputs, new graphs per run, graph breaks)."""
    import torch._dynamo
    from comfy_extras.nodes_torch_compile import TorchCompileModel
    from torch._dynamo.utils import counters

    sample_kwargs.setdefault("steps", STEPS)
    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend()
    compiled = TorchCompileModel.execute(model, backend).result[0]
    outputs, graphs = [], []
    for _ in range(runs):
        before = backend.graphs
        outputs.append(tiny.sample(compiled, latent or FLUX_LATENT, **sample_kwargs))
        graphs.append(backend.graphs - before)
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    return outputs, graphs, breaks


@pytest.fixture(scope="module")
def plain_compiled(tiny_flux: Any, tiny: Any) -> tuple[list[torch.Tensor], list[int], int]:
    """The reference: the unpatched model compiled (the harness itself must be clean)."""
    return compiled_runs(with_sdpa(tiny_flux), tiny)


def test_counting_harness_without_toma(plain_compiled: tuple, tiny_flux: Any, tiny: Any) -> None:
    (out,), graphs, breaks = plain_compiled
    assert graphs == [1] and breaks == 0
    assert torch.allclose(out, tiny.sample(with_sdpa(tiny_flux), FLUX_LATENT, steps=STEPS), atol=1e-5)


def test_compiled_toma_equals_eager_and_reports_honestly(tiny_flux: Any, tiny: Any, toma: Toma, caplog: pytest.LogCaptureFixture) -> None:
    """ToMA -> TorchCompileModel runs, merges (differs from the unpatched model) and matches
    eager ToMA; the run line says block runs are not counted, and no false bypass warning."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    patched = toma.patch(with_sdpa(tiny_flux))
    (out,), _, _ = compiled_runs(patched, tiny)
    run = run_records(caplog)[-1]
    assert run.status == "compiled"  # block runs are not counted; a run has one status, so not "bypassed"
    assert not warnings_of(caplog)
    eager = tiny.sample(patched, FLUX_LATENT, steps=STEPS)
    assert rel(out, eager) < 1e-5
    assert rel(out, tiny.sample(with_sdpa(tiny_flux), FLUX_LATENT, steps=STEPS)) > 1e-3


WINDOW_STEPS = 4
"""With end_percent 0.5: merged steps (each its own selection epoch), then unmerged ones."""


def check_compile_clean(model: Any, tiny: Any, toma: Toma, caplog: pytest.LogCaptureFixture, latent: tuple[int, ...], plain: int, **settings: Any) -> None:
    """For one model: with a sigma window (merged and unmerged steps in one run)
    exactly the merged/unmerged pair of the unpatched graph count is compiled, with no graph
    break; a second run compiles nothing new. A recompile per step (a block reading the step,
    epoch or the run's plan cache) would add a graph in the first run (several merged epochs), one
    per run (uuids, a fresh RunState) in the second. Both compiled runs equal the eager run: the
    window is followed (ComfyUI 0.33's TorchCompileModel drops Dynamo's guards on
    transformer_options, so a merge decision read from there would freeze the first call's into the
    graph). Plans are still counted (by the eager wrapper after each call), the same as in an eager run."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    windowed = toma.patch(model, end=0.5, **settings)
    outputs, graphs, breaks = compiled_runs(windowed, tiny, runs=2, latent=latent, steps=WINDOW_STEPS)
    compiled_run = run_records(caplog)[-1]
    assert breaks == 0
    assert graphs == [2 * plain, 0], compiled_run
    assert compiled_run.total_steps == WINDOW_STEPS and 2 <= compiled_run.steps_merged < WINDOW_STEPS
    eager = tiny.sample(windowed, latent, steps=WINDOW_STEPS)
    eager_run = run_records(caplog)[-1]
    assert all(rel(out, eager) < 1e-5 for out in outputs), "the compiled runs follow the window as the eager run does"
    assert eager_run.status != "compiled"
    assert compiled_run.plans_built == eager_run.plans_built >= 2
    assert compiled_run.tokens and (compiled_run.family, compiled_run.tokens) == (eager_run.family, eager_run.tokens)


@pytest.mark.parametrize("budget, scope", [("tile", "block"), ("adaptive", "block"), ("tile", "keys_values")])
def test_compiled_toma_is_compile_clean(plain_compiled: tuple, tiny_flux: Any, tiny: Any, toma: Toma, caplog: pytest.LogCaptureFixture, budget: str, scope: str) -> None:
    """Scope keys_values too: its attention override (a fresh one per block run, in a copy of the
    block's transformer_options) compiles into the same two graphs."""
    _, plain_graphs, _ = plain_compiled
    check_compile_clean(with_sdpa(tiny_flux), tiny, toma, caplog, FLUX_LATENT, plain_graphs[0], budget=budget, scope=scope)


@pytest.fixture(scope="module")
def plain_sdxl_graphs(tiny_sdxl: Any, tiny: Any) -> int:
    """Graphs of the unpatched tiny SDXL compiled (one, no break: the harness is clean for UNets too)."""
    _, graphs, breaks = compiled_runs(with_sdpa(tiny_sdxl), tiny, latent=UNET_LATENT)
    assert graphs == [1] and breaks == 0
    return graphs[0]


@pytest.mark.parametrize("scope", ["block", "attention", "keys_values"])
def test_compiled_toma_is_compile_clean_sdxl(plain_sdxl_graphs: int, tiny_sdxl: Any, tiny: Any, toma: Toma, caplog: pytest.LogCaptureFixture, scope: str) -> None:
    """The same for the UNet family: object-patched BasicTransformerBlock forwards (scope block, or
    keys_values with attn1's keys merged) or attn1/attn2 patches (scope attention), one plan per level."""
    check_compile_clean(with_sdpa(tiny_sdxl), tiny, toma, caplog, UNET_LATENT, plain_sdxl_graphs, scope=scope)


def test_compiled_plan_reuse_adds_one_graph(tiny_flux: Any, tiny: Any, toma: Toma) -> None:
    """recompute_every=2 with Heun (two calls per step, plans reused across calls and steps): the
    calls that reuse an earlier call's plan are a third graph (they skip building it), and that is
    all — the same three in every step and run."""
    windowed = toma.patch(with_sdpa(tiny_flux), end=0.5, every=2)
    _, graphs, breaks = compiled_runs(windowed, tiny, runs=2, steps=WINDOW_STEPS, sampler_name="heun")
    assert breaks == 0
    assert graphs == [3, 0]


def test_compiled_merge_every_follows_eager(plain_compiled: tuple, tiny_flux: Any, tiny: Any, toma: Toma) -> None:
    """merge_every 2 (merged, unmerged, merged, ... steps): the compiled runs equal the eager run,
    which differs from merging every step."""
    every_other = toma.patch(with_sdpa(tiny_flux), every=2)
    outputs, _, breaks = compiled_runs(every_other, tiny, runs=2, steps=WINDOW_STEPS)
    eager = tiny.sample(every_other, FLUX_LATENT, steps=WINDOW_STEPS)
    assert breaks == 0
    assert all(rel(out, eager) < 1e-5 for out in outputs)
    assert rel(eager, tiny.sample(toma.patch(with_sdpa(tiny_flux)), FLUX_LATENT, steps=WINDOW_STEPS)) > 1e-4
