"""ComfyUI-ToMA: ToMA token merging (Lu et al., ICML 2025) as ComfyUI nodes, for Flux, Chroma, SDXL,
SD1.5, SD3, Qwen-Image, Lumina2, HunyuanVideo, HiDream and Wan (nodes/families/registry.py).

ComfyUI loads this folder as a custom-node package and calls `comfy_entrypoint` (V3 node API).
No NODE_CLASS_MAPPINGS on purpose: ComfyUI ignores the V3 entrypoint when they exist. Outside
ComfyUI (no `comfy_api` to import) the package imports without the entrypoint, so tools and
tests that load the pack folder still work; the math library `toma_core` never needs ComfyUI.

pytest collects the repository root as a package (it holds this file) and, when the folder's
name is not a Python identifier (`ComfyUI-ToMA`, the name every clone gets), imports this file
as a lone module with no parent package: the relative import below cannot resolve there, and
nothing needs the entrypoint, so it is skipped.
"""

from __future__ import annotations

import logging

if __package__:
    try:
        from .nodes.node.extension import comfy_entrypoint
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("comfy"):
            raise
        logging.getLogger(__name__).debug("ComfyUI not importable (%s); nodes not loaded", error)
    else:
        __all__ = ["comfy_entrypoint"]
