"""ToMA under ComfyUI 0.33's MultiGPU CFG Split, on the CPU with two devices.

MultiGPU CFG Split (comfy/multigpu.py `create_multigpu_deepclones`, what the node runs) gives every
extra device its own model, loaded afresh by the loader's factory (`cached_patcher_init`), and
each sampling step sends the cond and uncond calls to different devices, each run in a
comfy/multigpu.py `MultiGPUThreadPool` worker thread (comfy/samplers.py
`_calc_cond_batch_multigpu`). The devices come from comfy.model_management
`get_all_torch_devices`; on this CPU-only machine the test, and only the test, makes it return two
CPU devices ("cpu" and "cpu:0", distinct keys for ComfyUI's device dicts), and gives the tiny
model the factory a core loader would register.

Compared with the same model sampled on one device (same seed and conditioning): the latents agree
to float noise (relative to what ToMA changes against the unpatched latent); each worker thread ran
its own device's model (forward pre-hooks on the blocks' layers tell which model's layers ran in
which thread) on merged tokens (the layers' inputs have the run line's kept counts D, not N); the
one run line counts both devices' calls and block runs once (each device ran the single-device
run's block runs; calls of batch 1 instead of one of batch 2).

Select Model Device (comfy_extras/nodes_multigpu.py) on another device than the model's also loads
a fresh model through the factory (`ModelPatcher.deepclone_multigpu`), which copies ToMA's object
patches, bound to the input model's blocks, and fires ON_DEEPCLONE_MULTIGPU only: with ToMA
before it, the new model's blocks must still run on its own layers (which model's layers ran, and
the latent of ToMA on an independently loaded model). ComfyUI before 0.33 (0.3.64) has neither
node: the tests skip there.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
log = logging.getLogger(__name__)

from compat_support import FLUX_TEXT, RUNTIME_LOGGER, run_records, sample_with_noise  # noqa: E402

from harness.pack import pack_module  # noqa: E402
from harness import tiny_dits, tiny_models  # noqa: E402
from harness.tiny_models import FLUX_LATENT, UNET_LATENT  # noqa: E402

STEPS = 4
SECOND_DEVICE = ("cpu", 0)
"""The test's second device: a CPU device that ComfyUI's device dicts keep apart from "cpu"."""

PROBES = {"sdxl": (("attn1.to_q",), 0), "flux": (("img_mlp.0", "linear1"), FLUX_TEXT)}
"""Per family, the layers called once per block run with the block's image tokens as input rows,
and the text tokens some of them also get (a Flux single block's linear1: T + N rows)."""

BUILDERS = {"sdxl": ("build_sdxl", UNET_LATENT), "flux": ("build_flux", FLUX_LATENT)}


@pytest.fixture
def two_devices(comfy: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """ComfyUI sees two devices (this test only); every model loaded on them is unloaded after."""
    if importlib.util.find_spec("comfy.multigpu") is None:
        pytest.skip("this ComfyUI has no MultiGPU CFG Split (comfy/multigpu.py, ComfyUI 0.33 and later)")
    import comfy.model_management as mm

    devices = [mm.get_torch_device(), torch.device(*SECOND_DEVICE)]
    monkeypatch.setattr(mm, "get_all_torch_devices", lambda exclude_current=False: list(devices))
    try:
        yield devices
    finally:
        mm.unload_all_models()


def loadable(tiny: Any, family: str) -> tuple[Any, tuple[int, ...]]:
    """A fresh tiny model with the reload factory ComfyUI's core loaders register, and its latent."""
    name, latent = BUILDERS[family]
    build = getattr(tiny, name)
    model = build(seed=0)
    model.cached_patcher_init = (build, (0,))
    return model, latent


def split(model: Any) -> Any:
    """What the MultiGPU CFG Split node returns for `model` (max_gpus 2)."""
    import comfy.multigpu

    return comfy.multigpu.create_multigpu_deepclones(model, 2, reuse_loaded=True)


class Probe:
    """Forward pre-hooks on the probe layers of each model: per (model, thread), the block runs and
    the input row counts seen."""

    def __init__(self, family: str) -> None:
        self.suffixes, self.text = PROBES[family]
        self.runs: Counter = Counter()
        self.rows: dict[tuple[str, str], set[int]] = {}
        self._lock = threading.Lock()

    def watch(self, name: str, model: Any) -> None:
        for path, module in model.model.diffusion_model.named_modules():
            if path.endswith(self.suffixes):
                module.register_forward_pre_hook(lambda _m, args, name=name: self._seen(name, args[0]))

    def _seen(self, name: str, x: torch.Tensor) -> None:
        key = (name, threading.current_thread().name)
        with self._lock:
            self.runs[key] += 1
            self.rows.setdefault(key, set()).add(int(x.shape[-2]))


@pytest.mark.parametrize("toma_first", [True, False], ids=["toma-then-split", "split-then-toma"])
@pytest.mark.parametrize("family", ["sdxl", "flux"])
def test_each_device_merges_its_own_calls(
    family: str, toma_first: bool, two_devices: list[Any], tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """SDXL (ToMA object-patches its blocks' forwards) and Flux (dit replace keys), with the ToMA node
    before or after MultiGPU CFG Split: each device's model merges its own calls; the run line
    counts each device's calls once; the latent is the single-device run's."""
    import comfy.sample

    base, latent = loadable(tiny, family)
    single = toma.patch(base)
    multi = split(single) if toma_first else toma.patch(split(base))
    clones = multi.get_additional_models_with_key("multigpu")
    assert [c.load_device for c in clones] == two_devices[1:] and clones[0].model is not base.model
    probe = Probe(family)
    probe.watch("main", base)
    probe.watch("clone", clones[0])
    noise = comfy.sample.prepare_noise(torch.zeros(latent), 0)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    plain = sample_with_noise(tiny, base, noise, STEPS)
    one = sample_with_noise(tiny, single, noise, STEPS)
    alone = Counter(probe.runs)
    two = sample_with_noise(tiny, multi, noise, STEPS)
    ran = probe.runs - alone
    one_run, two_run = run_records(caplog)

    effect = (one - plain).abs().mean().item()
    drift = (two - one).abs().mean().item()
    log.info("%s: two devices vs one: mean |diff| %.3g, %.2g%% of ToMA's effect (%.3g); block runs per thread %s; calls %d vs %d",
             family, drift, 100 * drift / effect, effect, dict(ran), two_run.total_calls, one_run.total_calls)
    assert effect > 0 and drift <= 0.02 * effect, (drift, effect)

    threads = {thread for _, thread in ran}
    assert len(threads) == 2 and threading.main_thread().name not in threads, ran
    assert {name for name, _ in ran} == {"main", "clone"} and len(ran) == 2, ran  # one model per thread
    kept = {d for _, d in one_run.tokens.values()}
    assert all(d < n for n, d in one_run.tokens.values())
    for key in ran:  # merged on both threads: every probed block run saw D image tokens
        assert kept <= probe.rows[key] <= kept | {probe.text + d for d in kept}, (key, probe.rows[key], kept)

    assert set(ran.values()) == {one_run.block_runs_merged} and two_run.block_runs_merged == sum(ran.values())
    assert (two_run.calls_merged, two_run.total_calls) == (2 * one_run.calls_merged, 2 * one_run.total_calls)
    assert (two_run.steps_merged, two_run.total_steps, two_run.tokens) == (STEPS, STEPS, one_run.tokens)
    assert two_run.plans_built == 2 * one_run.plans_built and not two_run.unmerged_calls and not two_run.unmerged_blocks
    assert not any(toma.current.live_state().values())


def test_a_call_that_runs_no_block_is_told_apart_while_another_device_merges(
    two_devices: list[Any], tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """A step cache's skip on one device (a DIFFUSION_MODEL wrapper that returns without running a
    block on the second device's model) while the first device's call runs its blocks at the same
    time (both wait for each other inside the model): the skipped calls are counted as such, not as
    merged because the other device's blocks ran meanwhile."""
    import comfy.patcher_extension
    import comfy.sample

    base, latent = loadable(tiny, "flux")
    multi = split(toma.patch(base))
    second = multi.get_additional_models_with_key("multigpu")[0].model.diffusion_model
    meet = threading.Barrier(2, timeout=60)

    def skip_on_second(executor: Any, *args: Any, **kwargs: Any) -> Any:
        meet.wait()  # both devices' calls are open
        out = torch.zeros_like(args[0]) if executor.class_obj is second else executor(*args, **kwargs)
        meet.wait()  # the first device's blocks ran before the second device's call ends
        return out

    multi.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_skip", skip_on_second)
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    sample_with_noise(tiny, multi, comfy.sample.prepare_noise(torch.zeros(latent), 0), STEPS)
    (run,) = run_records(caplog)
    idle = pack_module("nodes.run.wrappers").IDLE_CALL
    assert run.unmerged_calls == {idle: STEPS}, run
    assert (run.calls_merged, run.total_calls, run.block_runs_merged) == (STEPS, 2 * STEPS, STEPS * 4), run


SELECTED = {
    "sdxl": (tiny_models.build_sdxl, UNET_LATENT, None),
    "lumina2": (tiny_dits.build_lumina, (1, 16, 16, 16), lambda: (tiny_dits.conditioning("lumina2", 1), tiny_dits.conditioning("lumina2", 2))),
}
"""Per family whose ToMA hooks are object patches bound to block modules: builder, latent, and its
conditioning (None: tiny_models' random one)."""

FILE_SEED, MEMORY_SEED = 0, 1
"""The weights the factory loads (the loader's file) and the input model's: different, so the
latent tells whose layers ran."""


@pytest.fixture
def node_multigpu(comfy: Any) -> Any:
    """ComfyUI 0.33's comfy_extras/nodes_multigpu.py (skips on a ComfyUI without it)."""
    if importlib.util.find_spec("comfy_extras.nodes_multigpu") is None:
        pytest.skip("this ComfyUI has no Select Model Device (comfy_extras/nodes_multigpu.py, ComfyUI 0.33 and later)")
    return importlib.import_module("comfy_extras.nodes_multigpu")


def select_model_device(node_multigpu: Any, model: Any, device: Any) -> Any:
    """What Select Model Device (`SelectModelDeviceNode.execute`) returns for a GPU other than the
    model's: the node's own steps for that choice, in its order. The node itself takes any device of
    type "cpu" for its "cpu" choice (no new model), so the test runs its GPU path directly."""
    model = model.clone()
    node_multigpu._remember_base_devices(model)
    model = node_multigpu._retarget_patcher(model, device, model.model._select_base_offload_device)
    node_multigpu._force_supported_compute_dtype(model, device)
    node_multigpu._prune_multigpu_collision(model, model.load_device)
    return model


def layers_reached(patched: Any, models: dict[str, Any]) -> tuple[Counter, list[Any]]:
    """Forward pre-hooks on the Linear layers inside the blocks `patched` object-patches, in each
    named model: the counter of calls per model name (filled as they run), and the hook handles."""
    paths = [key.removeprefix("diffusion_model.").removesuffix(".forward") for key in patched.object_patches if key.endswith(".forward")]
    assert paths, "no block forward is object-patched"
    reached: Counter = Counter()
    handles = []
    for name, model in models.items():
        dm = model.model.diffusion_model
        for path in paths:
            for layer in dm.get_submodule(path).modules():
                if isinstance(layer, torch.nn.Linear):
                    handles.append(layer.register_forward_pre_hook(lambda *_, name=name: reached.update([name])))
    return reached, handles


@pytest.mark.parametrize("toma_first", [True, False], ids=["toma-then-select", "select-then-toma"])
@pytest.mark.parametrize("family", list(SELECTED))
def test_select_model_device_runs_its_own_model(family: str, toma_first: bool, node_multigpu: Any, two_devices: list[Any], tiny: Any, toma: Any) -> None:
    """ToMA Patch before or after Select Model Device (another device): the selected model is a fresh
    load, and its ToMA-patched blocks run its own layers, never the input model's; its latent is
    ToMA's on an independently loaded model (the factory's weights differ from the input model's)."""
    build, latent, make_conds = SELECTED[family]
    base = build(MEMORY_SEED)
    base.cached_patcher_init = (build, (FILE_SEED,))
    selected = select_model_device(node_multigpu, toma.patch(base), two_devices[1]) if toma_first else toma.patch(select_model_device(node_multigpu, base, two_devices[1]))
    assert selected.load_device == two_devices[1] and selected.model is not base.model
    pos, neg = make_conds() if make_conds else (None, None)
    reached, handles = layers_reached(selected, {"input": base, "selected": selected})
    try:
        out = tiny.sample(selected, latent, positive=pos, negative=neg, steps=2)
    finally:
        for handle in handles:
            handle.remove()
    assert reached["selected"] > 0 and reached["input"] == 0, dict(reached)
    reference = tiny.sample(toma.patch(build(FILE_SEED)), latent, positive=pos, negative=neg, steps=2)
    plain = tiny.sample(build(FILE_SEED), latent, positive=pos, negative=neg, steps=2)
    assert not torch.equal(reference, plain)  # ToMA changed the latent
    assert torch.equal(out, reference)
