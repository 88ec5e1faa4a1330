"""Release metadata the Comfy Registry and ComfyUI Manager read: pyproject.toml, requirements.txt,
the icon, the changelog. Rules from docs.comfy.org/registry/specifications and comfy-cli's parser.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python >= 3.11")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
COMFY = PYPROJECT["tool"]["comfy"]

NODE_ID = re.compile(r"^[A-Za-z](?:[A-Za-z0-9]|[-_.](?=[A-Za-z0-9]))*$")
SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
VERSION_PART = re.compile(r"^(?:(==|>=|<=|!=|~=|>|<|=)\s*)?\d+\.\d+\.\d+$")
SHIPPED_BY_COMFYUI = {"torch", "torchvision", "torchaudio"}
REQUIREMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def requirement_names(lines: list[str]) -> set[str]:
    return {REQUIREMENT_NAME.match(line).group(0).lower() for line in lines}


def requirements_txt() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_project_identity():
    assert NODE_ID.match(PROJECT["name"]) and len(PROJECT["name"]) < 100
    assert SEMVER.match(PROJECT["version"]), PROJECT["version"]
    assert PROJECT["description"]
    assert PROJECT["license"] == {"file": "LICENSE"}
    assert "GNU GENERAL PUBLIC LICENSE" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]
    assert PROJECT["urls"]["Repository"].startswith("https://")
    assert PROJECT["urls"]["Issues"].startswith("https://")


def test_dependencies_leave_torch_to_comfyui_and_match_requirements_txt():
    declared = PROJECT["dependencies"]
    assert not requirement_names(declared) & SHIPPED_BY_COMFYUI
    assert sorted(requirements_txt()) == sorted(declared)


def test_only_the_core_library_is_an_installable_package():
    assert PYPROJECT["tool"]["setuptools"]["packages"] == ["toma_core"]


def test_registry_table():
    assert COMFY["PublisherId"] and COMFY["DisplayName"]
    icon_url = COMFY["Icon"]
    assert icon_url.startswith("https://")
    local = ROOT / icon_url.split("/main/", 1)[1]
    assert local.is_file(), f"Icon URL points at {local}, which is not committed"
    assert local.read_bytes().startswith(b"\x89PNG")
    for part in COMFY["requires-comfyui"].split(","):
        assert VERSION_PART.match(part.strip()), COMFY["requires-comfyui"]


def test_changelog_has_the_current_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{PROJECT['version']}]" in changelog
