"""The pack's import graph has no circle and follows its layers: every import of nodes/ and
toma_core/ counts, the ones inside functions and under `if TYPE_CHECKING:` included (a deferred
import only hides a circle, it does not remove it). Read from the source with `ast`, so nothing is
imported. The layers, each importing only from those after it (nodes/__init__.py):
node -> families -> machinery -> run -> the shared contract and settings -> toma_core."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nodes", "toma_core")
LAYERS = ("nodes.node", "nodes.families", "nodes.machinery", "nodes.run", "nodes.contract", "nodes.settings", "toma_core")
"""The pack's layers, top to bottom (nodes/__init__.py); contract and settings both stand for the
shared vocabulary (settings may not import contract, nor contract settings)."""


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every module of the pack."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict) -> set[str]:
    """The pack modules an import statement of `module` loads (a name imported from a package counts
    as its submodule when there is one, else as the package)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        base = module.split(".")[: len(module.split(".")) - (0 if is_package else 1)]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    names = {f"{target}.{alias.name}" for alias in node.names}
    return {name if name in known else target for name in names} & known.keys()


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= imported(module, is_package, node, known)
        graph[module] = edges - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "nodes.families.registry" in graph and "nodes.families.flux" in graph["nodes.families.registry"]
    assert "toma_core.plan" in graph


def test_no_import_circle_deferred_imports_included() -> None:
    assert circles(import_graph()) == []


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_toma_core_imports_nothing_from_nodes() -> None:
    graph = import_graph()
    assert not {m: sorted(d) for m, d in graph.items() if m.startswith("toma_core") and any(x.startswith("nodes") for x in d)}


def layer(module: str) -> int | None:
    """The index of `module`'s layer in LAYERS (None: a package __init__ of nodes itself)."""
    return next((i for i, top in enumerate(LAYERS) if module == top or module.startswith(top + ".")), None)


def test_every_module_belongs_to_a_layer() -> None:
    assert [m for m in import_graph() if layer(m) is None] == ["nodes"]


def test_imports_go_only_down_the_layers() -> None:
    """A layer imports only from the layers below it (or its own folder)."""
    upward = [
        f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
        if layer(m) is not None and layer(d) is not None and layer(d) < layer(m)
    ]
    assert not upward, upward
