"""Every example workflow is a template ComfyUI can serve: valid UI-format JSON using only core node
types and ours, consistent links, and a same-name .jpg thumbnail (shown by the template browser), as
ComfyUI's own templates are: a file name that reads as the title the browser shows, a first note that
describes the template, and each loader's download links (`properties.models`).

tests/test_example_workflows.py checks the Flux workflow's contents; this file checks whatever
workflows exist, so a new one (SDXL, ...) is covered the moment it is added.
"""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from pathlib import Path

import pytest
from workflow_check import (
    CORE_NODES,
    EXAMPLES,
    FLUX_TEMPLATE,
    MODEL_FILE_WIDGETS,
    PACK_NODES,
    PATCH_NODES,
    check_workflow,
    model_link_problems,
    unconnected_required_inputs,
)

WORKFLOWS = sorted(EXAMPLES.glob("*.json"))
JPEG_MAGIC = b"\xff\xd8\xff"
MAX_THUMBNAIL_BYTES = 300_000

BASIC_WIDGETS = 6  # ratio, tile_size, start_percent, end_percent, recompute_every, merge_every
ADVANCED_WIDGETS = BASIC_WIDGETS + 12  # blocks, min_tokens, similarity, temperature, budget, proportional_attention, scope, verbose, unmerge, tile_frames, destinations, destination_penalty
WIDGET_COUNTS = {"ToMAPatch": BASIC_WIDGETS, "ToMAPatchAdvanced": ADVANCED_WIDGETS}


def test_there_are_example_workflows():
    assert WORKFLOWS, f"no example workflows in {EXAMPLES}"
    assert (EXAMPLES / f"{FLUX_TEMPLATE}.json") in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid_and_uses_only_core_and_pack_nodes(path):
    workflow = check_workflow(path)
    assert not unconnected_required_inputs(workflow)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_has_a_jpeg_thumbnail(path):
    thumbnail = path.with_suffix(".jpg")
    assert thumbnail.is_file(), f"{thumbnail.name} missing: run python -m bench.publish.make_thumbnails"
    data = thumbnail.read_bytes()
    assert data.startswith(JPEG_MAGIC), f"{thumbnail.name} is not a JPEG"
    assert len(data) <= MAX_THUMBNAIL_BYTES, f"{thumbnail.name} is {len(data)} bytes"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_toma_nodes_have_one_value_per_widget(path):
    workflow = check_workflow(path)
    for node in workflow["nodes"]:
        if node["type"] in PATCH_NODES:
            values = node["widgets_values"]
            assert len(values) == WIDGET_COUNTS[node["type"]], f"{path.name} node {node['id']}: {values}"
            ratio, tile_size = values[:2]
            assert 0 <= ratio < 1 and tile_size >= 1


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_toma_nodes_of_a_template_run_the_same_settings(path):
    """A template with a ToMA node per model (Wan 2.2's two experts) sets them alike, so its note,
    its thumbnail and the first node's settings describe them all; a comparison template may differ."""
    if "compare" in path.stem:
        pytest.skip("a comparison template sets its ToMA nodes apart")
    settings = {(n["type"], json.dumps(n["widgets_values"])) for n in check_workflow(path)["nodes"] if n["type"] in PACK_NODES}
    assert len(settings) == 1, f"{path.name}: its ToMA nodes differ: {sorted(settings)}"


def test_no_orphan_thumbnails():
    stems = {path.stem for path in WORKFLOWS}
    orphans = [jpg.name for jpg in EXAMPLES.glob("*.jpg") if jpg.stem not in stems]
    assert not orphans, f"thumbnails without a workflow: {orphans}"


SAMPLER_WIDGETS = {"KSampler": {"steps": 2, "cfg": 3}, "KSamplerAdvanced": {"steps": 3, "cfg": 4}, "ToMACompare": {"steps": 2, "cfg": 3}}
"""Index of steps and cfg in the core samplers' (and ToMA Compare's) widgets_values."""
TOMA_WIDGETS = {"ratio": 0, "tile_size": 1, "start_percent": 2}
"""Index of the settings a note quotes in the ToMA nodes' widgets_values (both nodes share the order)."""
ADVANCED_WIDGETS = {"scope": 11, "tile_frames": 15}
"""Index of settings only ToMA Patch (Advanced) shows in its widgets_values (the basic node runs scope
"block" and the default tile_frames)."""
ADVANCED_QUOTED = re.compile(r"\b(scope) (block|attention|keys_values)\b|\b(tile_frames) (\d+)\b")
"""A note's `scope keys_values` or `tile_frames 4` (not a quoted option such as "scope 'attention'")."""
QUOTED = re.compile(r"--(cfg|steps|ratio|tile-size|start-percent) ([\d.]+)|\b(ratio|tile_size|start_percent) ([\d.]+)")


def _quoted_settings(note: str) -> list[tuple[str, float]]:
    """(setting, value) of each `--cfg 6` / `--steps 20` / `ratio 0.5` / `tile_size 4` a note quotes."""
    return [((m.group(1) or m.group(3)).replace("-", "_"), float((m.group(2) or m.group(4)).rstrip(".")))
            for m in QUOTED.finditer(note)]


def _widget_values(workflow: dict, setting: str) -> set[float]:
    """The values `setting` has on the workflow's samplers (cfg, steps) or ToMA nodes."""
    if setting in TOMA_WIDGETS:
        return {float(n["widgets_values"][TOMA_WIDGETS[setting]]) for n in workflow["nodes"] if n["type"] in PATCH_NODES}
    return {float(n["widgets_values"][SAMPLER_WIDGETS[n["type"]][setting]]) for n in workflow["nodes"] if n["type"] in SAMPLER_WIDGETS}


def _scope(node: dict) -> str:
    return node["widgets_values"][ADVANCED_WIDGETS["scope"]] if node["type"] == "ToMAPatchAdvanced" else "block"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_notes_quote_the_advanced_nodes_own_scope_and_tile_frames(path):
    """A note that quotes the scope or tile_frames of its ToMA nodes quotes the values they run."""
    workflow = check_workflow(path)
    toma = [n for n in workflow["nodes"] if n["type"] in PACK_NODES]
    running = {"scope": {_scope(n) for n in toma},
               "tile_frames": {str(n["widgets_values"][ADVANCED_WIDGETS["tile_frames"]]) for n in toma if n["type"] == "ToMAPatchAdvanced"}}
    for match in (m for note in _notes(workflow) for m in ADVANCED_QUOTED.finditer(note)):
        setting, value = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        assert running[setting] == {value}, f"{path.name}: the note quotes {setting} {value}, the workflow runs {running[setting]}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_notes_quote_the_workflows_own_settings(path):
    """A template's note that quotes cfg, steps or a ToMA setting (a prediction's command, the
    settings it describes) quotes the values the workflow's samplers and ToMA nodes run."""
    workflow = check_workflow(path)
    notes = [" ".join(map(str, n["widgets_values"])) for n in workflow["nodes"] if n["type"] in ("Note", "MarkdownNote")]
    for setting, value in (q for note in notes for q in _quoted_settings(note)):
        assert _widget_values(workflow, setting) == {value}, f"{path.name}: the note quotes {setting} {value:g}, the workflow runs {_widget_values(workflow, setting)}"


TITLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .-]* - [A-Za-z0-9 .-]*[A-Za-z0-9]")
"""A template's file stem, which ComfyUI's template browser shows as its title: "<model> - <what it
does>", in letters, digits, spaces, dots and hyphens only (nothing a URL, Windows or a CSS attribute
selector treats specially; the frontend fetches `/api/workflow_templates/<pack>/<stem>.json`)."""


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_file_name_reads_as_a_title(path):
    assert TITLE.fullmatch(path.stem), f"{path.name}: name templates '<model> - <what it does>' ({TITLE.pattern})"


def _notes(workflow: dict) -> list[str]:
    return [str(n["widgets_values"][0]) for n in workflow["nodes"] if n["type"] in ("Note", "MarkdownNote")]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_first_note_describes_the_template(path):
    """The first note's first paragraph (what a user reads when the template opens) names the model
    of the template's title and the models/ folders its loaders read."""
    workflow = check_workflow(path)
    notes = _notes(workflow)
    assert notes, f"{path.name} has no note"
    first = notes[0].split("\n\n")[0]
    model = path.stem.split(" - ")[0]
    assert model.lower() in first.lower(), f"{path.name}: the first note's first paragraph does not name {model!r}: {first!r}"
    folders = {MODEL_FILE_WIDGETS[n["type"]][0] for n in workflow["nodes"] if n["type"] in MODEL_FILE_WIDGETS}
    missing = sorted(folder for folder in folders if folder not in first)
    assert not missing, f"{path.name}: the first note's first paragraph does not say where the files go: {missing}"


def test_every_core_loader_has_its_models_folder():
    """A loader added to the core types a template may use needs its models/ folder for the link check."""
    loaders = {kind for kind in CORE_NODES if "Loader" in kind}
    assert loaders <= MODEL_FILE_WIDGETS.keys(), sorted(loaders - MODEL_FILE_WIDGETS.keys())


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_loaders_link_the_files_they_load(path):
    workflow = check_workflow(path)
    assert any(n["type"] in MODEL_FILE_WIDGETS for n in workflow["nodes"]), f"{path.name} loads no model"
    assert not model_link_problems(workflow)


@pytest.mark.parametrize("field, change", [
    ("name", lambda value: "other.safetensors"),
    ("directory", lambda value: "checkpoints"),
    ("url", lambda value: value.replace("https:", "http:")),
    ("url", lambda value: value.replace("/ae.safetensors", "/vae.safetensors")),
], ids=["name", "directory", "http", "other-file"])
def test_link_check_can_fail(field, change):
    workflow = check_workflow(EXAMPLES / f"{FLUX_TEMPLATE}.json")
    entry = next(n for n in workflow["nodes"] if n["type"] == "VAELoader")["properties"]["models"][0]
    entry[field] = change(entry[field])
    assert model_link_problems(workflow)


def _links_in(graph: dict, found: dict[str, set[tuple[str, str]]]) -> None:
    for node in graph.get("nodes", []):
        for entry in (node.get("properties") or {}).get("models") or []:
            found.setdefault(entry["name"], set()).add((entry["url"], entry["directory"]))
    for subgraph in (graph.get("definitions") or {}).get("subgraphs", []):
        _links_in(subgraph, found)


@cache
def comfyui_template_links() -> dict[str, set[tuple[str, str]]]:
    """File name -> the (url, directory) pairs ComfyUI's own templates link it with, from the
    installed templates package (comfyui_workflow_templates_json on ComfyUI 0.33, the templates
    folder of comfyui_workflow_templates before); empty where neither is installed."""
    found: dict[str, set[tuple[str, str]]] = {}
    for package in ("comfyui_workflow_templates_json", "comfyui_workflow_templates"):
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted((Path(folder) / "templates").glob("*.json")):
                graph = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(graph, dict):
                    _links_in(graph, found)
    return found


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_links_are_the_ones_comfyuis_own_templates_give(path):
    """Each file's link is one ComfyUI's installed templates give the same file name, where they link
    every file of the template (an older templates package, e.g. 0.3.64's, predates Flux.2 and Z-Image)."""
    known = comfyui_template_links()
    ours = {(e["name"], e["url"], e["directory"]) for n in check_workflow(path)["nodes"] for e in n.get("properties", {}).get("models", [])}
    unknown = sorted(name for name, _, _ in ours if name not in known)
    if unknown:
        pytest.skip(f"the installed ComfyUI templates (if any) link none of {unknown}")
    wrong = [(name, url, folder, sorted(known[name])) for name, url, folder in ours if (url, folder) not in known[name]]
    assert not wrong, wrong


def jpeg_comment(data: bytes) -> str:
    """The text of a JPEG's comment (COM, 0xFFFE) segment; "" without one. Segments before the scan
    (SOS, 0xFFDA) are a marker and a big-endian length that counts itself."""
    at = 2
    while data[at] == 0xFF and data[at + 1] != 0xDA:
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if data[at + 1] == 0xFE:
            return data[at + 4:at + 2 + length].decode("utf-8")
        at += 2 + length
    return ""


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_thumbnail_caption_is_the_templates_name_and_settings(path):
    """bench/publish/make_thumbnails.py stores the caption it draws as the JPEG's comment: the title is
    the template's name and the settings are its ToMA node's (regenerate after changing either)."""
    workflow = check_workflow(path)
    caption = jpeg_comment(path.with_suffix(".jpg").read_bytes())
    assert caption.split("\n")[0] == path.stem, f"{path.name}: caption {caption!r}; run python -m bench.publish.make_thumbnails"
    quoted = dict(_quoted_settings(caption))
    assert quoted.keys() == TOMA_WIDGETS.keys(), caption
    for setting, value in quoted.items():
        assert _widget_values(workflow, setting) == {value}, f"{path.name}: thumbnail says {setting} {value:g}; run python -m bench.publish.make_thumbnails"
    scope = _scope(next(n for n in workflow["nodes"] if n["type"] in PACK_NODES))
    assert (f"scope {scope}" in caption) == (scope != "block"), f"{path.name}: the caption does not say scope {scope}: {caption!r}"
