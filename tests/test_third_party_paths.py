"""Where the compat tests look for the real third-party packs, in both places this pack lives: a
clone beside ../shared/, and ComfyUI/custom_nodes/ComfyUI-ToMA; TOMA_THIRD_PARTY overrides both.
The skip (or failure) reason names the folder that was looked in; the KJNodes snapshot follows the
ComfyUI version."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import third_party


def _comfy_tree(root: Path) -> Path:
    """A folder that comfy_env.is_comfy_root accepts, with the pack in its custom_nodes/."""
    (root / "comfy").mkdir(parents=True)
    (root / "comfy" / "model_management.py").write_text("")
    (root / "nodes.py").write_text("")
    pack = root / "custom_nodes" / "ComfyUI-ToMA"
    pack.mkdir(parents=True)
    return pack


def test_clone_looks_in_shared_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOMA_THIRD_PARTY", raising=False)
    monkeypatch.setattr(third_party, "PACK_ROOT", tmp_path / "work" / "ComfyUI-ToMA")
    assert third_party.search_folder() == tmp_path / "work" / "shared" / "third_party"


def test_inside_comfyui_looks_in_custom_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOMA_THIRD_PARTY", raising=False)
    pack = _comfy_tree(tmp_path / "ComfyUI")
    monkeypatch.setattr(third_party, "PACK_ROOT", pack)
    assert third_party.search_folder() == tmp_path / "ComfyUI" / "custom_nodes"
    (pack.parent / third_party.TEACACHE).mkdir()
    assert third_party.pack_dir(third_party.TEACACHE) == pack.parent / third_party.TEACACHE


def test_env_overrides_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOMA_THIRD_PARTY", str(tmp_path / "packs"))
    monkeypatch.setattr(third_party, "PACK_ROOT", _comfy_tree(tmp_path / "ComfyUI"))
    assert third_party.search_folder() == tmp_path / "packs"


def test_missing_pack_names_the_folder_looked_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOMA_THIRD_PARTY", raising=False)
    monkeypatch.setattr(third_party, "PACK_ROOT", _comfy_tree(tmp_path / "ComfyUI"))
    folder = tmp_path / "ComfyUI" / "custom_nodes"
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as caught:
        third_party.pack_dir(third_party.GGUF)
    message = str(caught.value)
    assert f"{third_party.GGUF} not found in {folder}" in message and "TOMA_THIRD_PARTY" in message
    assert "shared" not in message


def test_kjnodes_snapshot_follows_the_comfyui_version() -> None:
    assert third_party.kjnodes("0.3.64") == third_party.KJNODES
    assert third_party.kjnodes("0.33.0") == third_party.KJNODES_2026
    assert third_party.kjnodes("1.2.0") == third_party.KJNODES_2026
    assert third_party.kjnodes("unknown") == third_party.KJNODES_2026
