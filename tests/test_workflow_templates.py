"""Every example workflow is a template ComfyUI can serve: valid UI-format JSON using only core node
types and ours, consistent links, and a same-name .jpg thumbnail (shown by the template browser).

tests/test_example_workflows.py checks the Flux workflow's contents; this file checks whatever
workflows exist, so a new one (SDXL, ...) is covered the moment it is added.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from workflow_check import PATCH_NODES, check_workflow, unconnected_required_inputs

EXAMPLES = Path(__file__).resolve().parents[1] / "example_workflows"
WORKFLOWS = sorted(EXAMPLES.glob("*.json"))
JPEG_MAGIC = b"\xff\xd8\xff"
MAX_THUMBNAIL_BYTES = 300_000

BASIC_WIDGETS = 6  # ratio, tile_size, start_percent, end_percent, recompute_every, merge_every
ADVANCED_WIDGETS = BASIC_WIDGETS + 10  # blocks, min_tokens, similarity, temperature, budget, proportional_attention, scope, verbose, unmerge, tile_frames
WIDGET_COUNTS = {"ToMAPatch": BASIC_WIDGETS, "ToMAPatchAdvanced": ADVANCED_WIDGETS}


def test_there_are_example_workflows():
    assert WORKFLOWS, f"no example workflows in {EXAMPLES}"
    assert (EXAMPLES / "flux_toma.json") in WORKFLOWS


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


def test_no_orphan_thumbnails():
    stems = {path.stem for path in WORKFLOWS}
    orphans = [jpg.name for jpg in EXAMPLES.glob("*.jpg") if jpg.stem not in stems]
    assert not orphans, f"thumbnails without a workflow: {orphans}"


SAMPLER_WIDGETS = {"KSampler": {"steps": 2, "cfg": 3}, "KSamplerAdvanced": {"steps": 3, "cfg": 4}, "ToMACompare": {"steps": 2, "cfg": 3}}
"""Index of steps and cfg in the core samplers' (and ToMA Compare's) widgets_values."""
TOMA_WIDGETS = {"ratio": 0, "tile_size": 1, "start_percent": 2}
"""Index of the settings a note quotes in the ToMA nodes' widgets_values (both nodes share the order)."""
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


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_notes_quote_the_workflows_own_settings(path):
    """A template's note that quotes cfg, steps or a ToMA setting (a prediction's command, the
    settings it describes) quotes the values the workflow's samplers and ToMA nodes run."""
    workflow = check_workflow(path)
    notes = [" ".join(map(str, n["widgets_values"])) for n in workflow["nodes"] if n["type"] in ("Note", "MarkdownNote")]
    for setting, value in (q for note in notes for q in _quoted_settings(note)):
        assert _widget_values(workflow, setting) == {value}, f"{path.name}: the note quotes {setting} {value:g}, the workflow runs {_widget_values(workflow, setting)}"
