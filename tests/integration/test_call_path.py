"""The files one merged Flux model call enters are the ones docs/development.md lists ("Layout", the
bullet "One merged Flux model call"), traced in real ComfyUI code so the reader's path stays true.

The call: a tiny Flux (tiny_models.build_flux, width 64) patched at the node's defaults (ratio,
tile_size and min_tokens "auto" of nodes/settings.py) but from the first step and on every block,
sampled on a 64x64 latent (1,024 image tokens, where the cost model predicts a gain on a CPU, so
"auto" merges). sys.setprofile records every Python call and return inside
comfy.model_base.BaseModel.apply_model (the APPLY_MODEL wrapper runs inside it); the first call that
merges (enters toma_core's MergePlan.merge) is the traced one.

Files: the pack's nodes/** and toma_core/** files entered. Hops: how many times the innermost pack
file on the stack changes during the call (a call into another file is one hop, the return from it
another; torch and ComfyUI frames in between are transparent, comfy/model_base.py counts as a file
of its own). `python -m pytest -s -q tests/integration/test_call_path.py` prints both, per file and
with toma_core counted as one file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from compat_support import patch

from harness.pack import PACK_ROOT

MODEL_BASE = "comfy/model_base.py"
CALL_BULLET = "- One merged Flux model call"
"""The docs/development.md bullet that lists the files of the call."""


def pack_file(filename: str) -> str | None:
    """A traced frame's file: its path in the pack (nodes/, toma_core/), MODEL_BASE, or None."""
    path = Path(filename)
    if path.as_posix().endswith(MODEL_BASE):
        return MODEL_BASE
    try:
        rel = path.resolve().relative_to(PACK_ROOT).as_posix()
    except ValueError:
        return None
    return rel if rel.startswith(("nodes/", "toma_core/")) else None


def innermost(frame: Any) -> str | None:
    """The file of the innermost traced frame from `frame` outwards."""
    while frame is not None and (file := pack_file(frame.f_code.co_filename)) is None:
        frame = frame.f_back
    return None if frame is None else file


def trace_model_calls(run: Any) -> list[list[tuple[str, str]]]:
    """run() under sys.setprofile: per BaseModel.apply_model call, the (file, function) where
    execution is after each call and return of a traced frame."""
    calls: list[list[tuple[str, str]]] = []
    top: list[Any] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event not in ("call", "return"):
            return
        if not top:
            if event == "call" and code.co_name == "apply_model" and pack_file(code.co_filename) == MODEL_BASE:
                top.append(frame)
                calls.append([(MODEL_BASE, code.co_name)])
            return
        if event == "return" and frame is top[0]:
            top.clear()
        elif (file := pack_file(code.co_filename)) is not None:
            calls[-1].append((file if event == "call" else innermost(frame.f_back), code.co_name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def files_and_hops(locations: list[str]) -> tuple[list[str], int]:
    """The files in order of first entry, and the hops between them."""
    return list(dict.fromkeys(locations)), sum(a != b for a, b in zip(locations, locations[1:]))


def documented_files() -> set[str]:
    """The pack files the CALL_BULLET of docs/development.md names."""
    text = (PACK_ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    start = text.index(CALL_BULLET)
    bullet = text[start:text.find("\n- ", start + 1)]
    return set(re.findall(r"`((?:nodes|toma_core)/[\w/]+\.py)`", bullet))


def test_a_merged_flux_call_enters_the_documented_files(tiny: Any, toma: Any) -> None:
    s = toma.settings
    model = patch(toma, tiny.build_flux(seed=0), ratio=s.NODE_RATIO, tile_size=s.NODE_TILE_SIZE, min_tokens=s.NODE_MIN_TOKENS, blocks="all")
    calls = trace_model_calls(lambda: tiny.sample(model, (1, 16, 64, 64), steps=2))
    merged = [c for c in calls if ("toma_core/plan.py", "merge") in c]
    assert merged, f"none of the {len(calls)} model calls merged"
    locations = [file for file, _ in merged[0]]
    files, hops = files_and_hops(locations)
    core_files, core_hops = files_and_hops([f if not f.startswith("toma_core/") else "toma_core" for f in locations])
    print(
        f"\nmerged Flux call: {len(files) - 1} pack files + {MODEL_BASE}, {hops} hops; "
        f"toma_core as one: {len(core_files) - 1} + {MODEL_BASE}, {core_hops} hops\n  " + "\n  ".join(files),
    )
    assert set(files) - {MODEL_BASE} == documented_files()
