"""The V3 extension: ComfyUI calls `comfy_entrypoint()` and registers the nodes it lists."""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .compare import ToMACompare
from .toma_nodes import NODES


class ToMAExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*NODES, ToMACompare]


async def comfy_entrypoint() -> ToMAExtension:
    return ToMAExtension()
