"""Machinery shared by the family adapters in ../families/: how a block hook runs, the one skeleton
every hook runs, the merged run of the DiT families and the merging around one block it is made of
(runner.py), installing hooks on a ModelPatcher clone (hooks.py), per-span modulation under merging
(spans.py), the token grid of a call (geometry.py), the `blocks` list grammar (block_lists.py) and
its DiT parser (dit_blocks.py), and the settings checks of the adapters (scope.py). May import
../run and the shared ../contract.py and ../settings.py; never ../families or ../node.
"""
