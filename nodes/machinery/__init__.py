"""Machinery shared by the family adapters in ../families/: installing hooks on a ModelPatcher
clone (hooks.py), merging around one block (merge.py), the generic DiT block runner
(dit_runner.py), the token grid of a call (geometry.py), the DiT `blocks` setting (dit_blocks.py)
and the settings checks of the block-scope families (scope.py).
"""
