"""The family registry (issue 14): the README's "Supported models" table is the registry's, every
family's adapter module exists, and no module of the package grows past the house limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.pack import PACK_ROOT, pack_module

registry = pack_module("nodes.registry")

MAX_LINES = 300
"""House rule (issue 14 point 4): no file of the package over about 300 lines."""


def test_readme_table_is_the_registry() -> None:
    readme = (PACK_ROOT / "README.md").read_text(encoding="utf-8")
    assert registry.readme_table() in readme, "README 'Supported models' table differs: paste registry.readme_table()"


def test_every_family_has_an_adapter_with_apply() -> None:
    names = [f.name for f in registry.FAMILIES]
    assert len(set(names)) == len(names)
    for family in registry.FAMILIES:
        module = pack_module(f"nodes.families.{family.adapter}")
        assert callable(module.apply), family.name
        assert family.classes and all(":" in path for path in family.classes), family.name


def test_missing_classes_resolve_to_none() -> None:
    assert registry.resolve("comfy_toma_no_such_module:Model") is None
    assert registry.resolve("pathlib:NoSuchClass") is None
    assert registry.resolve("pathlib:Path") is Path


@pytest.mark.parametrize("folder", ["nodes", "nodes/families", "nodes/machinery", "toma_core"])
def test_package_files_stay_small(folder: str) -> None:
    long = {p.name: n for p in (PACK_ROOT / folder).glob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"

