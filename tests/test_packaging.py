"""Release metadata the Comfy Registry and ComfyUI Manager read (pyproject.toml, requirements.txt,
the icon, the changelog) and the archive `comfy node publish` uploads. Rules from
docs.comfy.org/registry/specifications and comfy-cli's parser and packer (comfy_cli.file_utils).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import warnings
import zipfile
from pathlib import Path

import pytest

from harness.pack import pack_module

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


def test_description_is_a_sentence_naming_every_family_as_the_nodes_do():
    """The Registry's and Manager's one line: the registry's families (node_models(), the
    nodes' own description) in its order, in one sentence."""
    description = PROJECT["description"]
    registry = pack_module("nodes.families.registry")
    unnamed = [f.name for f in registry.FAMILIES if f.node_models not in description]
    assert not unnamed, f"pyproject's description leaves out {unnamed}: write registry.node_models() into it"
    assert f" for {registry.node_models()}: " in description, "pyproject's description: paste registry.node_models()"
    assert description[0].isupper() and description.endswith(".") and "\n" not in description
    outside_brackets = re.sub(r"\([^)]*\)", "", description)  # "(incl. Kontext, Fill)", "(Lu et al., ...)"
    assert not re.search(r"[.!?]\s+[A-Z]", outside_brackets), "one sentence"


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


# The Registry archive. comfy-cli (`comfy node pack` / `comfy node publish`, comfy_cli.file_utils.zip_files)
# archives the git-tracked files (every file outside a git checkout) minus the gitwildmatch patterns of
# .comfyignore; `[tool.comfy] includes` would add untracked paths back (none here).

DEVELOPMENT_ONLY = ("tests/", "bench/", "harness/", "fixtures/", ".ci/", ".github/")
LOADED_FOLDERS = ("nodes/", "toma_core/", "example_workflows/")
ROOT_FILES = {"__init__.py", "pyproject.toml", "requirements.txt", "LICENSE", "README.md", "CHANGELOG.md"}


def candidate_files() -> list[str]:
    """What comfy-cli starts from: `git ls-files` in a checkout, else every file of the tree."""
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        listed = []
    tracked = [name for name in listed if name.strip() and (ROOT / name).is_file()]
    if tracked:
        return tracked
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.relative_to(ROOT).parts]


def comfyignore_patterns() -> list[str]:
    """.comfyignore read as comfy-cli reads it: stripped lines, blank and '#' lines dropped."""
    lines = (ROOT / ".comfyignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def archive_files() -> set[str]:
    pathspec = pytest.importorskip("pathspec", reason="the archive rules need pathspec: pip install -e '.[test]'")
    with warnings.catch_warnings():  # pathspec 1.x deprecates the pattern style comfy-cli still uses
        warnings.simplefilter("ignore", DeprecationWarning)
        spec = pathspec.PathSpec.from_lines("gitwildmatch", comfyignore_patterns())
        return {name for name in candidate_files() if not spec.match_file(name)}


def icon_path() -> str:
    return COMFY["Icon"].split("/main/", 1)[1]


def test_archive_is_what_comfyui_loads_and_nothing_else():
    files = candidate_files()
    pages = {name for name in files if name.startswith("docs/") and name.endswith(".md")}
    pictures = {name for name in readme_targets() if name.startswith("assets/")}
    expected = ROOT_FILES | {icon_path()} | pictures | pages | {name for name in files if name.startswith(LOADED_FOLDERS)}
    shipped = archive_files()
    assert shipped == expected, f"missing: {sorted(expected - shipped)}; not wanted: {sorted(shipped - expected)}"
    assert not [name for name in shipped if name.startswith(DEVELOPMENT_ONLY)]
    assert sorted(name for name in shipped if name.startswith("assets/")) == sorted({icon_path()} | pictures)


README_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)|<img\s[^>]*src=\"([^\"]+)\"")
CODE_BLOCK = re.compile(r"^```.*?^```", flags=re.S | re.M)


def readme_targets() -> set[str]:
    """The repository files README.md's relative links and pictures point at (anchors dropped)."""
    text = CODE_BLOCK.sub("", (ROOT / "README.md").read_text(encoding="utf-8"))
    targets = {(link or image).partition("#")[0] for link, image in README_LINK.findall(text)}
    return {os.path.normpath(t).replace(os.sep, "/") for t in targets if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t)}


def test_readme_links_resolve_inside_the_archive():
    """A Registry / Manager install gets the archive: every relative link and picture of its
    README.md reaches a file in it (absolute https links are the browser's)."""
    targets = readme_targets()
    assert any(t.endswith(".md") for t in targets) and any(t.endswith(".png") for t in targets), sorted(targets)
    missing = sorted(targets - archive_files())
    assert not missing, f"README.md links to files the Registry archive leaves out: {missing}"


def test_archive_is_small():
    size = sum((ROOT / name).stat().st_size for name in archive_files())
    everything = sum((ROOT / name).stat().st_size for name in candidate_files())
    assert size < 2_000_000, f"the Registry archive holds {size} bytes"
    assert size < everything / 10


def module_files(parts: list[str]) -> set[str]:
    """The files that can hold the module at this repository path."""
    return {"/".join(parts) + ".py", "/".join(parts + ["__init__.py"])}


def imports_of(path: str) -> list[tuple[int, set[str] | str]]:
    """Per import of a packed .py file, (line, the files that could satisfy it) for a relative import,
    or (line, top-level name) for an absolute one."""
    package = path.split("/")[:-1]
    found: list[tuple[int, set[str] | str]] = []
    for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.append((node.lineno, module_files(base + node.module.split("."))))
            else:  # `from . import name`: a submodule, or a name the package's __init__ defines
                found += [(node.lineno, module_files(base + [alias.name]) | {"/".join(base + ["__init__.py"])}) for alias in node.names]
    return found


def test_packed_code_imports_only_packed_modules():
    shipped = archive_files()
    unresolved = []
    for path in sorted(name for name in shipped if name.endswith(".py")):
        for line, target in imports_of(path):
            if isinstance(target, str):
                assert target not in {"bench", "tests"}, f"{path}:{line} imports {target}"
            elif not target & shipped:
                unresolved.append(f"{path}:{line} -> {sorted(target)}")
    assert not unresolved, f"imports of files the archive leaves out: {unresolved}"


def comfy_cli_archive(tmp_path: Path) -> Path:
    """The archive comfy-cli's own packer builds: the one .ci/run made with `comfy node pack`
    (TOMA_NODE_ZIP), else comfy_cli.file_utils.zip_files run here when comfy-cli is importable."""
    if os.environ.get("TOMA_NODE_ZIP"):
        return Path(os.environ["TOMA_NODE_ZIP"])
    file_utils = pytest.importorskip("comfy_cli.file_utils", reason="comfy-cli not installed (.ci/run installs it when it can)")
    archive = tmp_path / "node.zip"
    cwd = os.getcwd()
    os.chdir(ROOT)  # zip_files packs the current folder
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            file_utils.zip_files(archive)
    finally:
        os.chdir(cwd)
    return archive


def test_comfy_cli_packs_the_same_files(tmp_path):
    with zipfile.ZipFile(comfy_cli_archive(tmp_path)) as packed:
        names = set(packed.namelist())
    assert names == archive_files()


def test_readme_states_the_ci_test_command():
    """.ci/run runs the test command written in README.md: the line after its marker comment."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = next(i for i, line in enumerate(script) if line.strip().startswith("# The test command, as written in README.md"))
    command = script[marker + 1].strip()
    assert command.startswith("python -m pytest")
    assert command in (ROOT / "README.md").read_text(encoding="utf-8")
