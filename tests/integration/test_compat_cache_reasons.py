"""What the run line says when ToMA merges nothing under a step cache's own forward loop: the real
TeaCache and MagCache packs (harness/third_party.py) on a tiny Flux and a tiny Wan, in both node orders.

Their Flux and Wan loops (``forward_orig`` set on the model instance by ``patch.multiple`` for the time
of each call) call ToMA's block hooks, but their ``block_wrap`` runs the block without the
transformer_options ToMA hands it. Scope block merges the tokens around the block and needs none of
them; scope keys_values carries its attention patch in them, so no block merges: every such block run
is counted under keys_values.NOT_HANDED, every computed call as "with no block merged", every skipped
call as "with no block run", each call naming the loop's function and module, and no gain is stated.

Both packs import ``precompute_freqs_cis`` from ``comfy.ldm.lightricks.model``, which ComfyUI 0.33 no
longer has: there these tests skip with that error (they run on 0.3.64).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import RUNTIME_LOGGER, Toma, run_records, runs_for, warnings_of  # noqa: E402

from harness import comfy_env  # noqa: E402
from harness import third_party as tp  # noqa: E402
from harness.pack import pack_module  # noqa: E402
from harness.tiny_models import FLUX_LATENT  # noqa: E402

STEPS = 6
FLUX_BLOCKS = 4
WAN_BLOCKS = 3
WAN_LATENT = (1, 16, 3, 8, 8)
KV_LOGGER = "comfyui_toma_pack.nodes.machinery.keys_values"


IMPORT_BREAK = "cannot import name 'precompute_freqs_cis' from 'comfy.ldm.lightricks.model'"
"""The one import error of both packs' snapshots on ComfyUI 0.33 (test_compat_real_packs.py BREAKS)."""


def pack_nodes(pack: str) -> Any:
    """The pack's nodes.py; skips naming the error where it cannot import on this ComfyUI for the known
    reason (IMPORT_BREAK); any other import error fails the test."""
    try:
        return tp.pack_module(pack, "nodes")
    except ImportError as exc:
        if IMPORT_BREAK not in str(exc):
            raise
        root = comfy_env.find_comfy_root()
        version = comfy_env.comfy_version(root) if root else "unknown"
        pytest.skip(f"{pack} ({tp.pack_dir(pack)}) does not import on ComfyUI {version}: {exc}")


def cache(pack: str, family: str) -> Any:
    """The pack's node as model -> model (thresholds of test_compat_real_packs.py: both skip steps here)."""
    nodes = pack_nodes(pack)
    if pack == tp.TEACACHE:
        kind, thresh = ("flux", 10.0) if family == "flux" else ("wan2.1_t2v_1.3B", 0.3)
        return lambda model: nodes.TeaCache().apply_teacache(model, kind, thresh, 0.0, 1.0, "cpu")[0]
    kind, thresh = ("flux", 0.3) if family == "flux" else ("wan2.1_t2v_1.3B", 0.2)
    return lambda model: nodes.MagCache().apply_magcache(model, kind, thresh, 0.2, 4, 0, -1)[0]


@pytest.fixture()
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    return caplog


def sampler(family: str, tiny: Any, tiny_flux: Any) -> tuple[Any, Any, int]:
    """(model, sample(model) -> latent, blocks per call) of the family's tiny model."""
    if family == "flux":
        return tiny_flux, lambda m: tiny.sample(m, FLUX_LATENT, steps=STEPS), FLUX_BLOCKS
    from harness import tiny_wan

    model = tiny_wan.build_wan("t2v")
    cond = tiny_wan.conditioning(model, 1, WAN_LATENT)
    return model, lambda m: tiny.sample(m, WAN_LATENT, steps=STEPS, positive=cond, negative=cond, cfg=1.0), WAN_BLOCKS


@pytest.mark.parametrize("order", ["pack_first", "toma_first"])
@pytest.mark.parametrize("pack", [tp.TEACACHE, tp.MAGCACHE])
@pytest.mark.parametrize("family", ["flux", "wan"])
def test_keys_values_under_a_cache_loop_says_why(family: str, pack: str, order: str, tiny: Any, tiny_flux: Any, toma: Toma,
                                                  logs: pytest.LogCaptureFixture) -> None:
    """No block merges, no gain is stated, the output is the pack's alone, and the line says why."""
    apply = cache(pack, family)
    model, sample, blocks = sampler(family, tiny, tiny_flux)
    kv = pack_module("nodes.machinery.keys_values")
    kv._WARNED.clear()  # warned once per process: this run must warn
    patched = toma.patch(apply(model), scope="keys_values") if order == "pack_first" else apply(toma.patch(model, scope="keys_values"))
    out = sample(patched)
    run = run_records(logs)[-1]

    computed = runs_for(run.unmerged_calls, "with no block merged")
    skipped = runs_for(run.unmerged_calls, "with no block run")
    assert (run.calls_merged, run.steps_merged, run.block_runs_merged, run.gain) == (0, 0, 0, None), run
    assert computed > 0 and computed + skipped == run.total_calls == STEPS, run
    assert run.unmerged_blocks == {kv.NOT_HANDED.reason: blocks * computed}, run
    module = pack_nodes(pack).__name__
    assert all("the model's forward_orig is " in why and f" from {module})" in why for why in run.unmerged_calls), run
    assert any("scope block merges under such a loop" in w for w in warnings_of(logs, KV_LOGGER))
    assert torch.equal(out, sample(apply(model)))  # every block ran as unpatched: ToMA had no effect


@pytest.mark.parametrize("pack", [tp.TEACACHE, tp.MAGCACHE])
def test_block_scope_under_a_cache_loop_names_it_for_skipped_calls(pack: str, tiny: Any, tiny_flux: Any, toma: Toma,
                                                                   logs: pytest.LogCaptureFixture) -> None:
    """Scope block merges every call the cache computes; the calls it skips name its loop."""
    apply = cache(pack, "flux")
    sample(tiny, toma.patch(apply(tiny_flux), scope="block"))
    run = run_records(logs)[-1]
    skipped = {why: n for why, n in run.unmerged_calls.items() if "with no block run" in why}
    assert run.calls_merged > 0 and run.block_runs_merged == FLUX_BLOCKS * run.calls_merged, run
    assert sum(skipped.values()) == STEPS - run.calls_merged > 0, run
    assert all(f"from {pack_nodes(pack).__name__})" in why for why in skipped), run


def sample(tiny: Any, model: Any) -> Any:
    return tiny.sample(model, FLUX_LATENT, steps=STEPS)
