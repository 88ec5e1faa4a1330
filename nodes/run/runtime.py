"""Per-run and per-call state of a ToMA patch (created by the wrappers in wrappers.py).

Lifetimes:
- `ToMAConfig` (settings + family adapter) is fixed when the node runs.
- `RunState` lives for one sampling run. The patched model holds a template at
  transformer_options[TOMA_KEY]; the OUTER_SAMPLE wrapper swaps in a fresh one for the run (the
  EasyCache pattern) and restores the options in `finally`. `__deepcopy__` returns a fresh,
  empty holder, so `ModelPatcher.clone()` never copies plans or counters into another clone.
- `CallContext` lives for one model call. The APPLY_MODEL wrapper builds it eagerly (step, merge
  on/off, epoch, token grid, text length, batch composition) and puts it at
  transformer_options[CALL_KEY] and on this thread's call stack (a ContextVar) for the
  duration of the call. APPLY_MODEL rather than DIFFUSION_MODEL: core TorchCompileModel compiles
  `diffusion_model` (DIFFUSION_MODEL wrappers included) and installs it from an APPLY_MODEL
  wrapper, so decisions made here stay eager and the blocks see only a ready context.
- The call stack and the run's orphan counter (current.py) are ContextVars set by the wrappers
  and reset in their `finally` (also on an interrupt or an error): nothing outlives a call or a
  run, and samplers in other threads never see them. `current.live_state` reports what is open now.
- One run's calls may run in several threads at once: ComfyUI 0.33's MultiGPU CFG Split
  (comfy/samplers.py `_calc_cond_batch_multigpu`) runs each device's calls in a
  comfy/multigpu.py `MultiGPUThreadPool` worker, all with this run's one RunState (the wrapper's
  transformer_options are merged into each call's by reference). So every read-modify-write of a
  RunState (counters, plan cache, the timer's reads) holds `RunState.lock`, and a call judges what its own
  blocks did by its CallContext's counts, never by the run's counters moving.

Block hooks find the context with `current.find_call(args, extra)`, ask it for the plan of their token
grid (`ctx.plan(...)`, every family's one plan builder, built once per key and reused) and report what they did
(`ctx.record_block(...)`, into the run's stats.RunStats). At the end of the run one `logging.info`
line summarises it (report.py).

Plan reuse across calls (recompute_every > 1, Heun's second evaluation, cond/uncond as separate
calls) is decided eagerly too: the wrapper hands each call a fresh `ctx.plans` dict, pre-filled
with the run's cached plans of the same batch composition and selection epoch, or empty when this
call must build them; after the call (in its `finally`) it moves newly built plans into the run's
cache (`RunState.keep_plans`). Inside the model the blocks read only `ctx.merge`, the geometry ints,
the settings and `ctx.plans`, whose guarded state under torch.compile is the same in every call of
a kind (empty, or the same keys): no recompile per step or per run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...toma_core import FACILITY, MergePlan, SigmaWindow, StepDecision, make_plan
from ...toma_core.video import Segment, make_video_plan
from ..contract import CallGeometry
from ..settings import ToMASettings
from .config import ToMAConfig
from .destinations import DestinationMemory
from .gain import CallKey, CallTimer
from .stats import RunStats

TORCH_COMPILE_KWARGS = "torch_compile_kwargs"
"""model_options key set by ComfyUI's set_torch_compile_wrapper (TorchCompileModel)."""


class RunState:
    """Per-run holder at transformer_options[TOMA_KEY]: schedule window, plan cache, counters."""

    def __init__(self, config: ToMAConfig) -> None:
        self.config = config
        self.window: SigmaWindow | None = None
        self.stats = RunStats()
        self.plans: dict[tuple, MergePlan] = {}
        self._sigma_source: Any = None
        self._sigma_list: list[float] = []
        self.timer = CallTimer()
        if config.settings.destinations != FACILITY:
            self.stats.plans_from_outputs = 0
        self.memory = DestinationMemory(self.stats)
        self.lock = threading.RLock()
        """Held where calls change the run: a call's decision (wrappers.py build_call: counters, the
        timer's finished calls), plans_for, keep_plans, record_block and a call's recount."""

    def __deepcopy__(self, memo: dict) -> RunState:
        return RunState(self.config)

    def fresh(self) -> RunState:
        return RunState(self.config)

    @property
    def running(self) -> bool:
        return self.window is not None

    def begin_run(self, percent_to_sigma: Callable[[float], float], sigmas: torch.Tensor | None) -> None:
        """Convert the percent window to sigmas once per run (split runs each get their own)."""
        schedule = self.config.settings.schedule
        self.window = schedule.window(percent_to_sigma)
        self.stats.total_steps = max(0, len(sigmas) - 1) if sigmas is not None else 0
        if sigmas is not None:
            sigma_list = [float(s) for s in sigmas]
            decisions = (schedule.decide(s, sigma_list, self.window) for s in sigma_list[:-1])
            self.stats.planned_steps = sum(d.merge for d in decisions)

    def predicted_speedup(self, key: CallKey) -> float:
        """The cost model's speed-up of a merged call of `key` (batch, image tokens, other tokens);
        1.0 without a cost profile."""
        cost = self.config.cost
        return cost.speedup(key[1], key[2], self.timer.device, key[0]) if cost is not None else 1.0

    def decide(self, transformer_options: dict, fallback_sigma: torch.Tensor) -> StepDecision | None:
        """The schedule's decision for this call, from the current sigma and this run's schedule."""
        sample_sigmas = transformer_options.get("sample_sigmas")
        if self.window is None or sample_sigmas is None:
            return None
        if sample_sigmas is not self._sigma_source:
            self._sigma_source = sample_sigmas
            self._sigma_list = [float(s) for s in sample_sigmas]
        sigmas = transformer_options.get("sigmas", fallback_sigma)
        sigma = float(sigmas.flatten()[0]) if torch.is_tensor(sigmas) else float(sigmas)
        return self.config.settings.schedule.decide(sigma, self._sigma_list, self.window)

    def plans_for(self, batch: int, composition: tuple, epoch: int) -> dict[tuple, MergePlan]:
        """The run's cached plans of one batch composition and selection epoch, by (slot, h, w)."""
        tail = (batch, composition, epoch)
        with self.lock:
            return {key[:3]: plan for key, plan in self.plans.items() if key[3:] == tail}

    def keep_plans(self, ctx: CallContext) -> None:
        """After a call (eagerly): move the plans its blocks built into the run's cache, keyed by
        (slot, h, w, B, composition, epoch), and count them. Entries of older epochs are dropped
        when a newer epoch brings its first plan."""
        epoch = ctx.epoch or 0
        with self.lock:
            built = [
                ((slot, h, w, ctx.batch, ctx.composition, epoch), plan)
                for (slot, h, w), plan in ctx.plans.items()
                if (slot, h, w, ctx.batch, ctx.composition, epoch) not in self.plans
            ]
            if not built:
                return
            for stale in [k for k in self.plans if k[-1] < epoch]:
                del self.plans[stale]
            for key, plan in built:
                self.plans[key] = plan
                self.stats.plans_built += 1
                self.stats.tokens[(key[1], key[2])] = (plan.num_tokens, plan.num_kept)


@dataclass
class CallContext:
    """Everything a block hook needs for one model call, decided eagerly before the call.

    merge: whether blocks of this call run on merged tokens. reason: why not, when not.
    geometry: token layout. batch: B (model batch). composition: (cond_or_uncond, uuids, device).
    plans: this call's plans by (slot, h, w), pre-filled with the run's plans when the call reuses
    them (same epoch and batch composition), else empty; blocks build missing ones into it.
    step, epoch and composition are for the wrapper and logs only: blocks never read them (under
    torch.compile every attribute a block reads is guarded; these change every step).
    block_runs / merged_blocks: this call's block runs and the merged ones among them (record_block).
    kernel: scope keys_values: (Kernel | None, name) of the attention kernel this call runs
    (ToMAConfig.kernel_reader), None when not read.
    """

    state: RunState
    merge: bool
    reason: str | None
    step: int
    epoch: int | None
    geometry: CallGeometry
    batch: int
    composition: tuple
    plans: dict[tuple, MergePlan] = field(default_factory=dict)
    noted: set = field(default_factory=set)
    """Plan keys whose planning block output this call has kept (note_output: the first block's only)."""
    kernel: tuple | None = None
    block_runs: int = 0
    merged_blocks: int = 0

    @property
    def settings(self) -> ToMASettings:
        return self.state.config.settings

    def plan(
        self, slot: Any, height: int, width: int, features: Callable[[], torch.Tensor],
        segments: tuple[Segment, ...] | None = None,
    ) -> MergePlan:
        """The merge plan of an h x w grid at `slot` (e.g. "flux", or a UNet level's grid), the one
        plan builder of every family.

        segments: the frame segments of a video grid (toma_core.video: each segment tiled on its own,
        t x h x w tiles inside it, pass-through segments kept), None for one h x w image.
        One per (slot, segments, h, w) in this call: every merged block of a forward at that grid
        shares it. Reuse across calls (same epoch and batch composition) comes pre-filled by the
        wrapper, and plans built here are kept for later calls by the wrapper after the call.
        features() -> (B, N, C) is called only when a plan is built.
        """
        s = self.settings
        key = (slot if segments is None else (slot, segments), height, width)
        plan = self.plans.get(key)
        if plan is None:
            options = {"similarity": s.similarity, "temperature": s.temperature, "budget": s.budget, "unmerge": s.unmerge}
            remembers = not compiling() and (s.destinations != FACILITY or s.destination_penalty > 0)
            if remembers:
                frames = 1 if segments is None else sum(segment.frames for segment in segments)
                inputs, more = self.state.memory.plan_inputs(
                    self._memory_key(key), s.destinations, s.destination_penalty, frames * height * width, features,
                )
                features, options = (lambda: inputs), options | more
            if segments is None:
                plan = make_plan(features(), height, width, s.ratio, s.tile_size, **options)
            else:
                plan = make_video_plan(features(), list(segments), height, width, s.ratio, s.tile_size, **options)
            if remembers and s.destination_penalty > 0:
                self.state.memory.count(self._memory_key(key), plan)
            self.plans[key] = plan
        return plan

    def _memory_key(self, key: tuple) -> tuple:
        return (key, self.batch, self.composition)

    def note_output(self, slot: Any, height: int, width: int, output: torch.Tensor,
                    segments: tuple[Segment, ...] | None = None) -> None:
        """Keep the image output (B, N, C) of the first block of this call that used the plan at
        (slot, segments, h, w), for "output_similarity" plans of the next call (run/destinations.py).
        Nothing under the facility rule or torch.compile."""
        if self.settings.destinations == FACILITY or compiling():
            return
        key = (slot if segments is None else (slot, segments), height, width)
        if key not in self.noted:
            self.noted.add(key)
            self.state.memory.note_output(self._memory_key(key), output)

    def note_attention(self, text: str) -> None:
        """Count one merged keys/values attention call by "<kernel> as <form>" (the run line's attention part)."""
        if compiling():
            return
        with self.state.lock:
            self.state.stats.attention[text] += 1

    def record_block(self, merged: bool, reason: str | None = None) -> None:
        """Count one block run (merged, or unmerged with a reason). No-op under torch.compile."""
        if compiling():
            return
        self.block_runs += 1
        self.merged_blocks += merged
        with self.state.lock:
            if merged:
                self.state.stats.block_runs_merged += 1
            else:
                self.state.stats.unmerged_blocks[reason or "unknown"] += 1


def compiling() -> bool:
    """True while torch.compile traces (blocks then count nothing)."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())
