"""Import the node pack the way ComfyUI does: as a package named after its folder, so the
relative imports inside `nodes/` resolve (`from ..toma_core import ...`).

Never import `nodes` as a top-level module: ComfyUI has its own top-level `nodes.py`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[1]
PACK_NAME = "comfyui_toma_pack"
"""Package name the pack folder is imported under in tests (ComfyUI derives one from the path)."""


def load_pack() -> types.ModuleType:
    """The pack folder as package PACK_NAME, without running its __init__ (no ComfyUI needed)."""
    module = sys.modules.get(PACK_NAME)
    if module is None:
        module = types.ModuleType(PACK_NAME)
        module.__path__ = [str(PACK_ROOT)]
        sys.modules[PACK_NAME] = module
    return module


def pack_module(name: str) -> types.ModuleType:
    """A submodule of the pack, e.g. pack_module("nodes.settings")."""
    load_pack()
    return importlib.import_module(f"{PACK_NAME}.{name}")


def import_pack_init(name: str = "comfyui_toma_entry") -> types.ModuleType:
    """Run the pack's own __init__.py as ComfyUI's loader does (module from the folder path)."""
    spec = importlib.util.spec_from_file_location(name, PACK_ROOT / "__init__.py", submodule_search_locations=[str(PACK_ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
