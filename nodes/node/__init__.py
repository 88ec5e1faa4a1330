"""The ComfyUI-facing layer: the V3 nodes (toma_nodes.py), their checks of a queued prompt
(input_checks.py), the entry point they call (patching.patch_model: clone, find the family, install
its hooks and the runtime), the ToMA Compare node (compare.py, with its ComfyUI-free metrics, verdict
and picture: compare_metrics.py, compare_report.py, compare_grid.py), ComfyUI's extension hook
(extension.py) and the README's node tables generated from the nodes' schemas (readme_tables.py). May import everything below it: ../families, ../machinery, ../run, the
shared ../contract.py and ../settings.py.
"""
