"""The family registry: the README's "Supported models" table is the registry's, every family has
an adapter module, a README row and a tiny-model test, and no module of the package grows past the
house limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.pack import PACK_ROOT, pack_module

registry = pack_module("nodes.families.registry")

MAX_LINES = 300
"""House rule: no file of the package over about 300 lines."""


def test_readme_table_is_the_registry() -> None:
    readme = (PACK_ROOT / "README.md").read_text(encoding="utf-8")
    assert registry.readme_table() in readme, "README 'Supported models' table differs: paste registry.readme_table()"


def test_every_family_has_an_adapter_with_apply() -> None:
    names = [f.name for f in registry.FAMILIES]
    assert len(set(names)) == len(names)
    for family in registry.FAMILIES:
        module = pack_module(f"nodes.families.{family.name}")
        assert callable(module.apply) and family.apply is module.apply, family.name
        assert family.classes and all(":" in path for path in family.classes), family.name


TINY_MODEL_TESTS = ("test_family_{}.py", "test_{}.py")
"""Where a family's tiny-model integration test lives in tests/integration/."""


@pytest.mark.parametrize("family", registry.FAMILIES, ids=lambda f: f.name)
def test_every_family_has_a_readme_row_and_a_tiny_model_test(family) -> None:
    """A registered family is documented (its README row) and run on a tiny model of its ComfyUI
    class in real ComfyUI (tests/integration/test_family_<name>.py, or test_<name>.py)."""
    readme = (PACK_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"\n| {family.title} | {family.models} |" in readme, f"{family.name}: no README row"
    found = [PACK_ROOT / "tests" / "integration" / name.format(family.name) for name in TINY_MODEL_TESTS]
    tests = [path for path in found if path.is_file()]
    assert tests, f"{family.name}: none of {[p.name for p in found]} in tests/integration"
    text = tests[0].read_text(encoding="utf-8")
    class_names = [path.partition(":")[2] for path in family.classes]
    assert "tiny" in text and any(name in text for name in class_names), f"{tests[0].name} builds no tiny {class_names}"


def test_missing_classes_resolve_to_none() -> None:
    assert registry.resolve("comfy_toma_no_such_module:Model") is None
    assert registry.resolve("pathlib:NoSuchClass") is None
    assert registry.resolve("pathlib:Path") is Path


@pytest.mark.parametrize("folder", ["nodes", "nodes/node", "nodes/run", "nodes/families", "nodes/machinery", "toma_core"])
def test_package_files_stay_small(folder: str) -> None:
    long = {p.name: n for p in (PACK_ROOT / folder).glob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"



@pytest.mark.parametrize("family", registry.FAMILIES, ids=lambda f: f.name)
def test_resolve_makes_auto_the_family_choice(family) -> None:
    """Scope "auto" becomes the family's own scope; an explicit scope stays as given."""
    settings = pack_module("nodes.settings")
    auto = family.resolve(settings.ToMASettings(scope="auto"))
    assert auto.scope == family.scope and auto.scope in settings.SCOPES and auto.scope != "auto"
    assert family.resolve(settings.ToMASettings(scope="attention")).scope == "attention"


def test_video_families_default_to_keys_values() -> None:
    """The scope study's decision (docs/quality.md): keys_values on the video families, block on the images."""
    assert {f.name for f in registry.FAMILIES if f.scope == "keys_values"} == {f.name for f in registry.FAMILIES if f.video}
