"""The cost model's prediction for a merged model call beside the measured merged-vs-unmerged call
ratio, on the CPU shapes the tests and fixtures run (tests/integration/test_cost_accuracy.py,
bench/speed/cost_accuracy.py).

A shape's model is patched at the ToMA Patch node's defaults (ratio, tile, tile frames, blocks
"auto"), with the scope asked for ("auto": the family's, as the node), every call eligible
(start_percent 0, min_tokens 0: merging forced) and merge_every 2, so
that one sampling run alternates merged and unmerged calls of one shape: merged and unmerged repeats
are interleaved, and a load on the shared machine hits both alike. Each call is timed on this
thread's CPU clock (time.thread_time: waiting for a core does not count; torch on one thread runs its
ops in this thread) by an APPLY_MODEL wrapper inside the pack's own, which reads the call's
CallContext (merged or not, its geometry, batch). The first merged and unmerged call of each run are
warm-up and dropped. Before each run Python's garbage is collected and the live objects frozen
(gc.freeze), so that a full collection, which would walk every object of ComfyUI and torch, cannot
land inside a timed call; glibc's allocator thresholds are pinned (`pin_allocator`).

Measured ratio: median unmerged over median merged call time. Its uncertainty: the median's notch
(McGill, Tukey and Larsen 1978: +-1.57 IQR / sqrt(n), about a 95 % interval) of both medians, added
relatively. `measure` runs more sampling runs until that uncertainty is within `settle` of the ratio
or the CPU budget is spent.

Import only after ComfyUI is on sys.path (comfy_env.import_comfy).
"""

from __future__ import annotations

import ctypes
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .pack import pack_module

WRAPPER_KEY = "toma_call_ratio"


@dataclass
class Calls:
    """CPU seconds of a patched model's merged and unmerged calls, and the first merged call's
    (tokens, others, batch) (nodes/contract.py CallGeometry)."""

    merged: list[float] = field(default_factory=list)
    unmerged: list[float] = field(default_factory=list)
    shape: tuple[int, int, int] | None = None
    runs: list[float] = field(default_factory=list)
    _run: list[tuple[bool, float]] = field(default_factory=list)

    def end_run(self) -> None:
        """Keep the run's calls but the first of each kind (warm-up), and the run's own ratio (`runs`)."""
        seen: set[bool] = set()
        kept: dict[bool, list[float]] = {True: [], False: []}
        for merged, seconds in self._run:
            if merged in seen:
                kept[merged].append(seconds)
            seen.add(merged)
        self.merged += kept[True]
        self.unmerged += kept[False]
        if kept[True] and kept[False]:
            self.runs.append(statistics.median(kept[False]) / statistics.median(kept[True]))
        self._run.clear()


@dataclass(frozen=True)
class Accuracy:
    """One shape: the prediction with the range the model's error leaves it in (low, high), the measured
    ratio with its relative uncertainty, the calls timed and their median ms."""

    name: str
    scope: str
    shape: tuple[int, int, int]
    predicted: float
    low: float
    high: float
    measured: float
    uncertainty: float
    calls: int
    merged_ms: float
    unmerged_ms: float
    runs: tuple[float, ...] = ()

    @property
    def error(self) -> float:
        """Relative error of the prediction against the measurement."""
        return self.predicted / self.measured - 1.0


def timing_wrapper(calls: Calls) -> Callable:
    """An APPLY_MODEL wrapper (inside ToMA's) recording each call's thread CPU time, merged or not."""
    current = pack_module("nodes.run.current")

    def wrapper(executor: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = current.find_call({})
        start = time.thread_time()
        out = executor(*args, **kwargs)
        seconds = time.thread_time() - start
        if ctx is None:
            raise RuntimeError("no ToMA call context inside the APPLY_MODEL wrapper: the wrapper order changed")
        merged = ctx.merge and ctx.merged_blocks > 0
        if merged and calls.shape is None:
            calls.shape = (ctx.geometry.tokens, ctx.geometry.others, ctx.batch)
        calls._run.append((merged, seconds))
        return out

    return wrapper


def patch_alternating(base: Any, scope: str = "auto") -> Any:
    """`base` patched at the ToMA Patch node's defaults with `scope`, every call eligible and every
    other step merged (module docstring)."""
    import comfy.patcher_extension

    nodes, patching = pack_module("nodes.node.toma_nodes"), pack_module("nodes.node.patching")
    defaults = {i.id: i.default for i in nodes.ToMAPatch.define_schema().inputs if i.id != "model"}
    inputs = defaults | {"start_percent": 0.0, "end_percent": 1.0, "merge_every": 2}
    settings = nodes.build_settings(**inputs, min_tokens=0, scope=scope)
    patched = patching.patch_model(base, settings)
    calls = Calls()
    patched.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, WRAPPER_KEY, timing_wrapper(calls))
    patched.toma_calls = calls
    return patched


def cost_profile(patched: Any) -> Any:
    """The patched model's CostProfile (nodes/run/prediction.py)."""
    key = pack_module("nodes.settings").TOMA_KEY
    return patched.model_options["transformer_options"][key].config.cost


def median_notch(values: list[float]) -> float:
    """Relative half-width of the median's notch, 1.57 IQR / sqrt(n) / median."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return 1.57 * (q3 - q1) / math.sqrt(len(values)) / statistics.median(values)


def pin_allocator() -> None:
    """Fix glibc malloc's mmap and trim thresholds (mallopt; no-op elsewhere) for the rest of the
    process. Left dynamic, the mmap threshold rises with the sizes freed, so whether a call's
    megabyte-sized tensors are fresh, page-faulting mmaps or reused heap depends on the process's
    history: on the tiny Flux, unmerged calls took 24 ms in one run and 45 ms in the next, merged
    ones 27 ms in both. Pinned, every call of a shape allocates alike and runs are reproducible."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    for option in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD):
        mallopt(option, PINNED_THRESHOLD)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's mallopt options (malloc.h)."""

PINNED_THRESHOLD = 1 << 28
"""256 MiB: tensors below it come from the heap, which keeps what calls free."""


def measure(
    name: str, base: Any, run: Callable[[Any], Any], scope: str = "auto", settle: float = 0.04,
    budget_s: float = 12.0, min_runs: int = 2, pin: bool = True,
) -> Accuracy:
    """Prediction and measurement of `base`'s calls at `scope`: `run(patched)` samples once; more
    runs until the measured ratio's uncertainty is within `settle` or `budget_s` CPU seconds pass.
    pin: pin the allocator first (pin_allocator; False measures the process as it is)."""
    if pin:
        pin_allocator()
    patched = patch_alternating(base, scope)
    calls: Calls = patched.toma_calls
    start, runs = time.thread_time(), 0
    while True:
        gc.collect()
        gc.freeze()  # later collections skip every object alive now (ComfyUI, torch, the model)
        try:
            run(patched)
        finally:
            gc.unfreeze()
        calls.end_run()
        runs += 1
        enough = runs >= min_runs and len(calls.merged) >= 4 and len(calls.unmerged) >= 4
        if enough and (uncertainty(calls) <= settle or time.thread_time() - start > budget_s):
            break
    tokens, others, batch = calls.shape
    profile = cost_profile(patched)
    merged_scope = next(b.scope for b in profile.blocks if b.merged)
    merged, unmerged = statistics.median(calls.merged), statistics.median(calls.unmerged)
    prediction = profile.predict(tokens, others, "cpu", batch)
    return Accuracy(name, merged_scope, calls.shape, prediction.speedup, prediction.low, prediction.high, unmerged / merged,
                    uncertainty(calls), len(calls.merged) + len(calls.unmerged), merged * 1000, unmerged * 1000, tuple(calls.runs))


def uncertainty(calls: Calls) -> float:
    """Relative uncertainty of the measured ratio: both medians' notches, added."""
    return median_notch(calls.merged) + median_notch(calls.unmerged)


def shape_setup(name: str) -> tuple[Any, Callable[[Any], Any]]:
    """(unpatched ModelPatcher, run) of a SHAPES entry; run(model) samples it once (STEPS steps, euler / simple)."""
    from . import tiny_models, tiny_wan, trained_video

    if name == "wan_fixture":
        base, latent, cfg = trained_video.load_model(), trained_video.latent_shape(), 1.0
        positive, negative = trained_video.conditioning()
    elif name == "wan_shaped":
        base, latent, cfg = tiny_wan.build_wan("t2v", **tiny_wan.WAN_SHAPED), tiny_wan.WAN_SHAPED_LATENT, 1.0
        positive = negative = tiny_wan.conditioning(base, 1, latent)
    elif name in ("flux", "sdxl"):
        base = tiny_models.build_flux(seed=0) if name == "flux" else tiny_models.build_sdxl(seed=0)
        latent, cfg = tiny_models.FLUX_LATENT if name == "flux" else tiny_models.UNET_LATENT, 2.0
        positive, negative = tiny_models.make_conditioning(base, 1), tiny_models.make_conditioning(base, 2)
    else:
        raise ValueError(f"shape={name!r} is not one of {', '.join(SHAPES)}")

    def run(model: Any) -> Any:
        return tiny_models.sample(model, latent, steps=STEPS[name], cfg=cfg, positive=positive, negative=negative)

    return base, run


SHAPES = {
    "wan_fixture": "the trained Wan fixture (harness/trained_video.py): width 64, 6 blocks, 9 x 16 x 16 = 2,304 tokens, cfg 1",
    "wan_shaped": "the Wan-shaped model (harness/tiny_wan.py WAN_SHAPED): width 256, 4 blocks, 7 x 12 x 20 = 1,680 tokens, cfg 1",
    "flux": "the tiny test Flux (harness/tiny_models.py): width 64, 2 + 2 blocks, 8 x 8 = 64 tokens, 256 text, cfg 2 (batch 2)",
    "sdxl": "the tiny test SDXL (harness/tiny_models.py): 32 channels, 16 x 16 latent, cfg 2 (batch 2)",
}
"""The shapes the tests and fixtures run on CPU."""

STEPS = {"wan_fixture": 10, "wan_shaped": 6, "flux": 20, "sdxl": 20}
"""Sampling steps of one run of each shape: half merged, half not (merge_every 2)."""
