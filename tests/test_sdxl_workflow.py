"""The SDXL example workflow: checkpoint loader -> ToMA Patch -> KSampler, with a Note."""

from __future__ import annotations

from workflow_check import EXAMPLES, SDXL_TEMPLATE, check_workflow, unconnected_required_inputs

from harness.pack import pack_module

WORKFLOW = EXAMPLES / f"{SDXL_TEMPLATE}.json"


def test_sdxl_workflow_is_well_formed_and_wired_through_toma():
    workflow = check_workflow(WORKFLOW)
    assert not unconnected_required_inputs(workflow)
    nodes = {node["id"]: node for node in workflow["nodes"]}
    types = {node["type"] for node in nodes.values()}
    assert {"CheckpointLoaderSimple", "ToMAPatch", "CLIPTextEncode", "EmptyLatentImage", "KSampler", "VAEDecode", "SaveImage", "Note"} <= types
    toma = next(node for node in nodes.values() if node["type"] == "ToMAPatch")
    s = pack_module("nodes.settings")  # the node's defaults
    assert toma["widgets_values"] == [s.NODE_RATIO, s.NODE_TILE_SIZE, s.NODE_START_PERCENT, 1.0, 1, 1]
    links = {link[0]: link for link in workflow["links"]}
    loader_link = links[toma["inputs"][0]["link"]]
    assert nodes[loader_link[1]]["type"] == "CheckpointLoaderSimple"
    sampler = next(node for node in nodes.values() if node["type"] == "KSampler")
    assert links[sampler["inputs"][0]["link"]][1] == toma["id"]
    latent = next(node for node in nodes.values() if node["type"] == "EmptyLatentImage")
    assert latent["widgets_values"][:2] == [1024, 1024]


def test_sdxl_note_explains_settings_and_defaults():
    workflow = check_workflow(WORKFLOW)
    (note,) = [node for node in workflow["nodes"] if node["type"] == "Note"]
    text = note["widgets_values"][0]
    for word in ("ratio", "tile_size", "start_percent", "recompute_every", "auto", "32x32", "input:4-8,middle,output:0-5", "attention", "ToMe"):
        assert word in text, word
