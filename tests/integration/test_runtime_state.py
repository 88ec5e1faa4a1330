"""ToMA's runtime leaves nothing behind (nodes/run/current.py `live_state`): two samplers in two threads
at once each merge with their own settings, and a run stopped by an interrupt or by an exception
inside a block ends with no open run, no open model call and no fallback context.

Each run's result is compared bit for bit with the same run made alone, so a thread that used the
other's settings, plans or counters would show; its one-line run summary must carry its own
settings and token counts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import RUNTIME_LOGGER, patch, run_records, sample_with_noise  # noqa: E402

from harness.tiny_models import FLUX_LATENT  # noqa: E402

STEPS = 4
SETTINGS = {"a": dict(ratio=0.5, tile_size=4), "b": dict(ratio=0.75, tile_size=2)}
FACTS = {"a": ({(8, 8): (64, 32)}, "ratio 0.5, tile 4,"), "b": ({(8, 8): (64, 16)}, "ratio 0.75, tile 2,")}
"""What each run's summary line says: its token counts ((h, w) -> (N, D)) and its settings (their start)."""


def idle(toma: Any) -> bool:
    return not any(toma.current.live_state().values())


class Gate:
    """Replaces every Flux block hook of a model with one that empties transformer_options (as step
    caches do, so ToMA's hooks must use the per-thread fallback) and, once `barrier` is set, waits
    for the other thread inside every model call, so the two threads' calls are open at once.
    The hooks are closures, not bound methods: ModelPatcher.clone() deep-copies model_options,
    which would copy a bound method's instance."""

    def __init__(self, live_state: Callable[[], dict[str, int]]) -> None:
        self.barrier: threading.Barrier | None = None
        self.inside: list[dict[str, int]] = []
        self.live_state = live_state

    def install(self, model: Any) -> Any:
        def strip(args: dict, extra: dict) -> dict:
            # An empty transformer_options, not none: ComfyUI 0.33's Flux blocks read it unconditionally.
            return extra["original_block"](dict(args, transformer_options={}))

        def first(args: dict, extra: dict) -> dict:
            if self.barrier is not None:
                self.barrier.wait()
                self.inside.append(self.live_state())
                self.barrier.wait()
            return strip(args, extra)

        clone = model.clone()
        for i in range(2):
            clone.set_model_patch_replace(strip if i else first, "dit", "double_block", i)
            clone.set_model_patch_replace(strip, "dit", "single_block", i)
        return clone


def test_two_samplers_in_two_threads_keep_their_own_settings(
    tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """Two Flux models with different settings sample at once, their model calls overlapping, with
    block hooks that find their call through the fallback only: a process-wide fallback stack would
    hand one thread the other's call (its settings, its plans)."""
    import comfy.sample

    gates = {"a": Gate(toma.current.live_state), "b": Gate(toma.current.live_state)}
    bases = {"a": tiny_flux, "b": tiny.build_flux(seed=1)}
    models = {}
    for name, gate in gates.items():
        models[name] = patch(toma, gate.install(bases[name]), blocks="all", **SETTINGS[name])
    # Drawn here: comfy.sample.prepare_noise seeds torch's global generator, which two threads
    # drawing at once would share.
    noise = comfy.sample.prepare_noise(torch.zeros(FLUX_LATENT), 0)
    alone = {name: sample_with_noise(tiny, model, noise, STEPS) for name, model in models.items()}
    barrier = threading.Barrier(2, timeout=60)
    for gate in gates.values():
        gate.barrier = barrier
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            results[name] = sample_with_noise(tiny, models[name], noise, STEPS)
        except BaseException as error:  # reported by the main thread's assertion
            results[name] = error
            barrier.abort()

    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    threads = [threading.Thread(target=run, args=(name,)) for name in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    runs = run_records(caplog)
    for name, gate in gates.items():
        assert torch.is_tensor(results[name]) and torch.equal(results[name], alone[name]), (name, results[name])
        assert gate.inside == [{"runs": 2, "calls": 2, "thread_runs": 1, "thread_calls": 1}] * STEPS
        tokens, described = FACTS[name]
        mine = [record for record in runs if record.settings.startswith(described)]
        assert len(mine) == 1 and mine[0].tokens == tokens and (mine[0].steps_merged, mine[0].total_steps) == (STEPS, STEPS), runs
        assert mine[0].block_runs_merged == STEPS * 4 and "without transformer_options" not in mine[0].unmerged_blocks
    assert idle(toma)


def test_interrupt_mid_run_leaves_nothing(tiny_flux: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """ComfyUI's cancel: InterruptProcessingException raised from the sampler's step callback after
    step 1, where the server's progress hook (comfy.utils.PROGRESS_BAR_HOOK) raises it."""
    import comfy.model_management

    def cancel(i: int, *_: Any) -> None:
        if i == 1:
            raise comfy.model_management.InterruptProcessingException()

    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    with pytest.raises(comfy.model_management.InterruptProcessingException):
        tiny.sample(patch(toma, tiny_flux, blocks="all"), FLUX_LATENT, steps=STEPS, callback=cancel)
    assert idle(toma)
    assert run_records(caplog)[-1].status == "cancelled"  # so not "bypassed": a run has one status


def test_exception_inside_a_block_leaves_nothing(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    """An error raised inside a merged block (here by the attention of the 3rd block run) unwinds
    the model call and the run; the same model then samples as if it had never failed."""
    model = patch(toma, tiny_flux, blocks="all")
    reference = tiny.sample(model, FLUX_LATENT, steps=2)
    calls = []

    def failing(func: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("attention failed")
        return func(*args, **kwargs)

    broken = model.clone()
    broken.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = failing
    with pytest.raises(RuntimeError, match="attention failed"):
        tiny.sample(broken, FLUX_LATENT, steps=2)
    assert idle(toma)
    assert torch.equal(tiny.sample(model, FLUX_LATENT, steps=2), reference)
    assert idle(toma)
