"""ComfyUI node layer of ComfyUI-ToMA: settings, per-run state, model-family patches and V3 nodes.

Loaded by ComfyUI as a subpackage of the pack folder, so every import in here is relative
(`from ..toma_core import ...`). Modules that do not need ComfyUI (settings, block parsers) can be
imported without it; tests and benches load them through `bench/harness/pack.py`.
"""
