"""ToMA under ComfyUI's TorchCompileModel (issue 7 point 5), with a counting Dynamo backend.

TorchCompileModel compiles the whole ``diffusion_model`` (ToMA's block hooks included) and swaps
it in from an APPLY_MODEL wrapper. The backend here counts the graphs Dynamo hands it (one per
graph break or recompile) and returns ``gm.forward`` (no inductor: seconds, not minutes).
Attention goes through SDPA via ``optimized_attention_override`` on every model, compiled or
not: ComfyUI's CPU default (sub-quadratic attention) graph-breaks by itself.

Measured on tiny Flux, ComfyUI 0.3.64, torch 2.14 (CPU): without ToMA 1 graph and 0 breaks per
run; with ToMA 31 graphs in the first 4-step run. The compile-clean requirement is kept as a
strict xfail until the core and runtime are compile-clean (see its reason).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import RUNTIME_LOGGER, Toma, rel, run_lines, warnings_of  # noqa: E402
from tiny_models import FLUX_LATENT  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def toma(comfy: Any) -> Toma:
    return Toma()


class CountingBackend:
    """A Dynamo backend that counts compiled graphs and runs them eagerly."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


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


def compiled_runs(model: Any, tiny: Any, runs: int = 1) -> tuple[list[torch.Tensor], list[int], int]:
    """Sample `runs` times through TorchCompileModel; (outputs, new graphs per run, graph breaks)."""
    import torch._dynamo
    from comfy_extras.nodes_torch_compile import TorchCompileModel
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend()
    compiled = TorchCompileModel.execute(model, backend).result[0]
    outputs, graphs = [], []
    for _ in range(runs):
        before = backend.graphs
        outputs.append(tiny.sample(compiled, FLUX_LATENT, steps=STEPS))
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
    line = run_lines(caplog)[-1]
    assert "torch.compile: block runs are not counted" in line and "bypassed" not in line
    assert not warnings_of(caplog)
    eager = tiny.sample(patched, FLUX_LATENT, steps=STEPS)
    assert rel(out, eager) < 1e-5
    assert rel(out, tiny.sample(with_sdpa(tiny_flux), FLUX_LATENT, steps=STEPS)) > 1e-3


@pytest.mark.xfail(
    strict=True,
    reason="not compile-clean yet (measured 31 graphs vs 1, 4-step run): graph breaks in toma_core "
    "(TileGrid cached_property takes an RLock; bool()/.item() on tensors in tiling.py) and "
    "recompiles on the plan cache key (CallContext.epoch and uuids read inside the compiled "
    "region, runtime.CallContext.plan). See /work/notes/compat_requests.md.",
)
def test_compiled_toma_is_compile_clean(plain_compiled: tuple, tiny_flux: Any, tiny: Any, toma: Toma) -> None:
    """Issue 7 point 5: with a sigma window (merged and unmerged steps in one run) the graphs are
    at most the merged/unmerged pair of the unpatched count, with no graph break; a second run
    compiles nothing new."""
    _, plain_graphs, _ = plain_compiled
    windowed = toma.patch(with_sdpa(tiny_flux), end=0.5)
    _, graphs, breaks = compiled_runs(windowed, tiny, runs=2)
    assert breaks == 0
    assert graphs[0] <= 2 * plain_graphs[0]
    assert graphs[1] == 0
