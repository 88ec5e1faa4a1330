"""The sampling run and model calls open now (started and ended by the wrappers in wrappers.py):
this thread's call stack, where block hooks find their call's CallContext (runtime.py), the run's
count of block runs that found none (orphans), and, for `live_state`, how many runs and calls are
open in every thread. The stack and the orphan counter are ContextVars, reset in the wrappers'
`finally`, so nothing outlives a call or a run and samplers in other threads never see them."""

from __future__ import annotations

import threading
from collections import Counter
from contextvars import ContextVar, Token

from ..settings import CALL_KEY
from .runtime import CallContext, compiling

_CALLS: ContextVar[tuple[CallContext, ...]] = ContextVar("comfyui_toma_calls", default=())
"""Contexts of the model calls in progress in this thread or task (innermost last): where block hooks
find their call first (find_call), also when a forward loop calls them without transformer_options
(TeaCache/MagCache-style). A ContextVar, so two samplers in two threads never see each other's calls."""

_RUN_ORPHANS: ContextVar[Counter | None] = ContextVar("comfyui_toma_run_orphans", default=None)
"""The running sampling run's count of block runs that found no CallContext, by reason."""

_OPEN = Counter()
"""Scopes open now in every thread ("runs", "calls"): bookkeeping for `live_state` only."""
_OPEN_LOCK = threading.Lock()


def find_call(args: dict, extra: dict | None = None) -> CallContext | None:
    """The CallContext of the running model call: the innermost call on this thread's stack, else
    args["transformer_options"], then extra["transformer_options"] (a block run in another thread
    than its call); None when there is none.

    The stack comes first because torch.compile guards what the compiled blocks read from it, and
    not what they read from transformer_options under ComfyUI 0.33's TorchCompileModel, whose
    `guard_filter_fn` (comfy_extras/nodes_torch_compile.py `skip_torch_compile_dict`) drops every
    guard on transformer_options: a context read from there would freeze the first call's merge
    decision into the compiled graph for the whole window."""
    calls = _CALLS.get()
    if calls:
        return calls[-1]
    for source in (args, extra or {}):
        options = source.get("transformer_options")
        if isinstance(options, dict) and isinstance(options.get(CALL_KEY), CallContext):
            return options[CALL_KEY]
    return None


def note_orphan(reason: str) -> None:
    """Count a block run of this thread's sampling run that found no call context (none outside a run)."""
    orphans = _RUN_ORPHANS.get()
    if orphans is not None and not compiling():
        orphans[reason] += 1



def orphan_count() -> int:
    """Block runs of this thread's sampling run so far that found no call context (0 outside a run)."""
    orphans = _RUN_ORPHANS.get()
    return sum(orphans.values()) if orphans is not None else 0


def enter_run() -> Token:
    """Start this thread's orphan count for a sampling run; pass the token to leave_run in `finally`."""
    _opened("runs", 1)
    return _RUN_ORPHANS.set(Counter())


def leave_run(token: Token) -> int:
    """End the run begun with enter_run (on every exit path); returns its orphan block runs."""
    orphans = orphan_count()
    _RUN_ORPHANS.reset(token)
    _opened("runs", -1)
    return orphans


def enter_call(ctx: CallContext) -> Token:
    """Make `ctx` the innermost context of this thread for its model call; pass the token to leave_call."""
    _opened("calls", 1)
    return _CALLS.set((*_CALLS.get(), ctx))


def leave_call(token: Token) -> None:
    """End the model call begun with enter_call (in `finally`)."""
    _CALLS.reset(token)
    _opened("calls", -1)


def _opened(kind: str, delta: int) -> None:
    with _OPEN_LOCK:
        _OPEN[kind] += delta


def live_state() -> dict[str, int]:
    """What ToMA's runtime holds now: 0 everywhere when no sampling run is in progress.

    runs / calls: sampling runs and model calls inside ToMA's wrappers, in every thread (readable
    from any thread, e.g. a server route). thread_runs / thread_calls: the same for the caller's
    own thread or context (its orphan counter, 0 or 1, and its call stack depth).
    """
    with _OPEN_LOCK:
        runs, calls = _OPEN["runs"], _OPEN["calls"]
    return {
        "runs": runs, "calls": calls,
        "thread_runs": int(_RUN_ORPHANS.get() is not None), "thread_calls": len(_CALLS.get()),
    }
