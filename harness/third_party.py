"""Real third-party ComfyUI packs for the compat tests, imported from their sources.

Where the packs' source trees are looked for (``search_folder``): the folder ``TOMA_THIRD_PARTY``
names, when set; else, when this pack sits in ``ComfyUI/custom_nodes/``, the packs installed beside
it there; else ``../shared/third_party/`` beside the clone (the project machines' and CI's copies at
pinned commits; see that folder's README). Nothing is copied into the project:
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

from .comfy_env import is_comfy_root, skip_or_fail

PACK_ROOT = Path(__file__).resolve().parents[1]

TEACACHE = "ComfyUI-TeaCache"
MAGCACHE = "ComfyUI-MagCache"
WAVESPEED = "Comfy-WaveSpeed"
GGUF = "ComfyUI-GGUF"
KJNODES = "ComfyUI-KJNodes"
KJNODES_2026 = "ComfyUI-KJNodes-2026-08"
"""KJNodes as current with ComfyUI 0.33 (``KJNODES``: as current with 0.3.64)."""
PULID_LL = "ComfyUI_PuLID_Flux_ll"


def unavailable(reason: str) -> NoReturn:
    skip_or_fail("TOMA_REQUIRE_THIRD_PARTY", "third-party packs are", reason)


def search_folder() -> Path:
    """The folder holding the third-party packs' source trees: ``$TOMA_THIRD_PARTY``; else
    ``ComfyUI/custom_nodes/`` when this pack is installed there; else ``../shared/third_party``
    beside the clone."""
    env = os.environ.get("TOMA_THIRD_PARTY")
    if env:
        return Path(env).expanduser()
    if PACK_ROOT.parent.name == "custom_nodes" and is_comfy_root(PACK_ROOT.parent.parent):
        return PACK_ROOT.parent
    return PACK_ROOT.parent / "shared" / "third_party"


def pack_dir(name: str) -> Path:
    """The source tree of pack `name`; skips (or fails, where required) when it is not there."""
    folder = search_folder()
    if not (folder / name).is_dir():
        unavailable(f"{name} not found in {folder} (install it there, or set TOMA_THIRD_PARTY to a folder "
                    f"holding a checkout of {name})")
    return folder / name


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


def kjnodes(comfy_version: str) -> str:
    """The KJNodes snapshot a user of ComfyUI `comfy_version` (``comfyui_version.py``) runs:
    ``KJNODES_2026`` from 0.33 on (and for an unreadable version), ``KJNODES`` before."""
    try:
        major_minor = tuple(int(part) for part in comfy_version.split(".")[:2])
    except ValueError:
        return KJNODES_2026
    return KJNODES_2026 if major_minor >= (0, 33) else KJNODES
