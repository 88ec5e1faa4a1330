"""The skeleton every block hook runs: the preamble and the recording, around the family's merge.

A hook (a dit replace function, or an object patch of a block's forward) always does the same:
find the running call's CallContext (none: the run counts as an orphan and the block runs as it
is), run the block as it is when the call does not merge, else let the family merge it; then
record the block run, merged or unmerged with its reason. `run_hook` is all of that; a family
supplies `merged(ctx)`, which returns the block's result on merged tokens or an `Unmerged`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from ..contract import Unmerged
from ..run.runtime import CallContext, compiling, find_call, note_orphan

log = logging.getLogger(__name__)

_WARNED: set[tuple[str, str]] = set()
"""(family, reason) of the layout changes already warned about in this process."""

R = TypeVar("R")


def block_context(args: dict, extra: dict | None = None) -> CallContext | None:
    """The running call's CallContext for a block hook; a hook without one is counted as orphan
    (it runs unmerged). transformer_options may be missing from args: a forward loop that calls the
    blocks itself (TeaCache-style) passes none, and runtime.find_call falls back to the active call."""
    ctx = find_call(args, extra)
    if ctx is None:
        note_orphan("no ToMA call context")
    return ctx


def run_hook(args: dict, extra: dict | None, plain: Callable[[], R], merged: Callable[[CallContext], R | Unmerged]) -> R:
    """One block run: plain() (the block as it is) unless the call merges and merged(ctx) returns
    the result on merged tokens; args / extra hold the block's transformer_options (see block_context).
    A merged run is recorded as merged, an Unmerged with a reason as unmerged under it."""
    ctx = block_context(args, extra)
    if ctx is None or not ctx.merge:
        return plain()
    out = merged(ctx)
    if isinstance(out, Unmerged):
        if out.reason is not None:
            ctx.record_block(False, out.reason)
        if out.layout:
            warn_layout(ctx.state.config.adapter.family, out.reason or "")
        return plain()
    ctx.record_block(True)
    return out



def warn_layout(family: str, reason: str) -> None:
    """Warn once per process and reason that a block's inputs broke its adapter's layout check, naming
    the running ComfyUI's version (the block ran unmerged; the run line counts it)."""
    if compiling() or (family, reason) in _WARNED:
        return
    _WARNED.add((family, reason))
    log.warning(
        "ToMA [%s]: on ComfyUI %s the blocks' inputs are not laid out as ToMA expects (%s): those blocks run "
        "unmerged, nothing is merged wrongly. Please report it with your ComfyUI version.", family, comfyui_version(), reason,
    )


def comfyui_version() -> str:
    """The running ComfyUI's version (ComfyUI's own comfyui_version module), or "unknown"."""
    try:
        from comfyui_version import __version__
    except ImportError:
        return "unknown"
    return str(__version__)
