"""ComfyUI node layer of ComfyUI-ToMA, one folder per role, each importing only from the folders
below it (tests/test_import_graph.py checks it):

    node/        the ComfyUI nodes and the one entry point they call (patching.patch_model)
    families/    the family registry and one adapter per model family
    machinery/   what the adapters share: hook installation, the block runner, merging around a block
    run/         per-run and per-call state, the per-call decision, timing, the run line, the cost model
    contract.py, settings.py   the vocabulary every folder shares (an adapter's contract with the
                 runtime; the validated user settings)

and everything may use ../toma_core (the math, no ComfyUI). Loaded by ComfyUI as a subpackage of
the pack folder, so every import in here is relative; modules that do not need ComfyUI (settings,
block parsers) import without it, and tests and benches load them through harness/pack.py.
"""
