"""A saved UI workflow (the frontend's graph json) as the API prompt ``/prompt`` takes.

Driven by the server's ``/object_info``: each node's widget values are matched to its widget
inputs in ``input_order``, an INT with ``control_after_generate`` (a seed) is followed by its
control value in ``widgets_values`` ("fixed", "randomize", ...), a dynamic combo (ComfyUI 0.33's
``COMFY_DYNAMICCOMBO_V3``, e.g. SaveVideo's ``format``) is followed by the widgets of the option it
chose, sent as ``<combo>.<input>`` (comfy_api.latest._io ``finalize_prefix``), and every linked input becomes
``[origin node id, origin slot]``. Frontend-only nodes (notes, reroutes) and muted or bypassed
nodes are left out. Nothing is read from a hand-written copy of the graph.
"""

from __future__ import annotations

import copy
from typing import Any

DYNAMIC_COMBO = "COMFY_DYNAMICCOMBO_V3"
WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", DYNAMIC_COMBO})
FRONTEND_ONLY = frozenset({"Note", "MarkdownNote", "Reroute", "PrimitiveNode"})
ACTIVE_MODE = 0
"""LiteGraph node modes: 0 always, 2 never (muted), 4 bypassed."""

Prompt = dict[str, dict[str, Any]]


def input_specs(entry: dict[str, Any]) -> dict[str, list]:
    return {**entry["input"].get("required", {}), **entry["input"].get("optional", {})}


def input_order(entry: dict[str, Any]) -> list[str]:
    order = entry.get("input_order") or {
        group: list(entry["input"].get(group, {})) for group in ("required", "optional")
    }
    return list(order.get("required", [])) + list(order.get("optional", []))


def is_widget(spec: list) -> bool:
    """A widget input (a value in the node), as opposed to a socket (a link from another node)."""
    return isinstance(spec[0], list) or spec[0] in WIDGET_TYPES


def widget_names(entry: dict[str, Any]) -> list[str]:
    specs = input_specs(entry)
    return [name for name in input_order(entry) if is_widget(specs[name])]


def _widget_inputs(entry: dict[str, Any], values: list) -> dict[str, Any]:
    """Widget name -> value, skipping each seed's control value that follows it."""
    queue, out = list(values), {}
    _take_widgets(entry["input"], input_order(entry), "", queue, out)
    return out


def _take_widgets(groups: dict[str, dict], order: list[str], prefix: str, queue: list, out: dict[str, Any]) -> None:
    """Fill `out` from `queue` for the widgets among `order` (names in the input `groups`), a dynamic
    combo's chosen option's widgets after it, under `prefix`."""
    specs = {**groups.get("required", {}), **groups.get("optional", {})}
    for name in order:
        if not queue:
            return
        spec = specs[name]
        if not is_widget(spec):
            continue
        value = out[prefix + name] = queue.pop(0)
        options = spec[1] if len(spec) > 1 else {}
        if options.get("control_after_generate") and queue and isinstance(queue[0], str):
            queue.pop(0)
        if spec[0] == DYNAMIC_COMBO:
            chosen = next((o["inputs"] for o in options.get("options", []) if o["key"] == value), {})
            nested = [n for group in ("required", "optional") for n in chosen.get(group, {})]
            _take_widgets(chosen, nested, f"{prefix}{name}.", queue, out)


def ui_to_api(workflow: dict[str, Any], object_info: dict[str, Any]) -> Prompt:
    """The API prompt of a UI workflow; KeyError for a node type the server does not know."""
    links = {link[0]: link for link in workflow.get("links", [])}
    prompt: Prompt = {}
    for node in workflow["nodes"]:
        if node["type"] in FRONTEND_ONLY or node.get("mode", ACTIVE_MODE) != ACTIVE_MODE:
            continue
        entry = object_info[node["type"]]
        inputs = _widget_inputs(entry, node.get("widgets_values") or [])
        for socket in node.get("inputs", []):
            if socket.get("link") is not None:
                link = links[socket["link"]]
                inputs[socket["name"]] = [str(link[1]), link[2]]
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt


def api_node(object_info: dict[str, Any], class_type: str, **inputs: Any) -> dict[str, Any]:
    """A node of ``class_type`` with every widget at its registered default, then ``inputs``."""
    entry = object_info[class_type]
    specs = input_specs(entry)
    values = {}
    for name in widget_names(entry):
        options = specs[name][1] if len(specs[name]) > 1 else {}
        if "default" in options:
            values[name] = options["default"]
        elif isinstance(specs[name][0], list) and specs[name][0]:
            values[name] = specs[name][0][0]
    return {"class_type": class_type, "inputs": values | inputs}


def nodes_of(prompt: Prompt, class_type: str) -> list[str]:
    return [node_id for node_id, node in prompt.items() if node["class_type"] == class_type]


def only(prompt: Prompt, class_type: str) -> str:
    ids = nodes_of(prompt, class_type)
    assert len(ids) == 1, f"expected one {class_type}, found {ids}"
    return ids[0]


def set_inputs(prompt: Prompt, class_type: str, **inputs: Any) -> Prompt:
    """A copy with ``inputs`` set on every node of ``class_type``."""
    out = copy.deepcopy(prompt)
    for node_id in nodes_of(out, class_type):
        out[node_id]["inputs"].update(inputs)
    return out


def replace_node(prompt: Prompt, node_id: str, node: dict[str, Any]) -> Prompt:
    out = copy.deepcopy(prompt)
    out[node_id] = node
    return out


def remove_node(prompt: Prompt, node_id: str, passthrough: str) -> Prompt:
    """A copy without ``node_id``: links to its output 0 go to what fed its ``passthrough`` input."""
    out = copy.deepcopy(prompt)
    source = out.pop(node_id)["inputs"][passthrough]
    for node in out.values():
        for name, value in node["inputs"].items():
            if value == [node_id, 0]:
                node["inputs"][name] = source
    return out
