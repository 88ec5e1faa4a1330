"""A test-only custom node: ``GET /toma_soak/state`` answers what the server process holds now.

Installed only into the soak test's own server (test_live_soak.py links it into that server's
custom_nodes/ beside the pack); the pack itself registers no route. The answer, as JSON:

- ``runtime``: ToMA's runtime state (``nodes.run.current.live_state()``: sampling runs and model calls
  open in ToMA's wrappers, and the fallback stack and orphan counter of the route's own thread);
- ``call_contexts`` / ``run_states`` (with ``?holders=1``): ToMA per-call and per-run holders still
  alive in the process, after ``gc.collect()``; then glibc's ``malloc_trim(0)`` hands the heap's
  free pages back to the system, so that the resident memory read next counts live memory, not
  what the allocator keeps for reuse;
- ``loaded_models``: models in ComfyUI's ``comfy.model_management.current_loaded_models``.
"""

from __future__ import annotations

import ctypes
import gc
import sys

import comfy.model_management
from aiohttp import web
from server import PromptServer

NODE_CLASS_MAPPINGS: dict = {}


def _run_module(name: str, attribute: str):
    """The pack's nodes.run.<name> module as ComfyUI imported it ("ComfyUI-ToMA.nodes.run.<name>"), the
    one of that name that has `attribute`."""
    return next(module for key, module in sys.modules.items() if key.endswith(f".nodes.run.{name}") and hasattr(module, attribute))


@PromptServer.instance.routes.get("/toma_soak/state")
async def soak_state(request: web.Request) -> web.Response:
    runtime = _run_module("runtime", "RunState")
    state = {"runtime": _run_module("current", "live_state").live_state(), "loaded_models": len(comfy.model_management.current_loaded_models)}
    if request.query.get("holders"):
        gc.collect()
        alive = gc.get_objects()
        state["call_contexts"] = sum(isinstance(o, runtime.CallContext) for o in alive)
        state["run_states"] = sum(isinstance(o, runtime.RunState) for o in alive)
        del alive
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return web.json_response(state)
