"""Find a ComfyUI source tree and import it for integration tests.

ComfyUI is not a PyPI package: tests run against a source checkout kept outside this repository.
Search order: ``$COMFYUI_PATH``; the ComfyUI root two folders above this pack when the pack sits
in ``ComfyUI/custom_nodes/``; ``~/comfy/ComfyUI``; ``../shared/ComfyUI`` beside this repository
(the read-only copy on the project's machines and in CI). Importing ComfyUI needs its requirements
(torch, a torchvision that loads, einops, transformers, ...); when they are missing the caller gets
a skip reason, never an exception. Where ComfyUI is required (``CI=true`` or
``TOMA_REQUIRE_COMFYUI=1``, set by ``.ci/run``), the tests fail with that reason instead of
skipping.

Without ``main.py``, ``comfy.cli_args.args.cpu`` must be set before ``comfy.model_management`` is
first imported, or ComfyUI picks the accelerator itself. Set ``COMFYUI_USE_GPU=1`` to leave the
device choice to ComfyUI (for checks on a machine with an accelerator).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

log = logging.getLogger(__name__)

PACK_ROOT = Path(__file__).resolve().parents[1]
"""Root of this node pack (the folder holding ``bench/`` and ``tests/``)."""

DEFAULT_COMFY_PATH = Path("~/comfy/ComfyUI").expanduser()

SHARED_COMFY_PATH = PACK_ROOT.parent / "shared" / "ComfyUI"
"""The project machines' and CI's read-only ComfyUI, beside the repository."""

_MARKER = Path("comfy") / "model_management.py"


def is_comfy_root(path: Path) -> bool:
    """True when ``path`` looks like a ComfyUI source root."""
    return (path / _MARKER).is_file() and (path / "nodes.py").is_file()


def candidate_paths() -> list[Path]:
    """ComfyUI roots to try, in order of preference."""
    candidates: list[Path] = []
    env = os.environ.get("COMFYUI_PATH")
    if env:
        candidates.append(Path(env).expanduser())
    candidates.append(PACK_ROOT.parent.parent)
    candidates.append(DEFAULT_COMFY_PATH)
    candidates.append(SHARED_COMFY_PATH)
    return candidates


def required(flag: str) -> bool:
    """True in CI (``CI=true``) or with ``<flag>=1``: a missing prerequisite fails, not skips."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(flag) == "1"


def skip_or_fail(flag: str, what: str, reason: str) -> NoReturn:
    """Skip the calling test with ``reason``, or fail it where ``flag`` makes `what` required."""
    import pytest

    if required(flag):
        pytest.fail(f"{what} required here (CI=true or {flag}=1): {reason}")
    pytest.skip(reason)


def comfy_required() -> bool:
    """True in CI (``CI=true``) or with ``TOMA_REQUIRE_COMFYUI=1``: no ComfyUI is a failure, not a skip."""
    return required("TOMA_REQUIRE_COMFYUI")


def missing(reason: str) -> NoReturn:
    """Skip the calling test with ``reason``, or fail it where ComfyUI is required."""
    skip_or_fail("TOMA_REQUIRE_COMFYUI", "ComfyUI is", reason)


def find_comfy_root() -> Path | None:
    """Return the first candidate that is a ComfyUI root, or None."""
    for path in candidate_paths():
        if is_comfy_root(path):
            return path.resolve()
    return None


def put_on_sys_path(root: Path) -> None:
    """Put the ComfyUI root first on ``sys.path`` so ``import comfy``, ``nodes`` and ``folder_paths``
    resolve to that tree.

    The one ``sys.path`` edit in bench/ and tests/: ComfyUI is a source checkout, not an installable
    package, and its modules import each other as top-level names (``import comfy.model_management``,
    ``import folder_paths``) from its root. Everything else (``harness``, ``toma_core``, the pack
    through ``pack.py``) resolves from the repository root, which ``python -m`` puts on the path.
    """
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def _force_cpu_unless_asked() -> None:
    """Set ``args.cpu`` before ``comfy.model_management`` is imported (no-op if already imported)."""
    import comfy.cli_args

    if os.environ.get("COMFYUI_USE_GPU") == "1":
        return
    if "comfy.model_management" in sys.modules and not comfy.cli_args.args.cpu:
        log.warning("comfy.model_management was imported before cpu mode was set")
    comfy.cli_args.args.cpu = True


def import_comfy() -> Path | str:
    """Put ComfyUI on ``sys.path`` and import its sampling stack.

    Returns the ComfyUI root on success, or a human-readable skip reason (str) when ComfyUI is
    absent or cannot be imported with the running interpreter.
    """
    root = find_comfy_root()
    if root is None:
        tried = ", ".join(str(p) for p in candidate_paths())
        return f"ComfyUI not found (set COMFYUI_PATH; tried {tried})"
    put_on_sys_path(root)
    try:
        _force_cpu_unless_asked()
        import comfy.model_base  # noqa: F401
        import comfy.model_management  # noqa: F401
        import comfy.model_patcher  # noqa: F401
        import comfy.sample  # noqa: F401
        import comfy.supported_models  # noqa: F401
    except Exception as exc:  # ImportError, or torchvision's "operator does not exist" RuntimeError
        return f"ComfyUI at {root} does not import under {sys.executable}: {type(exc).__name__}: {exc}"
    log.info("using ComfyUI at %s", root)
    return root


def comfy_version(root: Path) -> str:
    """ComfyUI's version string from ``comfyui_version.py`` ('unknown' when absent)."""
    path = root / "comfyui_version.py"
    if not path.is_file():
        return "unknown"
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    return "unknown"
