"""Real third-party ComfyUI packs for the compat tests (issue 13.3), imported from their sources.

The packs' source trees sit at pinned commits in ``../shared/third_party/`` beside the repository
(``TOMA_THIRD_PARTY`` overrides; see that folder's README). Nothing is copied into the project:
each pack folder is registered as a package under a private name without running its
``__init__`` (which registers every node of the pack and may import what a CPU test machine
lacks), then only the module a test needs is imported from it, with its relative imports intact.

Missing packs skip the test with the reason, or fail it where they are required
(``CI=true`` or ``TOMA_REQUIRE_THIRD_PARTY=1``, set by ``.ci/run``).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path
from typing import NoReturn

from .comfy_env import skip_or_fail

PACK_ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY = Path(os.environ.get("TOMA_THIRD_PARTY") or PACK_ROOT.parent / "shared" / "third_party")

TEACACHE = "ComfyUI-TeaCache"
MAGCACHE = "ComfyUI-MagCache"
WAVESPEED = "Comfy-WaveSpeed"
GGUF = "ComfyUI-GGUF"
KJNODES = "ComfyUI-KJNodes"
PULID_LL = "ComfyUI_PuLID_Flux_ll"


def unavailable(reason: str) -> NoReturn:
    skip_or_fail("TOMA_REQUIRE_THIRD_PARTY", "third-party packs are", reason)


def pack_dir(name: str) -> Path:
    folder = THIRD_PARTY / name
    if not folder.is_dir():
        unavailable(f"{name} not found in {THIRD_PARTY} (set TOMA_THIRD_PARTY)")
    return folder


def package_name(name: str) -> str:
    return "toma_tp_" + "".join(c if c.isalnum() else "_" for c in name.lower())


def pack_module(name: str, module: str) -> types.ModuleType:
    """``<pack>/<module>.py`` imported as ``toma_tp_<pack>.<module>`` (relative imports work)."""
    folder = pack_dir(name)
    package = package_name(name)
    if package not in sys.modules:
        stub = types.ModuleType(package)
        stub.__path__ = [str(folder)]
        sys.modules[package] = stub
    return importlib.import_module(f"{package}.{module}")
