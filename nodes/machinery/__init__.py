"""Machinery shared by the family adapters in ../families/: the one hook skeleton every block hook
runs (skeleton.py), installing hooks on a ModelPatcher clone (hooks.py), merging around one block
(merge.py), the generic DiT block runner (dit_runner.py), per-span modulation under merging
(spans.py), the token grid of a call (geometry.py), the `blocks` list grammar (block_lists.py) and
its DiT parser (dit_blocks.py), and the settings checks of the adapters (scope.py). May import
../run and the shared ../contract.py and ../settings.py; never ../families or ../node.
"""
