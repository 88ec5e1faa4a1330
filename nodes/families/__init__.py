"""Model families ToMA patches: one adapter module per family, the shared pieces (merge.py: merge
around a block, rope/mask rows; hooks.py: dit replace keys and forward patches; geometry.py: the
token grid from the latent) and the registry that maps ComfyUI's model classes to them
(registry.py, issue 14).
"""
