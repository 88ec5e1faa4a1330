"""Every example workflow is a template ComfyUI can serve: valid UI-format JSON using only core node
types and ours, consistent links, and a same-name .jpg thumbnail (shown by the template browser).

tests/test_example_workflows.py checks the Flux workflow's contents; this file checks whatever
workflows exist, so a new one (SDXL, ...) is covered the moment it is added.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from workflow_check import PACK_NODES, check_workflow, unconnected_required_inputs

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
        if node["type"] in PACK_NODES:
            values = node["widgets_values"]
            assert len(values) == WIDGET_COUNTS[node["type"]], f"{path.name} node {node['id']}: {values}"
            ratio, tile_size = values[:2]
            assert 0 <= ratio < 1 and tile_size >= 1


def test_no_orphan_thumbnails():
    stems = {path.stem for path in WORKFLOWS}
    orphans = [jpg.name for jpg in EXAMPLES.glob("*.jpg") if jpg.stem not in stems]
    assert not orphans, f"thumbnails without a workflow: {orphans}"
