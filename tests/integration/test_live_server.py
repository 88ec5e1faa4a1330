"""The pack as a user gets it: a real ComfyUI server with the pack in its custom_nodes/, checked over HTTP.

Starts ``main.py --cpu --listen 127.0.0.1 --port <free> --base-directory <tmp>`` from the ComfyUI tree
with this interpreter (``sys.executable``), the pack symlinked as ``<tmp>/custom_nodes/ComfyUI-ToMA``,
waits (bounded) until ``/object_info`` answers, then checks:

- both nodes are registered with their inputs in order, defaults, ranges, options and tooltips
  (expected values come from ``nodes/settings.py`` and ``toma_core``, so node and settings agree);
- ``/workflow_templates`` lists exactly our example workflows, and the server hands out each
  workflow and its thumbnail unchanged at the URL the frontend asks for (the file name
  percent-encoded, as a browser sends its spaces);
- every node type in our workflows is registered (templates of models this ComfyUI lacks skip by
  name: ``live_prompts.NEEDS_CLASS``), and our nodes' widget values fit their inputs;
- the models/ folder each loader's download link names is one the server has (``/models``).

The server (``live_comfy.py``, session fixture ``live_server`` in conftest.py) is stopped in the
fixture's finaliser, also when a test or the start-up fails. Skipped (with the reason) without an
importable ComfyUI, like the other integration tests. Start-up takes ~10 s on an idle machine;
``TOMA_LIVE_SERVER_TIMEOUT`` (seconds, default 240) bounds the wait.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from live_comfy import PACK_DIR_NAME, PACK_ROOT, LiveServer, get_json, http_get
from live_prompts import missing_model_reason
from workflow_check import FRONTEND_ONLY, MODEL_FILE_WIDGETS

from harness.pack import pack_module

EXAMPLES = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
SOCKET_TYPES = {"MODEL", "CLIP", "VAE", "CONDITIONING", "LATENT", "IMAGE", "MASK", "CONTROL_NET"}


# ------------------------------------------------------------------------------------------------
# Fixtures (``live_server`` is in conftest.py, shared with the workflow and browser tests)


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer) -> dict[str, Any]:
    return get_json(f"{live_server.url}/object_info")


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    """Expected defaults and ranges, from the pure-Python settings module and toma_core."""
    settings = pack_module("nodes.settings")
    core = pack_module("toma_core")
    defaults = settings.ToMASettings()
    schedule = core.MergeSchedule()
    return {
        "basic": {
            "ratio": ("FLOAT", settings.NODE_RATIO, *core.RATIO_RANGE),
            "tile_size": ("INT", settings.NODE_TILE_SIZE, *settings.TILE_SIZE_RANGE),
            "start_percent": ("FLOAT", settings.NODE_START_PERCENT, 0.0, 1.0),
            "end_percent": ("FLOAT", schedule.end_percent, 0.0, 1.0),
            "recompute_every": ("INT", schedule.recompute_every, 1, None),
        },
        "advanced": {
            "blocks": ("STRING", defaults.blocks, None, None),
            "min_tokens": ("STRING", settings.NODE_MIN_TOKENS, None, None),
            "similarity": ("COMBO", defaults.similarity, tuple(core.SIMILARITIES), None),
            "temperature": ("FLOAT", defaults.temperature, *settings.TEMPERATURE_RANGE),
            "budget": ("COMBO", defaults.budget, tuple(core.BUDGETS), None),
            "proportional_attention": ("BOOLEAN", defaults.proportional_attention, None, None),
            "scope": ("COMBO", settings.NODE_SCOPE, tuple(settings.SCOPES), None),
            "verbose": ("BOOLEAN", defaults.verbose, None, None),
        },
        "last": {"merge_every": ("INT", schedule.merge_every, 1, None)},  # appended: saved workflows keep their values
        "advanced_last": {
            "unmerge": ("COMBO", defaults.unmerge, tuple(core.UNMERGES), None),
            "tile_frames": ("INT", defaults.tile_frames, *settings.TILE_FRAMES_RANGE),
            "destinations": ("COMBO", defaults.destinations, tuple(core.DESTINATIONS), None),
            "destination_penalty": ("FLOAT", defaults.destination_penalty, *core.PENALTY_RANGE),
        },
    }


# ------------------------------------------------------------------------------------------------
# Helpers on object_info entries


def input_spec(entry: dict[str, Any], name: str) -> tuple[str, dict[str, Any], list | None]:
    """(type, options dict, combo choices or None) of one input of an /object_info entry."""
    inputs = {**entry["input"].get("required", {}), **entry["input"].get("optional", {})}
    kind, options = inputs[name][0], (inputs[name][1] if len(inputs[name]) > 1 else {})
    if isinstance(kind, list):  # V1-style combo: the choices are the type
        return "COMBO", options, kind
    return kind, options, options.get("options") if kind == "COMBO" else None


def input_names(entry: dict[str, Any]) -> list[str]:
    order = entry.get("input_order", {})
    if order:
        return list(order.get("required", [])) + list(order.get("optional", []))
    return list(entry["input"].get("required", {})) + list(entry["input"].get("optional", {}))


def widget_names(entry: dict[str, Any]) -> list[str]:
    return [name for name in input_names(entry) if input_spec(entry, name)[0] not in SOCKET_TYPES]


def check_input(entry: dict[str, Any], name: str, spec: tuple) -> None:
    kind, default, low, high = spec
    actual_kind, options, choices = input_spec(entry, name)
    assert actual_kind == kind, f"{name}: type {actual_kind}"
    actual_default = options.get("default")
    same = actual_default == pytest.approx(default) if isinstance(default, float) else actual_default == default
    assert same, f"{name}: default {actual_default!r}, expected {default!r}"
    assert options.get("tooltip", "").strip(), f"{name}: no tooltip"
    if kind == "COMBO":
        assert tuple(choices) == low, f"{name}: options {choices}"
        return
    if low is not None:
        assert options.get("min") == pytest.approx(low), f"{name}: min {options.get('min')}"
    if high is not None:
        assert options.get("max") == pytest.approx(high), f"{name}: max {options.get('max')}"


# ------------------------------------------------------------------------------------------------
# Tests


def test_server_loaded_the_pack_from_custom_nodes(live_server: LiveServer, object_info: dict[str, Any]):
    assert "ToMAPatch" in object_info, f"ToMAPatch not registered; server log:\n{live_server.log_tail()}"
    assert PACK_DIR_NAME in object_info["ToMAPatch"].get("python_module", "")
    ours = [line for line in live_server.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            if PACK_DIR_NAME in line]
    assert any("seconds" in line for line in ours), "no import-time line for the pack"
    failures = [line for line in ours if "IMPORT FAILED" in line or "Cannot import" in line]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("node_id, groups, display_name", [
    ("ToMAPatch", ("basic", "last"), "ToMA Patch"),
    ("ToMAPatchAdvanced", ("basic", "advanced", "last", "advanced_last"), "ToMA Patch (Advanced)"),
])
def test_node_inputs_defaults_ranges_and_tooltips(object_info, expected, node_id, groups, display_name):
    entry = object_info[node_id]
    specs = {name: spec for group in groups for name, spec in expected[group].items()}
    assert input_names(entry) == ["model", *specs]
    assert input_spec(entry, "model")[0] == "MODEL"
    assert input_spec(entry, "model")[1].get("tooltip", "").strip()
    for name, spec in specs.items():
        check_input(entry, name, spec)
    assert entry["display_name"] == display_name
    assert entry["category"].startswith("model_patches")
    assert entry["description"].strip()
    assert entry["output"] == ["MODEL"]
    assert all(tip.strip() for tip in entry.get("output_tooltips", [""])), entry.get("output_tooltips")


def test_workflow_templates_lists_our_examples(live_server: LiveServer):
    templates = get_json(f"{live_server.url}/workflow_templates")
    assert PACK_DIR_NAME in templates, f"{templates}\n{live_server.log_tail()}"
    assert sorted(templates[PACK_DIR_NAME]) == sorted(path.stem for path in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_server_hands_out_workflow_and_thumbnail_unchanged(live_server: LiveServer, path: Path):
    base = f"{live_server.url}/api/workflow_templates/{quote(PACK_DIR_NAME)}"
    body, _ = http_get(f"{base}/{quote(path.name)}")
    assert json.loads(body) == json.loads(path.read_text(encoding="utf-8"))
    thumbnail = path.with_suffix(".jpg")
    body, content_type = http_get(f"{base}/{quote(thumbnail.name)}")
    assert body == thumbnail.read_bytes()
    assert content_type.startswith("image/jpeg")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_model_links_name_folders_the_server_has(live_server: LiveServer, path: Path):
    """ComfyUI's frontend looks a missing file up, and downloads it, in the link's ``directory``."""
    folders = set(get_json(f"{live_server.url}/models"))
    nodes = json.loads(path.read_text(encoding="utf-8"))["nodes"]
    linked = {entry["directory"] for node in nodes if node["type"] in MODEL_FILE_WIDGETS for entry in node["properties"]["models"]}
    assert linked and linked <= folders, f"{sorted(linked - folders)} not in /models: {sorted(folders)}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_workflow_node_type_is_registered(object_info, path: Path):
    reason = missing_model_reason(path.stem)  # Flux.2's nodes on 0.3.64
    if reason:
        pytest.skip(reason)
    workflow = json.loads(path.read_text(encoding="utf-8"))
    types = {node["type"] for node in workflow["nodes"]} - FRONTEND_ONLY
    missing = sorted(types - set(object_info))
    assert not missing, f"{path.name} uses node types the server does not know: {missing}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_toma_widget_values_fit_the_registered_inputs(object_info, path: Path):
    workflow = json.loads(path.read_text(encoding="utf-8"))
    toma_nodes = [node for node in workflow["nodes"] if node["type"] in ("ToMAPatch", "ToMAPatchAdvanced")]
    assert toma_nodes
    for node in toma_nodes:
        entry = object_info[node["type"]]
        names = widget_names(entry)
        assert len(node["widgets_values"]) == len(names), f"{path.name} node {node['id']}: {node['widgets_values']} vs {names}"
        for name, value in zip(names, node["widgets_values"]):
            kind, options, choices = input_spec(entry, name)
            if kind == "COMBO":
                assert value in choices, f"{name}={value!r} not in {choices}"
            elif kind in ("INT", "FLOAT"):
                assert options.get("min", value) <= value <= options.get("max", value), f"{name}={value!r}"
