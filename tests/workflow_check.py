"""Checks that an example workflow is a well-formed UI-format ComfyUI graph (as the frontend saves
it) that uses only core node types and this pack's nodes, with consistent links, and whose loaders
carry their files' download links as ComfyUI's own templates do (`model_link_problems`).

Pure Python: used by the CI tests (static list of core types) and by the integration tests, which
also compare against ComfyUI's own NODE_CLASS_MAPPINGS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

EXAMPLES = Path(__file__).resolve().parents[1] / "example_workflows"
FLUX_TEMPLATE = "Flux.1 Dev - text to image with ToMA"
SDXL_TEMPLATE = "SDXL - text to image with ToMA"
WAN_TEMPLATE = "Wan 2.2 14B - text to video with ToMA"
"""Templates the tests name, by file stem: ComfyUI's template browser shows the stem as the title
(app/custom_node_manager.py lists file names only)."""

PATCH_NODES = frozenset({"ToMAPatch", "ToMAPatchAdvanced"})
"""This pack's patch nodes (their widgets start ratio, tile_size, start_percent)."""
PACK_NODES = PATCH_NODES | {"ToMACompare"}

ANY_TYPE = "*"
"""The socket type of an input that takes anything (PreviewAny's ``source``): a link into it keeps its output's type."""

FRONTEND_ONLY = frozenset({"Note", "MarkdownNote", "Reroute", "PrimitiveNode"})
"""Node types the frontend draws itself; they never reach the server."""

CORE_NODES = frozenset({
    "CheckpointLoaderSimple", "UNETLoader", "DualCLIPLoader", "CLIPLoader", "VAELoader", "LoraLoader",
    "LoraLoaderModelOnly", "CLIPTextEncode", "EmptyLatentImage", "KSampler", "KSamplerAdvanced",
    "VAEDecode", "VAEEncode", "SaveImage", "PreviewImage", "LoadImage",
    # built-in nodes of ComfyUI's comfy_extras (shipped with every ComfyUI), for video workflows
    "ModelSamplingSD3", "EmptyHunyuanLatentVideo", "CreateVideo", "SaveVideo",
    # ... for the custom-sampler and Z-Image workflows (ComfyUI 0.33's own Flux.2 / Z-Image templates use them)
    "ConditioningZeroOut", "RandomNoise", "KSamplerSelect", "CFGGuider", "SamplerCustomAdvanced",
    "ModelSamplingAuraFlow", "EmptySD3LatentImage",
    # ... and ComfyUI 0.33's Flux.2 nodes (comfy_extras/nodes_flux.py; absent from 0.3.64)
    "EmptyFlux2LatentImage", "Flux2Scheduler",
    # ... "Preview as Text" (comfy_extras/nodes_preview_any.py), showing ToMA Compare's report
    "PreviewAny",
})
"""Core node types (ComfyUI's nodes.py and its built-in comfy_extras) an example workflow may use."""

MODEL_FILE_WIDGETS = {
    "CheckpointLoaderSimple": ("checkpoints", (0,)), "UNETLoader": ("diffusion_models", (0,)),
    "CLIPLoader": ("text_encoders", (0,)), "DualCLIPLoader": ("text_encoders", (0, 1)), "VAELoader": ("vae", (0,)),
    "LoraLoader": ("loras", (0,)), "LoraLoaderModelOnly": ("loras", (0,)),
}
"""Core loaders -> (the models/ folder their files come from, as ComfyUI's own templates name it in
`properties.models[].directory`; indices of the file names in `widgets_values`)."""


def load_workflow(path: Path) -> dict[str, Any]:
    """Parse `path` as JSON and check the top-level UI-format keys."""
    workflow = json.loads(Path(path).read_text(encoding="utf-8"))
    for key in ("nodes", "links", "last_node_id", "last_link_id"):
        if key not in workflow:
            raise AssertionError(f"{path}: missing top-level key {key!r} (not a UI-format workflow)")
    return workflow


def check_workflow(path: Path, core_nodes: frozenset[str] = CORE_NODES, pack_nodes: frozenset[str] = PACK_NODES) -> dict[str, Any]:
    """Raise AssertionError describing the first problem; return the parsed workflow."""
    workflow = load_workflow(path)
    nodes = {node["id"]: node for node in workflow["nodes"]}
    if len(nodes) != len(workflow["nodes"]):
        raise AssertionError(f"{path}: duplicate node ids")
    allowed = core_nodes | pack_nodes | FRONTEND_ONLY
    for node in nodes.values():
        if node["type"] not in allowed:
            raise AssertionError(f"{path}: node {node['id']} has type {node['type']!r}, neither core nor this pack's")
    if max(nodes, default=0) > workflow["last_node_id"]:
        raise AssertionError(f"{path}: last_node_id {workflow['last_node_id']} < a node id")
    _check_links(path, workflow, nodes)
    if not any(node["type"] in pack_nodes for node in nodes.values()):
        raise AssertionError(f"{path}: uses none of this pack's nodes")
    return workflow


def _check_links(path: Path, workflow: dict[str, Any], nodes: dict[int, dict[str, Any]]) -> None:
    ids = set()
    for link in workflow["links"]:
        link_id, src, src_slot, dst, dst_slot, kind = link
        ids.add(link_id)
        if src not in nodes or dst not in nodes:
            raise AssertionError(f"{path}: link {link_id} joins missing nodes {src} -> {dst}")
        output = nodes[src]["outputs"][src_slot]
        target = nodes[dst]["inputs"][dst_slot]
        if link_id not in (output.get("links") or []) or target.get("link") != link_id:
            raise AssertionError(f"{path}: link {link_id} is not recorded on both ends")
        if not (output["type"] == kind and target["type"] in (kind, ANY_TYPE)):
            raise AssertionError(f"{path}: link {link_id} joins {output['type']} to {target['type']} as {kind}")
    if len(ids) != len(workflow["links"]) or max(ids, default=0) > workflow["last_link_id"]:
        raise AssertionError(f"{path}: link ids are duplicated or exceed last_link_id")
    for node in nodes.values():
        for slot in node.get("inputs", []):
            if slot.get("link") is not None and slot["link"] not in ids:
                raise AssertionError(f"{path}: node {node['id']} input {slot['name']} names unknown link {slot['link']}")
        for slot in node.get("outputs", []):
            for link_id in slot.get("links") or []:
                if link_id not in ids:
                    raise AssertionError(f"{path}: node {node['id']} output {slot['name']} names unknown link {link_id}")


def unconnected_required_inputs(workflow: dict[str, Any]) -> list[str]:
    """Socket inputs listed on nodes but left unconnected (the frontend would refuse to queue)."""
    missing = []
    for node in workflow["nodes"]:
        for slot in node.get("inputs", []):
            if slot.get("link") is None and "widget" not in slot:
                missing.append(f"{node['type']}#{node['id']}.{slot['name']}")
    return missing


MODEL_HOST = "https://huggingface.co/"
"""Where every model link of ComfyUI's own templates points, and a prefix ComfyUI's frontend offers
as a download (`isModelDownloadable` in comfyui_frontend_package's missingModelMetadata chunk)."""


def model_link_problems(workflow: dict[str, Any]) -> list[str]:
    """What is wrong with the loaders' download links, as ComfyUI's own templates give them: each file a
    loader selects has one `properties.models` entry with its name, an https URL on MODEL_HOST ending
    in that name, and the models/ folder of the loader's type; no entry names a file it does not select
    (the frontend reads only the entries whose name is a widget value: `getSelectedModelsMetadata`)."""
    problems = []
    for node in workflow["nodes"]:
        if node["type"] in MODEL_FILE_WIDGETS:
            directory, indices = MODEL_FILE_WIDGETS[node["type"]]
            files = [node["widgets_values"][i] for i in indices]
            links = node.get("properties", {}).get("models", [])
            where = f"{node['type']} #{node['id']}"
            problems += [f"{where} links {entry.get('name')!r}, which it does not load" for entry in links if entry.get("name") not in files]
            problems += [f"{where}: {problem}" for name in files if (problem := _link_problem(name, directory, links))]
    return problems


def _link_problem(name: str, directory: str, links: list[dict[str, str]]) -> str | None:
    found = [entry for entry in links if entry.get("name") == name]
    if len(found) != 1:
        return f"{name} has {len(found)} entries in properties.models, not 1"
    url, folder = found[0].get("url", ""), found[0].get("directory")
    if not url.startswith(MODEL_HOST) or unquote(urlsplit(url).path).rsplit("/", 1)[-1] != name:
        return f"{name}: url {url!r} is not a {MODEL_HOST} link to that file"
    if folder != directory:
        return f"{name}: directory {folder!r}, the loader reads models/{directory}"
    return None
