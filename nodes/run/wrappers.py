"""The two wrappers a ToMA patch installs (patching.install_runtime), which create the per-run and
per-call state of runtime.py.

- OUTER_SAMPLE (`outer_sample_wrapper`): a fresh RunState for each sampling run (the EasyCache
  pattern), its sigma window, the run's summary line at the end (report.py).
- APPLY_MODEL (`apply_model_wrapper`): the per-call decision (step, merge on/off, epoch, token
  grid, batch composition; min_tokens "auto", gain.auto_call_veto) made
  eagerly in `build_call`, the CallContext exposed to the block
  hooks for the call, and the plans they built kept for later calls. APPLY_MODEL rather than
  DIFFUSION_MODEL: core TorchCompileModel compiles `diffusion_model` (DIFFUSION_MODEL wrappers
  included), so decisions made here stay eager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ...toma_core import StepDecision
from ..contract import CallGeometry
from ..settings import AUTO, CALL_KEY, KEYS_VALUES, TOMA_KEY, ToMASettings
from .current import enter_call, enter_run, leave_call, leave_run, orphan_count
from .gain import auto_call_veto, call_key, measure_gain, warn_if_slower
from .gain import log as gain_log
from .report import TOMA_RUN
from .runtime import TORCH_COMPILE_KWARGS, CallContext, RunState, compiling
from .stats import bypassed, run_record, schedule_warning

log = logging.getLogger(__name__)


def outer_sample_wrapper(executor, *args, **kwargs):
    """OUTER_SAMPLE: give this sampling run a fresh RunState; log its summary; restore options.

    args: (noise, latent_image, sampler, sigmas, denoise_mask, callback, disable_pbar, seed).
    """
    guider = executor.class_obj
    template = guider.model_options.get("transformer_options", {}).get(TOMA_KEY)
    if not isinstance(template, RunState):
        return executor(*args, **kwargs)
    import comfy.model_management
    import comfy.model_patcher

    original = guider.model_options
    state = template.fresh()
    run = enter_run()
    try:
        guider.model_options = comfy.model_patcher.create_model_options_clone(original)
        guider.model_options["transformer_options"][TOMA_KEY] = state
        state.stats.compiled = TORCH_COMPILE_KWARGS in guider.model_options
        sampling = guider.model_patcher.get_model_object("model_sampling")
        state.begin_run(sampling.percent_to_sigma, args[3] if len(args) > 3 else kwargs.get("sigmas"))
        return executor(*args, **kwargs)
    except BaseException as error:
        state.stats.failed = True  # a run that died (e.g. another node's crash) is no bypass
        state.stats.cancelled = isinstance(error, comfy.model_management.InterruptProcessingException)
        raise
    finally:
        orphans = leave_run(run)
        guider.model_options = original
        gain = None if state.stats.failed else measure_gain(state.timer.calls(), state.predicted_speedup)
        record = run_record(state.config, state.stats, orphans, gain, state.timer.measured())
        log.info(record.line(), extra={TOMA_RUN: record})
        _warn_bypass(state, orphans)
        _warn_schedule(state)
        if not state.timer.stopped:  # auto stopped merging, and the run line says why
            warn_if_slower(gain, state.config.settings.min_tokens)
        state.plans.clear()


def apply_model_wrapper(executor, *args, **kwargs):
    """APPLY_MODEL: decide this call eagerly and expose the CallContext to the block hooks.

    args: (x (B, C, H, W), t (B,), c_concat, c_crossattn (B, T, C_txt), control,
    transformer_options, **extra conds); transformer_options may also come as a keyword.
    """
    args = list(args)
    options, put_back = transformer_options_of(args, kwargs)
    state = options.get(TOMA_KEY) if isinstance(options, dict) else None
    if not isinstance(state, RunState):
        return executor(*args, **kwargs)
    x, t = args[0], args[1]
    context = args[3] if len(args) > 3 else kwargs.get("c_crossattn")
    with state.lock:  # other devices' calls of this run decide at the same time under MultiGPU CFG Split (runtime.py)
        ctx = build_call(state, x, t, context, options, kwargs)
    options = dict(options)
    options[CALL_KEY] = ctx
    put_back(options)
    orphans = orphan_count()
    start = state.timer.start(x)
    call = enter_call(ctx)  # nothing may raise between here and `try`: leave_call must run
    try:
        out = executor(*args, **kwargs)
    finally:
        leave_call(call)
        state.keep_plans(ctx)
    # The call's own block counts, not the run's counters: other devices' calls move those meanwhile.
    if ctx.merge and not state.stats.compiled and ctx.block_runs == 0 and orphan_count() == orphans:
        # a step cache's skip: its time is no model call's, so it is not timed
        _count_unmerged_call(state, ctx, naming_loop(IDLE_CALL, executor))
        return out
    merged = ctx.merge
    if merged and not state.stats.compiled and ctx.merged_blocks == 0:
        _count_unmerged_call(state, ctx, naming_loop(NO_BLOCK_MERGED, executor))
        merged = False
    state.timer.stop(start, call_key(ctx.batch, ctx.geometry), merged)
    return out


# BaseModel.apply_model's arguments as an APPLY_MODEL wrapper receives them: (x, t, c_concat,
# c_crossattn, control, transformer_options, **extra conds), transformer_options positional
# (comfy.model_base.BaseModel.apply_model) or a keyword.
OPTIONS_INDEX = 5
"""Position of transformer_options among apply_model's arguments."""


def transformer_options_of(args: list, kwargs: dict) -> tuple[dict | None, Callable[[dict], None]]:
    """The call's transformer_options (None when it has none) and a function that puts a
    replacement in its place (in `args`, a list, or `kwargs`)."""
    if "transformer_options" in kwargs:
        return kwargs["transformer_options"], lambda new: kwargs.__setitem__("transformer_options", new)
    if len(args) > OPTIONS_INDEX:
        return args[OPTIONS_INDEX], lambda new: args.__setitem__(OPTIONS_INDEX, new)
    return None, lambda new: kwargs.__setitem__("transformer_options", new)


IDLE_CALL = "with no block run (skipped by a step cache, or bypassed)"
"""Unmerged-call reason: a merge-eligible call in which none of ToMA's block hooks ran (EasyCache
returned its cached result, TeaCache skipped the step, or the forward loop ignores ToMA's hooks; a
replaced forward loop is named: `naming_loop`). Not timed: no gain is claimed for it."""


NO_BLOCK_MERGED = "with no block merged (each block ran unmerged: see the block reasons)"
"""Unmerged-call reason: a merge-eligible call whose block hooks all ran their block unmerged (e.g.
scope keys_values under a forward loop that runs the blocks without the call's transformer_options:
machinery/keys_values.py NOT_HANDED; a replaced forward loop is named: `naming_loop`); timed as an
unmerged call, so the run's gain is not claimed for it."""


LOOPS = ("forward_orig", "_forward", "forward")
"""The diffusion models' forward-loop methods (comfy.ldm.flux.model.Flux.forward_orig, WanModel.forward_orig,
Lumina2's forward, ...) that another node may replace on the model instance for the time of a call, as
TeaCache and MagCache do (`unittest.mock.patch.multiple(diffusion_model, forward_orig=...)` inside
their model_function_wrapper, which runs around BaseModel.apply_model and so around this wrapper)."""


def replaced_loop(base_model) -> str | None:
    """"the model's <method> is <function> from <module>" when the diffusion model of `base_model`
    (comfy.model_base.BaseModel, the APPLY_MODEL executor's class_obj) runs a forward loop set on the
    instance instead of its class's, else None. ComfyUI's own models never set one: the function's
    module names the node that did."""
    own = getattr(getattr(base_model, "diffusion_model", None), "__dict__", {})
    for name in LOOPS:
        fn = own.get(name)
        if callable(fn):
            fn = getattr(fn, "__func__", fn)
            return f"the model's {name} is {getattr(fn, '__qualname__', type(fn).__name__)} from {getattr(fn, '__module__', None)}"
    return None


def naming_loop(reason: str, executor) -> str:
    """An unmerged-call reason (IDLE_CALL, NO_BLOCK_MERGED: both end in a parenthesis) with the
    replaced forward loop of the call's model added inside its parenthesis, when there is one."""
    loop = replaced_loop(getattr(executor, "class_obj", None))
    return reason if loop is None else f"{reason.removesuffix(')')}; {loop})"


def _count_unmerged_call(state: RunState, ctx: CallContext, reason: str) -> None:
    """Move a merge-eligible call that merged nothing from "merged" to "unmerged" (`reason`)."""
    stats = state.stats
    with state.lock:
        stats.merged_calls -= 1
        stats.unmerged_calls[reason] += 1
        stats.merged_per_step[ctx.step] -= 1
        if stats.merged_per_step[ctx.step] <= 0:
            stats.steps_merged.discard(ctx.step)


def build_call(state: RunState, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor | None, options: dict, kwargs: dict) -> CallContext:
    """Make the per-call decision (step, merge, epoch) and record the call's token layout."""
    settings = state.config.settings
    geometry = state.config.adapter.call_geometry(x, context, kwargs)
    decision = state.decide(options, t)
    reason = call_veto(settings, decision, geometry, state.config.off_reason, lambda: _auto_veto(state, geometry, x, options))
    # The device too: a plan's tensors live on one device, and MultiGPU CFG Split runs a run's calls on several.
    composition = (tuple(options.get("cond_or_uncond") or ()), tuple(str(u) for u in options.get("uuids") or ()), str(x.device))
    batch, epoch = int(x.shape[0]), decision.epoch if decision else None
    ctx = CallContext(
        state=state, merge=reason is None, reason=reason,
        step=decision.step if decision else -1, epoch=epoch,
        geometry=geometry, batch=batch, composition=composition,
        plans=state.plans_for(batch, composition, epoch or 0) if reason is None else {},
        kernel=_kernel(state, options, x) if reason is None else None,
    )
    _count_call(state, ctx)
    return ctx


def _kernel(state: RunState, options: dict, x: torch.Tensor) -> tuple | None:
    """The attention kernel a keys_values call runs (ToMAConfig.kernel_reader), read here, eagerly."""
    reader = state.config.kernel_reader
    if reader is None or state.config.settings.scope != KEYS_VALUES:
        return None
    return reader(options, x.device.type)


def call_veto(
    settings: ToMASettings, decision: StepDecision | None, geometry: CallGeometry, off_reason: str,
    auto: Callable[[], str | None],
) -> str | None:
    """Why a model call runs unmerged, or None when it merges: the one decision of a call, a pure
    function of its arguments. In order: outside a sampling run, settings that merge nothing
    (`off_reason`), between merge steps, outside the sigma window (`decision`, the schedule's), a
    token layout the family does not merge (`geometry.reason`), then the size: min_tokens "auto" asks
    `auto()` (the cost model, or the run's timing where its prediction is close: gain.auto_call_veto),
    a number compares the image tokens."""
    if decision is None:
        return "outside a sampling run"
    if settings.effective_ratio == 0:
        return off_reason
    if decision.skipped:
        return f"between merge steps (merge_every={settings.schedule.merge_every})"
    if not decision.merge:
        return "outside the sigma window"
    if geometry.reason is not None:
        return geometry.reason
    if settings.min_tokens == AUTO:
        return auto()
    if geometry.tokens < settings.min_tokens:
        return f"fewer than min_tokens={settings.min_tokens} image tokens"
    return None


def _auto_veto(state: RunState, geometry: CallGeometry, x: torch.Tensor, options: dict) -> str | None:
    """min_tokens "auto" for this call (gain.auto_call_veto): the cost model decides, on the kernel
    the call's attention runs (ToMAConfig.kernel_reader), or the run's timing where its prediction is
    close (not under torch.compile)."""
    device, reader = x.device.type, state.config.kernel_reader
    kernel = reader(options, device)[0] if reader is not None else None
    return auto_call_veto(state.config.cost, state.timer, geometry, device, int(x.shape[0]), not state.stats.compiled, kernel)


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


def _warn_schedule(state: RunState) -> None:
    text = schedule_warning(state.config.settings, state.stats)
    if text:
        log.warning("ToMA: %s", text)


def _warn_bypass(state: RunState, orphans: int) -> None:
    if bypassed(state.config, state.stats, orphans) and not compiling():
        log.warning(
            "ToMA: the model ran %d merge-eligible calls but none of ToMA's block hooks ran; another "
            "node replaced the model's forward loop and ToMA had no effect", state.stats.eligible_calls,
        )


def _drop(record: logging.LogRecord) -> bool:
    return False


@contextmanager
def unlogged_runs() -> Iterator[None]:
    """Inside the block, ToMA's runs log no run line and none of this module's or gain.py's warnings: for a
    run that is not the user's, such as ToMA Compare's warm-up (compare.py `timed`), whose line
    would stand beside the timed run's, about a run of one step with no unmerged call to measure
    (so with the cost model's figures where the timed run has measured ones)."""
    loggers = (log, gain_log)
    for logger in loggers:
        logger.addFilter(_drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_drop)
