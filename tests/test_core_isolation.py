"""toma_core is a self-contained library: it must import nothing from ComfyUI."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).resolve().parents[1] / "toma_core"
ALLOWED = {"torch", "einops", "__future__"} | set(sys.stdlib_module_names)


def imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_torch_einops_and_stdlib_imports() -> None:
    files = sorted(CORE.glob("*.py"))
    assert files
    for path in files:
        assert imported_roots(path) <= ALLOWED, f"{path.name} imports {imported_roots(path) - ALLOWED}"


def test_importing_core_loads_no_comfy_module() -> None:
    code = "import sys, toma_core; bad = [m for m in sys.modules if m.split('.')[0] in ('comfy', 'comfy_api', 'nodes', 'folder_paths')]; print(bad); sys.exit(1 if bad else 0)"
    result = subprocess.run([sys.executable, "-c", code], cwd=CORE.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
