"""ComfyUI-ToMA: ToMA token merging for Flux and SDXL as ComfyUI nodes.

ComfyUI loads this folder as a custom-node package and calls `comfy_entrypoint` (V3 node API).
No NODE_CLASS_MAPPINGS on purpose: ComfyUI ignores the V3 entrypoint when they exist. Outside
ComfyUI (no `comfy_api` to import) the package imports without the entrypoint, so tools and
tests that load the pack folder still work; the math library `toma_core` never needs ComfyUI.
"""

from __future__ import annotations

import logging

try:
    from .nodes.extension import comfy_entrypoint
except ModuleNotFoundError as error:
    if not (error.name or "").startswith("comfy"):
        raise
    logging.getLogger(__name__).debug("ComfyUI not importable (%s); nodes not loaded", error)
else:
    __all__ = ["comfy_entrypoint"]
