"""Per-run and per-call state of a ToMA patch, and the wrappers that create it.

Lifetimes:
- `ToMAConfig` (settings + family adapter) is fixed when the node runs.
- `RunState` lives for one sampling run. The patched model holds a template at
  transformer_options[TOMA_KEY]; the OUTER_SAMPLE wrapper swaps in a fresh one for the run (the
  EasyCache pattern) and restores the options in `finally`. `__deepcopy__` returns a fresh,
  empty holder, so `ModelPatcher.clone()` never copies plans or counters into another clone.
- `CallContext` lives for one model call. The APPLY_MODEL wrapper builds it eagerly (step, merge
  on/off, epoch, token grid, text length, batch composition) and puts it at
  transformer_options[CALL_KEY] and on a module-level fallback stack for the duration of the call.
  APPLY_MODEL rather than DIFFUSION_MODEL: core TorchCompileModel compiles `diffusion_model`
  (DIFFUSION_MODEL wrappers included) and installs it from an APPLY_MODEL wrapper, so decisions
  made here stay eager and the blocks see only a ready context (issue 7 point 5).

Block hooks find the context with `find_call(args, extra)`, ask it for the plan of their token
grid (`ctx.plan(...)`, built once per key and reused) and report what they did
(`ctx.record_block(...)`). At the end of the run one `logging.info` line summarises it.

Plan reuse across calls (recompute_every > 1, Heun's second evaluation, cond/uncond as separate
calls) is decided eagerly too: the wrapper hands each call a fresh `ctx.plans` dict, pre-filled
with the run's cached plans of the same batch composition and selection epoch, or empty when this
call must build them; after the call (in its `finally`) it moves newly built plans into the run's
cache (`RunState.keep_plans`). Inside the model the blocks read only `ctx.merge`, the geometry ints,
the settings and `ctx.plans`, whose guarded state under torch.compile is the same in every call of
a kind (empty, or the same keys): no recompile per step or per run (issue 7 point 5).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..toma_core import MergePlan, SigmaWindow, StepDecision, make_plan
from .settings import CALL_KEY, TOMA_KEY, ToMASettings

TORCH_COMPILE_KWARGS = "torch_compile_kwargs"
"""model_options key set by ComfyUI's set_torch_compile_wrapper (TorchCompileModel)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallGeometry:
    """Token layout of one model call, as the family sees it from the model inputs.

    height x width: the image-token grid at the model's input resolution (Flux: after the 2x2
    patchify; UNet: the latent). text_len: T, or None when the call has no text context.
    extra_tokens: tokens that follow the image tokens (Kontext reference images).
    reason: when set, the whole call runs unmerged and the reason is counted.
    """

    height: int
    width: int
    text_len: int | None = None
    extra_tokens: int = 0
    reason: str | None = None

    @property
    def tokens(self) -> int:
        """N, image tokens of the main grid."""
        return self.height * self.width


class FamilyAdapter(Protocol):
    """What a model family's `apply(model, settings)` returns to the shared runtime."""

    family: str
    """Family name for logs: "flux", "unet", ..."""

    blocks: str
    """Canonical text of the selected blocks, for the log line."""

    num_blocks: int
    """How many blocks (Flux) or block groups (UNet) are selected."""

    def call_geometry(self, x: torch.Tensor, context: torch.Tensor | None, kwargs: dict[str, Any]) -> CallGeometry:
        """Geometry of a call from BaseModel.apply_model's inputs: x (B, C, H, W) noisy latent,
        context (B, T, C_txt) text conditioning, kwargs the extra conds (ref_latents, attention_mask, ...)."""
        ...


@dataclass(frozen=True)
class ToMAConfig:
    """Immutable description of one ToMA patch."""

    settings: ToMASettings
    adapter: FamilyAdapter


@dataclass
class RunStats:
    """Counters of one sampling run (kept eagerly; blocks add to them only outside torch.compile)."""

    total_steps: int = 0
    calls: int = 0
    merged_calls: int = 0
    steps_merged: set[int] = field(default_factory=set)
    block_runs_merged: int = 0
    plans_built: int = 0
    unmerged_calls: Counter = field(default_factory=Counter)
    unmerged_blocks: Counter = field(default_factory=Counter)
    tokens: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """(h, w) grid -> (N, D) for every plan built."""
    eligible_calls: int = 0
    """Calls decided "merge" before they ran (merged_calls drops those in which no block ran)."""
    merged_per_step: Counter = field(default_factory=Counter)
    compiled: bool = False
    """The model ran under torch.compile: blocks cannot count, so no per-block accounting."""
    failed: bool = False
    """The sampling run raised: its counts are partial, and a missing block run proves no bypass."""


class RunState:
    """Per-run holder at transformer_options[TOMA_KEY]: schedule window, plan cache, counters."""

    def __init__(self, config: ToMAConfig) -> None:
        self.config = config
        self.window: SigmaWindow | None = None
        self.stats = RunStats()
        self.plans: dict[tuple, MergePlan] = {}
        self._sigma_source: Any = None
        self._sigma_list: list[float] = []

    def __deepcopy__(self, memo: dict) -> RunState:
        return RunState(self.config)

    def fresh(self) -> RunState:
        return RunState(self.config)

    @property
    def running(self) -> bool:
        return self.window is not None

    def begin_run(self, percent_to_sigma: Callable[[float], float], sigmas: torch.Tensor | None) -> None:
        """Convert the percent window to sigmas once per run (split runs each get their own)."""
        self.window = self.config.settings.schedule.window(percent_to_sigma)
        self.stats.total_steps = max(0, len(sigmas) - 1) if sigmas is not None else 0

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
        return {key[:3]: plan for key, plan in self.plans.items() if key[3:] == tail}

    def keep_plans(self, ctx: CallContext) -> None:
        """After a call (eagerly): move the plans its blocks built into the run's cache, keyed by
        (slot, h, w, B, composition, epoch), and count them. Entries of older epochs are dropped
        when a newer epoch brings its first plan."""
        epoch = ctx.epoch or 0
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
            self.stats.tokens[(key[1], key[2])] = (key[1] * key[2], plan.num_kept)

    def report(self) -> str:
        """The one-line summary of the run."""
        return format_report(self.config, self.stats, orphan_blocks=0)


@dataclass
class CallContext:
    """Everything a block hook needs for one model call, decided eagerly before the call.

    merge: whether blocks of this call run on merged tokens. reason: why not, when not.
    geometry: token layout. batch: B (model batch). composition: (cond_or_uncond, uuids).
    plans: this call's plans by (slot, h, w), pre-filled with the run's plans when the call reuses
    them (same epoch and batch composition), else empty; blocks build missing ones into it.
    step, epoch and composition are for the wrapper and logs only: blocks never read them (under
    torch.compile every attribute a block reads is guarded; these change every step).
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

    @property
    def settings(self) -> ToMASettings:
        return self.state.config.settings

    def plan(self, slot: Any, height: int, width: int, features: Callable[[], torch.Tensor]) -> MergePlan:
        """The merge plan for an h x w grid at `slot` (e.g. "flux" or a UNet level).

        One per (slot, h, w) in this call: every merged block of a forward at that grid shares it.
        Reuse across calls (same epoch and batch composition) comes pre-filled by the wrapper, and
        plans built here are kept for later calls by the wrapper after the call. features() ->
        (B, h*w, C) is called only when a plan is built.
        """
        key = (slot, height, width)
        plan = self.plans.get(key)
        if plan is None:
            settings = self.settings
            plan = make_plan(
                features(), height, width, settings.ratio, settings.tile_size,
                similarity=settings.similarity, temperature=settings.temperature, budget=settings.budget,
                unmerge=settings.unmerge,
            )
            self.plans[key] = plan
        return plan

    def record_block(self, merged: bool, reason: str | None = None) -> None:
        """Count one block run (merged, or unmerged with a reason). No-op under torch.compile."""
        if _compiling():
            return
        if merged:
            self.state.stats.block_runs_merged += 1
        else:
            self.state.stats.unmerged_blocks[reason or "unknown"] += 1


_ACTIVE: list[CallContext] = []
"""Contexts of the model calls in progress (innermost last): the fallback for block hooks called
without transformer_options (TeaCache/MagCache-style forward loops)."""

_ORPHANS = Counter()
"""Block runs that found no CallContext at all, by reason (read as a difference per run)."""


def find_call(args: dict, extra: dict | None = None) -> CallContext | None:
    """The CallContext of the running model call: from args["transformer_options"], then
    extra["transformer_options"], then the fallback stack; None when there is none."""
    for source in (args, extra or {}):
        options = source.get("transformer_options")
        if isinstance(options, dict) and isinstance(options.get(CALL_KEY), CallContext):
            return options[CALL_KEY]
    return _ACTIVE[-1] if _ACTIVE else None


def note_orphan(reason: str) -> None:
    """Count a block run that had to run unmerged because no call context was found."""
    if not _compiling():
        _ORPHANS[reason] += 1


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def outer_sample_wrapper(executor, *args, **kwargs):
    """OUTER_SAMPLE: give this sampling run a fresh RunState; log its summary; restore options.

    args: (noise, latent_image, sampler, sigmas, denoise_mask, callback, disable_pbar, seed).
    """
    guider = executor.class_obj
    template = guider.model_options.get("transformer_options", {}).get(TOMA_KEY)
    if not isinstance(template, RunState):
        return executor(*args, **kwargs)
    import comfy.model_patcher

    original = guider.model_options
    orphans_before = sum(_ORPHANS.values())
    state = template.fresh()
    try:
        guider.model_options = comfy.model_patcher.create_model_options_clone(original)
        guider.model_options["transformer_options"][TOMA_KEY] = state
        state.stats.compiled = TORCH_COMPILE_KWARGS in guider.model_options
        sampling = guider.model_patcher.get_model_object("model_sampling")
        state.begin_run(sampling.percent_to_sigma, args[3] if len(args) > 3 else kwargs.get("sigmas"))
        return executor(*args, **kwargs)
    except BaseException:
        state.stats.failed = True  # issue 10: a run that died (e.g. another node's crash) is no bypass
        raise
    finally:
        guider.model_options = original
        orphans = sum(_ORPHANS.values()) - orphans_before
        log.info(format_report(state.config, state.stats, orphans))
        _warn_bypass(state, orphans)
        state.plans.clear()


def apply_model_wrapper(executor, *args, **kwargs):
    """APPLY_MODEL: decide this call eagerly and expose the CallContext to the block hooks.

    args: (x (B, C, H, W), t (B,), c_concat, c_crossattn (B, T, C_txt), control,
    transformer_options, **extra conds); transformer_options may also come as a keyword.
    """
    args = list(args)
    options, put_back = _options_of(args, kwargs)
    state = options.get(TOMA_KEY) if isinstance(options, dict) else None
    if not isinstance(state, RunState):
        return executor(*args, **kwargs)
    x, t = args[0], args[1]
    context = args[3] if len(args) > 3 else kwargs.get("c_crossattn")
    ctx = build_call(state, x, t, context, options, kwargs)
    options = dict(options)
    options[CALL_KEY] = ctx
    put_back(options)
    hooked = _hooked_blocks(state)
    _ACTIVE.append(ctx)
    try:
        out = executor(*args, **kwargs)
    finally:
        _ACTIVE.pop()
        state.keep_plans(ctx)
    if ctx.merge and not state.stats.compiled and _hooked_blocks(state) == hooked:
        _count_idle_call(state, ctx)
    return out


IDLE_CALL = "with no block run (skipped by a step cache, or bypassed)"
"""Unmerged-call reason: a merge-eligible call in which none of ToMA's block hooks ran (EasyCache
returned its cached result, or the forward loop ignores ToMA's hooks)."""


def _hooked_blocks(state: RunState) -> int:
    stats = state.stats
    return stats.block_runs_merged + sum(stats.unmerged_blocks.values()) + sum(_ORPHANS.values())


def _count_idle_call(state: RunState, ctx: CallContext) -> None:
    """Move a merge-eligible call in which no block hook ran from "merged" to "unmerged"."""
    stats = state.stats
    stats.merged_calls -= 1
    stats.unmerged_calls[IDLE_CALL] += 1
    stats.merged_per_step[ctx.step] -= 1
    if stats.merged_per_step[ctx.step] <= 0:
        stats.steps_merged.discard(ctx.step)


def _options_of(args: list, kwargs: dict) -> tuple[dict | None, Callable[[dict], None]]:
    if "transformer_options" in kwargs:
        return kwargs["transformer_options"], lambda new: kwargs.__setitem__("transformer_options", new)
    if len(args) > 5:
        return args[5], lambda new: args.__setitem__(5, new)
    return None, lambda new: kwargs.__setitem__("transformer_options", new)


def build_call(state: RunState, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor | None, options: dict, kwargs: dict) -> CallContext:
    """Make the per-call decision (step, merge, epoch) and record the call's token layout."""
    settings = state.config.settings
    geometry = state.config.adapter.call_geometry(x, context, kwargs)
    decision = state.decide(options, t)
    reason = _call_veto(state, settings, decision, geometry)
    composition = (tuple(options.get("cond_or_uncond") or ()), tuple(str(u) for u in options.get("uuids") or ()))
    batch, epoch = int(x.shape[0]), decision.epoch if decision else None
    ctx = CallContext(
        state=state, merge=reason is None, reason=reason,
        step=decision.step if decision else -1, epoch=epoch,
        geometry=geometry, batch=batch, composition=composition,
        plans=state.plans_for(batch, composition, epoch or 0) if reason is None else {},
    )
    _count_call(state, ctx)
    return ctx


def _call_veto(state: RunState, settings: ToMASettings, decision: StepDecision | None, geometry: CallGeometry) -> str | None:
    if decision is None:
        return "outside a sampling run"
    if decision.skipped:
        return f"between merge steps (merge_every={settings.schedule.merge_every})"
    if not decision.merge:
        return "outside the sigma window"
    if geometry.reason is not None:
        return geometry.reason
    if geometry.tokens < settings.min_tokens:
        return f"fewer than min_tokens={settings.min_tokens} image tokens"
    return None


def _count_call(state: RunState, ctx: CallContext) -> None:
    stats = state.stats
    stats.calls += 1
    if ctx.merge:
        stats.merged_calls += 1
        stats.eligible_calls += 1
        stats.merged_per_step[ctx.step] += 1
        stats.steps_merged.add(ctx.step)
    else:
        stats.unmerged_calls[ctx.reason] += 1
    if state.config.settings.verbose:
        g = ctx.geometry
        log.info(
            "ToMA call: step %d epoch %s, %s, grid %dx%d, T=%s, +%d extra tokens, batch %d %s",
            ctx.step, ctx.epoch, "merged" if ctx.merge else f"unmerged ({ctx.reason})",
            g.height, g.width, g.text_len, g.extra_tokens, ctx.batch, ctx.composition[0],
        )


def format_report(config: ToMAConfig, stats: RunStats, orphan_blocks: int) -> str:
    """One line: tokens before/after, blocks and steps merged, plans built, what ran unmerged and why."""
    adapter = config.adapter
    grids = "; ".join(f"{n}->{d} tokens ({h}x{w})" for (h, w), (n, d) in sorted(stats.tokens.items())) or "no tokens merged"
    parts = [
        f"ToMA [{adapter.family}]: {grids}",
        f"merged {len(stats.steps_merged)}/{stats.total_steps} steps, {stats.merged_calls}/{stats.calls} calls",
        f"{adapter.num_blocks} blocks selected ({adapter.blocks}), {stats.block_runs_merged} block runs merged",
        f"{stats.plans_built} plans built",
    ]
    unmerged = [f"{n} calls {why}" for why, n in stats.unmerged_calls.items()]
    unmerged += [f"{n} block runs {why}" for why, n in stats.unmerged_blocks.items()]
    if orphan_blocks:
        unmerged.append(f"{orphan_blocks} block runs without transformer_options")
    parts.append("unmerged: " + (", ".join(unmerged) if unmerged else "none"))
    if stats.failed:
        parts.append("the sampling run stopped with an error; counts are partial")
    elif stats.compiled:
        parts.append("torch.compile: block runs are not counted")
    elif _bypassed(config, stats, orphan_blocks):
        parts.append(f"ToMA was bypassed: none of its block hooks ran in {stats.eligible_calls} merge-eligible calls")
    parts.append(config.settings.describe())
    return " | ".join(parts)


def _bypassed(config: ToMAConfig, stats: RunStats, orphans: int) -> bool:
    """Merge-eligible calls ran, yet no block hook ran at all (not knowable under torch.compile)."""
    hooked = stats.block_runs_merged + sum(stats.unmerged_blocks.values()) + orphans
    return bool(config.adapter.num_blocks and stats.eligible_calls and not hooked and not stats.compiled and not stats.failed)


def _warn_bypass(state: RunState, orphans: int) -> None:
    if _bypassed(state.config, state.stats, orphans) and not _compiling():
        log.warning(
            "ToMA: the model ran %d merge-eligible calls but none of ToMA's block hooks ran; another "
            "node replaced the model's forward loop and ToMA had no effect", state.stats.eligible_calls,
        )
