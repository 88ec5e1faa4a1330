"""ToMA with the real code of the packs users combine it with (issue 13.3), on CPU.

The packs' sources come from ``../shared/third_party/`` (``third_party.py``: imported in place,
never copied). Each test runs the pack's own node function on a tiny Flux (or the full-width
GGUF file) in both node orders where the order matters, and checks three things: the run
completes, ToMA merges (its run line counts merged block runs), and the pack still acts (its
own effect is visible: skipped steps, cache hits, a compiled graph, a quantized model).

- TeaCache, MagCache: their ``forward_orig`` replacements call the dit replacements without
  ``transformer_options``; skipped steps never reach ToMA's blocks.
- WaveSpeed first-block cache: ``transformer_options`` arrives in ``extra``; the cache compares
  block 0's residual between steps, and merging block 0 changes that residual (fewer hits):
  measured here against ToMA with block 0 left unmerged.
- ComfyUI-GGUF: a full-width 1 double + 1 single block Flux quantized to Q8_0 with the ``gguf``
  package, loaded by the pack's ``UnetLoaderGGUF`` (its GGML ops dequantize on the fly).
- KJNodes: ``TorchCompileModelFluxAdvanced`` (per-block ``torch.compile`` object patches) and
  ``...V2`` (ComfyUI's compile wrapper), with a counting Dynamo backend instead of inductor
  (compiling with inductor takes minutes on CPU; the graphs Dynamo hands over are the same).

PuLID-Flux-ll stays a stand-in (``PulidLike`` in test_compat_caches.py): its module imports
insightface, OpenCV and facexlib at import time and its patch path needs a face-analysis model
and EVA-CLIP weights, none of which this CPU test machine has or may download.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import third_party as tp  # noqa: E402
from compat_support import RUNTIME_LOGGER, Toma, merged_block_runs, rel, run_lines  # noqa: E402
from tiny_models import FLUX_LATENT  # noqa: E402

FLUX_BLOCKS = 4
"""Tiny Flux: 2 double + 2 single blocks (all selected here)."""
STEPS = 6


@pytest.fixture()
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    return caplog


def in_both_orders(pack: Any, toma: Toma, model: Any, **toma_kwargs: Any) -> dict[str, Any]:
    return {"pack_first": toma.patch(pack(model), **toma_kwargs), "toma_first": pack(toma.patch(model, **toma_kwargs))}


def computed_steps(line: str, blocks: int = FLUX_BLOCKS) -> float:
    """Model calls that ran the blocks, from ToMA's count of merged block runs."""
    return merged_block_runs(line) / blocks


# --- TeaCache, MagCache ----------------------------------------------------------------------


def teacache(model: Any, thresh: float = 10.0) -> Any:
    node = tp.pack_module(tp.TEACACHE, "nodes").TeaCache()
    return node.apply_teacache(model, "flux", thresh, 0.0, 1.0, "cpu")[0]


def magcache(model: Any, thresh: float = 0.3) -> Any:
    node = tp.pack_module(tp.MAGCACHE, "nodes").MagCache()
    # retention_ratio 0.2 (its default): int(0.2 * steps) >= 1 computes step 0 before any skip; at
    # fewer than 5 steps MagCache skips step 0 and fails on its own ('Flux' object has no
    # attribute 'residual_cache')
    return node.apply_magcache(model, "flux", thresh, 0.2, 4, 0, -1)[0]


@pytest.mark.parametrize("order", ["pack_first", "toma_first"])
@pytest.mark.parametrize("cache", ["TeaCache", "MagCache"])
def test_step_cache_pack(cache: str, order: str, tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    pack = {"TeaCache": teacache, "MagCache": magcache}[cache]
    model = in_both_orders(pack, toma, tiny_flux)[order]
    out = tiny.sample(model, FLUX_LATENT, steps=STEPS)
    line = run_lines(logs)[-1]
    ran = computed_steps(line)
    assert 0 < ran < STEPS and ran == int(ran), line  # ToMA merged every block of the steps that ran
    assert f"merged {ran:.0f}/{STEPS} steps" in line, line
    assert f"{STEPS - ran:.0f} calls with no block run" in line, line  # the steps the cache skipped
    assert rel(out, tiny.sample(toma.patch(tiny_flux), FLUX_LATENT, steps=STEPS)) > 1e-3  # the cache acted
    assert rel(out, tiny.sample(pack(tiny_flux), FLUX_LATENT, steps=STEPS)) > 1e-3  # ToMA acted


# --- WaveSpeed first-block cache -------------------------------------------------------------


class HitCounter:
    """Spy on WaveSpeed's own cache decision (``first_block_cache.get_can_use_cache``)."""

    def __init__(self, module: Any) -> None:
        self.module, self.real, self.decisions = module, module.get_can_use_cache, []

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        use = self.real(*args, **kwargs)
        self.decisions.append(bool(use))
        return use

    @property
    def hits(self) -> int:
        return sum(self.decisions)


@pytest.fixture()
def fbcache(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, HitCounter]:
    """(apply function, hit counter) for WaveSpeed's ApplyFBCacheOnModel on the diffusion model."""
    nodes = tp.pack_module(tp.WAVESPEED, "fbcache_nodes")
    cache = tp.pack_module(tp.WAVESPEED, "first_block_cache")
    counter = HitCounter(cache)
    monkeypatch.setattr(cache, "get_can_use_cache", counter)

    def apply(model: Any, threshold: float = FBCACHE_THRESHOLD) -> Any:
        return nodes.ApplyFBCacheOnModel().patch(model, "diffusion_model", threshold, -1, 0.0, 1.0)[0]

    return apply, counter


FBCACHE_THRESHOLD = 0.3
"""Measured on the tiny Flux over 6 steps: 2 hits alone, 2 with ToMA on every block, 2 with block 0
unmerged (0.5: 4/4/4, 1.2: 5/5/5); the fewer hits seen on a full-width Flux do not show here."""


@pytest.mark.parametrize("order", ["pack_first", "toma_first"])
def test_wavespeed_first_block_cache(order: str, fbcache: tuple, tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    apply, counter = fbcache
    alone = tiny.sample(apply(tiny_flux), FLUX_LATENT, steps=STEPS)
    alone_hits = counter.hits
    counter.decisions.clear()
    out = tiny.sample(in_both_orders(apply, toma, tiny_flux)[order], FLUX_LATENT, steps=STEPS)
    hits, line = counter.hits, run_lines(logs)[-1]
    log_hits = {"alone": alone_hits, "toma": hits}
    counter.decisions.clear()
    tiny.sample(in_both_orders(apply, toma, tiny_flux, blocks="double:1,single:0-1")[order], FLUX_LATENT, steps=STEPS)
    log_hits["toma, block 0 unmerged"] = counter.hits
    logging.getLogger(__name__).info("FBCache hits of %d steps: %s", STEPS, log_hits)

    assert 0 < alone_hits < STEPS and 0 < hits < STEPS, log_hits  # the cache hits with ToMA too
    # a hit runs block 0 only (through ToMA's hook, merged); a miss runs every block
    assert merged_block_runs(line) == FLUX_BLOCKS * (STEPS - hits) + hits, line
    assert rel(out, tiny.sample(toma.patch(tiny_flux), FLUX_LATENT, steps=STEPS)) > 1e-3  # the cache acted
    assert rel(out, alone) > 1e-3  # ToMA acted


# --- KJNodes' compile nodes ------------------------------------------------------------------


class CountingBackend:
    """A Dynamo backend that counts the graphs it is handed and runs them eagerly."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


def kjnodes_compile(version: str, model: Any, backend: CountingBackend) -> Any:
    nodes = tp.pack_module(tp.KJNODES, "nodes.model_optimization_nodes")
    if version == "V2":
        return nodes.TorchCompileModelFluxAdvancedV2().patch(model, backend, "default", False, True, True, False, 64)[0]
    return nodes.TorchCompileModelFluxAdvanced().patch(model, backend, "default", False, "0-1", "0-1", False, 64)[0]


@pytest.mark.parametrize("order", ["pack_first", "toma_first"])
@pytest.mark.parametrize("version", ["V1", "V2"])
def test_kjnodes_compiled_blocks(version: str, order: str, tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """Per-block torch.compile (V1: object patches made at node time; V2: ComfyUI's compile
    wrapper at sample time): ToMA's hooks wrap the compiled blocks, merged tokens go through them."""
    import torch._dynamo

    torch._dynamo.reset()
    backend = CountingBackend()
    model = in_both_orders(lambda m: kjnodes_compile(version, m, backend), toma, tiny_flux)[order]
    out = tiny.sample(model, FLUX_LATENT, steps=2)
    line = run_lines(logs)[-1]
    assert backend.graphs > 0  # the pack compiled the blocks
    assert merged_block_runs(line) == 2 * FLUX_BLOCKS and "unmerged: none" in line, line
    eager = tiny.sample(toma.patch(tiny_flux), FLUX_LATENT, steps=2)
    assert rel(out, eager) < 1e-5  # the same merged computation, compiled
    assert rel(out, tiny.sample(tiny_flux, FLUX_LATENT, steps=2)) > 1e-3  # ToMA acted


# --- ComfyUI-GGUF: a Q8_0 Flux through the pack's loader --------------------------------------


@pytest.fixture(scope="module")
def gguf_flux(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A full-width 1 double + 1 single block Flux in Q8_0, loaded by ``UnetLoaderGGUF``."""
    pytest.importorskip("gguf", reason="the gguf package (test extra) writes the Q8_0 file")
    import folder_paths
    import model_files

    nodes = tp.pack_module(tp.GGUF, "nodes")
    folder = tmp_path_factory.mktemp("gguf")
    path = model_files.flux_gguf_q8_0(folder / "toma_test_flux_q8_0.gguf")
    saved = folder_paths.folder_names_and_paths["diffusion_models"]
    folder_paths.add_model_folder_path("diffusion_models", str(folder))
    try:
        return nodes.UnetLoaderGGUF().load_unet(path.name)[0]
    finally:
        folder_paths.folder_names_and_paths["diffusion_models"] = saved


def test_gguf_q8_0_flux(gguf_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """The pack's GGML layers (quantized weights, dequantized per call) under ToMA's merged blocks."""
    linear = gguf_flux.model.diffusion_model.double_blocks[0].img_attn.qkv
    assert type(linear).__module__.startswith(tp.package_name(tp.GGUF))  # the pack's own op
    import gguf

    assert getattr(linear.weight, "tensor_type", None) == gguf.GGMLQuantizationType.Q8_0  # still quantized
    positive = tiny.make_conditioning(gguf_flux, 1234, text_len=32)
    kw = {"steps": 2, "cfg": 1.0, "positive": positive, "negative": positive}
    out = tiny.sample(toma.patch(gguf_flux), FLUX_LATENT, **kw)
    line = run_lines(logs)[-1]
    assert "64->32 tokens (8x8)" in line and merged_block_runs(line) == 2 * 2, line
    assert torch.isfinite(out).all()
    assert rel(out, tiny.sample(gguf_flux, FLUX_LATENT, **kw)) > 1e-3  # ToMA acted on the GGUF model
