"""ToMA with step caches and with other packs' forward loops.

Real ComfyUI nodes: EasyCache and LazyCache (comfy_extras/nodes_easycache.py) in both node orders,
on tiny Flux and tiny SDXL. The real third-party packs (TeaCache, MagCache, WaveSpeed FBCache,
ComfyUI-GGUF, KJNodes' compile nodes, PuLID-Flux-ll's patch path) run in test_compat_real_packs.py,
which replaced the stand-ins of their calling conventions that were here. A stand-in
remains only for a pack whose code cannot run here (no pack code is copied):

- ``ForeignLoop("ignores_replacements")``: balazik PuLID-Flux, or any loop that never consults
  ``patches_replace`` (that pack is not among ../shared/third_party, and its loop needs its face
  models): ToMA's hooks never run, which must be reported, not silent.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import (  # noqa: E402
    RUNTIME_LOGGER,
    Toma,
    run_records,
    runs_for,
    warnings_of,
    without_gain,
)

from harness.metrics import relative_error as rel  # noqa: E402
from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402

STEPS = 6
FLUX_BLOCKS = 4
"""Tiny Flux: 2 double + 2 single blocks (all selected in these tests)."""
SDXL_BLOCKS = 17
"""Tiny SDXL at a 16x16 latent: 17 BasicTransformerBlocks (all selected)."""


@pytest.fixture()
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """INFO from ToMA's runtime and from ComfyUI's root logger (EasyCache's summary line)."""
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    caplog.set_level(logging.INFO)
    return caplog


def cache_node(name: str, model: Any) -> Any:
    """EasyCache / LazyCache as the node runs it; threshold 1.0 from the first step so that
    the tiny models skip some of 6 steps (measured: 2 of 6 on Flux)."""
    from comfy_extras.nodes_easycache import EasyCacheNode, LazyCacheNode

    node = {"EasyCache": EasyCacheNode, "LazyCache": LazyCacheNode}[name]
    return node.execute(model, 1.0, 0.0, 1.0, False).result[0]


def skipped_steps(caplog: pytest.LogCaptureFixture, name: str) -> int:
    """Steps the cache skipped in the last run, from its own log line."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{name} - skipped")]
    return int(re.search(r"skipped (\d+)/", lines[-1])[1])


# --- EasyCache / LazyCache ------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["block", "keys_values"])
@pytest.mark.parametrize("cache", ["EasyCache", "LazyCache"])
@pytest.mark.parametrize("family", ["flux", "sdxl"])
def test_step_cache_in_both_orders(family: str, cache: str, scope: str, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture,
                                   request: pytest.FixtureRequest) -> None:
    """Both orders give the same result; skipped steps never reach ToMA's blocks, and the run
    line says how many steps really merged; the cache still skips with ToMA; both effects show.
    Both scopes: these caches skip whole calls and leave ComfyUI's own loop (and the
    transformer_options keys_values needs) to the calls they compute."""
    model = request.getfixturevalue(f"tiny_{family}")
    latent, per_call = (FLUX_LATENT, FLUX_BLOCKS) if family == "flux" else (UNET_LATENT, SDXL_BLOCKS)
    cache_first = toma.patch(cache_node(cache, model), scope=scope)
    toma_first = cache_node(cache, toma.patch(model, scope=scope))

    out = tiny.sample(cache_first, latent, steps=STEPS)
    skipped = skipped_steps(logs, cache)
    run = run_records(logs)[-1]
    assert 0 < skipped < STEPS
    assert run.block_runs_merged == per_call * (STEPS - skipped)  # cfg batch: one call per step
    assert (run.steps_merged, run.total_steps) == (STEPS - skipped, STEPS)
    if cache == "EasyCache":  # its skip happens inside our APPLY_MODEL call: reported, not hidden
        assert runs_for(run.unmerged_calls, "with no block run") == skipped

    assert torch.equal(tiny.sample(toma_first, latent, steps=STEPS), out)
    assert skipped_steps(logs, cache) == skipped and without_gain(run_records(logs)[-1]) == without_gain(run)
    assert torch.equal(tiny.sample(cache_first, latent, steps=STEPS), out)  # fresh state per run
    assert rel(out, tiny.sample(toma.patch(model, scope=scope), latent, steps=STEPS)) > 1e-3  # the cache acted
    assert rel(out, tiny.sample(cache_node(cache, model), latent, steps=STEPS)) > 1e-3  # ToMA acted


# --- foreign forward loops (caching packs' calling conventions) ------------------------------


class ForeignLoop:
    """A stand-in "other pack" that re-implements Flux's block loop the way caching packs do
    (the real TeaCache, MagCache and FBCache loops: test_compat_real_packs.py).

    Installed as a ``model_function_wrapper`` (the single slot TeaCache, MagCache and FBCache
    use); for each call it sets an instance ``forward_orig`` on the Flux module (their
    ``patch.multiple`` / ``patch.object``) that runs ComfyUI's loop with the dit replacements
    re-wrapped to the pack's calling convention (see the module docstring for the modes).
    """

    MODES = ("no_options", "options_in_extra", "ignores_replacements")

    def __init__(self, mode: str) -> None:
        assert mode in self.MODES
        self.mode = mode
        self.loops = 0
        self.img_tokens: list[int] = []

    def apply(self, model: Any) -> Any:
        clone = model.clone()
        # a plain function: ModelPatcher.clone() deep-copies model_options, and a bound method
        # would take a copy of this object (and of its counters) with it
        clone.set_model_unet_function_wrapper(lambda model_function, kwargs: self.unet_wrapper(model_function, kwargs))
        return clone

    def unet_wrapper(self, model_function: Any, kwargs: dict) -> torch.Tensor:
        dm = model_function.__self__.diffusion_model
        loop = type(dm).forward_orig

        def forward_orig(*args: Any, **kw: Any) -> torch.Tensor:
            args = list(args)
            if len(args) > 8:
                args[8] = self.convert(args[8])
            else:
                kw["transformer_options"] = self.convert(kw.get("transformer_options", {}))
            self.loops += 1
            return loop(dm, *args, **kw)

        dm.forward_orig = forward_orig
        try:
            return model_function(kwargs["input"], kwargs["timestep"], **kwargs["c"])
        finally:
            del dm.forward_orig

    def convert(self, options: dict) -> dict:
        replace = dict(options.get("patches_replace", {}))
        if self.mode == "ignores_replacements":
            replace.pop("dit", None)
        else:
            replace["dit"] = {key: self.foreign_call(fn, options) for key, fn in replace.get("dit", {}).items()}
        return dict(options, patches_replace=replace)

    def foreign_call(self, fn: Any, options: dict) -> Any:
        def call(args: dict, extra: dict) -> dict:
            self.img_tokens.append(args["img"].shape[1])
            original = extra["original_block"]
            foreign_extra = {"original_block": lambda a: original({k: v for k, v in a.items() if k != "transformer_options"})}
            if self.mode == "options_in_extra":
                foreign_extra["transformer_options"] = options
            return fn({k: v for k, v in args.items() if k != "transformer_options"}, foreign_extra)

        return call


def test_hook_without_any_call_state_runs_unmerged(tiny_flux: Any, toma: Toma) -> None:
    """A ToMA hook called outside any ToMA model call (no state in args, extra or the fallback)
    runs the real block on all tokens instead of failing."""
    hook = toma.patch(tiny_flux).model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)]
    seen: list[int] = []

    def original(args: dict) -> dict:
        seen.append(args["img"].shape[1])
        return {"img": args["img"] + 1, "txt": args["txt"]}

    img, txt = torch.zeros(1, 64, 64), torch.zeros(1, 8, 64)
    out = hook({"img": img, "txt": txt, "vec": None, "pe": None}, {"original_block": original})
    assert seen == [64] and torch.equal(out["img"], img + 1)


def test_loop_that_ignores_replacements_is_reported_flux(tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """balazik PuLID-style loop: ToMA cannot act; a warning and the run line say so."""
    pack = ForeignLoop("ignores_replacements")
    out = tiny.sample(toma.patch(pack.apply(tiny_flux)), FLUX_LATENT, steps=2)
    assert pack.loops == 2
    assert torch.equal(out, tiny.sample(pack.apply(tiny_flux), FLUX_LATENT, steps=2))  # no effect at all
    (warning,) = warnings_of(logs)
    assert "none of ToMA's block hooks ran" in warning
    run = run_records(logs)[0]
    assert run.block_runs_merged == 0 and run.status == "bypassed"


def test_loop_that_bypasses_object_patches_is_reported_sdxl(tiny_sdxl: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """A UNet loop that calls BasicTransformerBlock's class forward (not the module attribute)."""
    from comfy.ldm.modules.attention import BasicTransformerBlock

    def bypass(model_function: Any, kwargs: dict) -> torch.Tensor:
        blocks = [m for m in model_function.__self__.diffusion_model.modules() if isinstance(m, BasicTransformerBlock)]
        saved = [m.__dict__.pop("forward", None) for m in blocks]
        try:
            return model_function(kwargs["input"], kwargs["timestep"], **kwargs["c"])
        finally:
            for m, forward in zip(blocks, saved):
                if forward is not None:
                    m.forward = forward

    other = tiny_sdxl.clone()
    other.set_model_unet_function_wrapper(bypass)
    tiny.sample(toma.patch(other), UNET_LATENT, steps=2)
    (warning,) = warnings_of(logs)
    assert "none of ToMA's block hooks ran" in warning
    assert run_records(logs)[-1].status == "bypassed"


def test_run_that_raises_is_not_reported_as_a_bypass(tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """Another node crashing before any block ran (MagCache on a short run) is reported
    as a failed run, not as "another node replaced the model's forward loop"."""

    class Crash(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("another pack's own crash")

    other = tiny_flux.clone()
    other.add_object_patch("diffusion_model.img_in", Crash())  # inside the model call, before any block
    with pytest.raises(RuntimeError, match="another pack's own crash"):
        tiny.sample(toma.patch(other), FLUX_LATENT, steps=2)
    assert warnings_of(logs) == []
    assert run_records(logs)[-1].status == "failed"  # so not "bypassed": a run has one status


def test_cancelled_run_is_reported_as_cancelled(tiny_flux: Any, tiny: Any, toma: Toma, logs: pytest.LogCaptureFixture) -> None:
    """A run the user cancels (ComfyUI's /interrupt: the flag is checked in the step callback,
    as main.py's progress hook does) says so: not "bypassed", not an error; merged step 0 only."""
    import comfy.model_management as mm

    mm.interrupt_current_processing(True)
    try:
        with pytest.raises(mm.InterruptProcessingException):
            tiny.sample(toma.patch(tiny_flux), FLUX_LATENT, steps=4, callback=lambda *_: mm.throw_exception_if_processing_interrupted())
    finally:
        mm.interrupt_current_processing(False)
    assert warnings_of(logs) == []
    run = run_records(logs)[-1]
    assert run.status == "cancelled", run  # so neither "bypassed" nor "failed" (an error): a run has one status
    assert (run.steps_merged, run.total_steps) == (1, 4), run


def test_not_a_native_flux_module_is_refused(tiny_flux: Any, toma: Toma) -> None:
    """Nunchaku-style: the diffusion model swapped for a wrapper that only looks like Flux."""

    class FluxLookingWrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.double_blocks = torch.nn.ModuleList()
            self.single_blocks = torch.nn.ModuleList()

    other = tiny_flux.clone()
    other.add_object_patch("diffusion_model", FluxLookingWrapper())
    with pytest.raises(ValueError, match=r"FluxLookingWrapper; supported families: Flux"):
        toma.patch(other)
    with pytest.raises(ValueError, match=r"FluxLookingWrapper"):
        toma.nodes.ToMAPatch.execute(other, 0.5, 4, 0.0, 1.0, 1, 1)
