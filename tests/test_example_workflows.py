"""The example workflows are well-formed UI-format graphs using only core nodes and ours."""

from __future__ import annotations

import pytest
from workflow_check import EXAMPLES, FLUX_TEMPLATE, check_workflow, unconnected_required_inputs

from harness.pack import pack_module

FLUX = EXAMPLES / f"{FLUX_TEMPLATE}.json"


def test_flux_workflow_is_well_formed():
    workflow = check_workflow(FLUX)
    types = {node["type"] for node in workflow["nodes"]}
    assert {"UNETLoader", "DualCLIPLoader", "VAELoader", "ToMAPatch", "KSampler", "VAEDecode", "SaveImage", "Note"} <= types
    assert not unconnected_required_inputs(workflow)
    toma = next(node for node in workflow["nodes"] if node["type"] == "ToMAPatch")
    s = pack_module("nodes.settings")  # the node's defaults
    assert toma["widgets_values"] == [s.NODE_RATIO, s.NODE_TILE_SIZE, s.NODE_START_PERCENT, 1.0, 1, 1]
    sampler = next(node for node in workflow["nodes"] if node["type"] == "KSampler")
    model_link = sampler["inputs"][0]["link"]
    assert any(link[0] == model_link and link[1] == toma["id"] for link in workflow["links"])


def test_checker_catches_broken_links(tmp_path):
    import json

    workflow = json.loads(FLUX.read_text())
    workflow["links"][0][3] = 999
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(workflow))
    with pytest.raises(AssertionError, match="missing nodes"):
        check_workflow(bad)
    workflow = json.loads(FLUX.read_text())
    workflow["nodes"][0]["type"] = "SomeOtherPackNode"
    bad.write_text(json.dumps(workflow))
    with pytest.raises(AssertionError, match="neither core"):
        check_workflow(bad)
