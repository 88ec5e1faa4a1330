"""The tests run where users put the pack: a folder named ``ComfyUI-ToMA`` inside a ComfyUI tree's
``custom_nodes/``.

pytest collects the repository root as a package (it holds the pack's ``__init__.py``); a folder
name that is not a Python identifier once made every module fail to import, and the integration
tests must find ComfyUI two folders up, not skip. This test lays out that tree in a temporary
folder (ComfyUI's entries linked, the pack copied under its real name), hides every other place
ComfyUI could be found, and runs a unit test file and a ComfyUI sampling test there in a fresh
pytest with ComfyUI required, so a skip would be a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import comfy_env

PACK_NAME = "ComfyUI-ToMA"
"""The repository's name: what git clone, ComfyUI Manager and comfy-cli call the folder."""

COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", "*.egg-info", "out")
"""Not part of a clone: VCS data, the virtualenv, caches, benchmark outputs."""

TESTS = ["tests/test_schedule.py", "tests/integration/test_comfy_smoke.py::test_flux_block_args_match_design"]


def comfy_tree_with_pack(comfy_root: Path, where: Path) -> Path:
    """``where/ComfyUI`` with ComfyUI's entries linked and a real ``custom_nodes/ComfyUI-ToMA``
    copy of this pack; returns the pack folder."""
    tree = where / "ComfyUI"
    (tree / "custom_nodes").mkdir(parents=True)
    for entry in comfy_root.iterdir():
        if entry.name != "custom_nodes":
            (tree / entry.name).symlink_to(entry)
    pack = tree / "custom_nodes" / PACK_NAME
    shutil.copytree(comfy_env.PACK_ROOT, pack, ignore=COPY_IGNORE)
    return pack


def test_readme_command_runs_inside_custom_nodes(comfy: Path, tmp_path: Path) -> None:
    pack = comfy_tree_with_pack(comfy, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("COMFYUI_PATH", "PYTEST_ADDOPTS")}
    env.update(HOME=str(tmp_path / "home"), TOMA_REQUIRE_COMFYUI="1")  # no ~/comfy; a skip fails
    assert not (pack.parent / "shared" / "ComfyUI").exists()  # only "two folders up" can find it
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", *TESTS],
        cwd=pack, env=env, capture_output=True, text=True, timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "passed" in out and "skipped" not in out and "error" not in out.lower(), out[-4000:]
