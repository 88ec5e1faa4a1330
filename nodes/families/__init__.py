"""The model families: the registry (registry.py: every family ToMA patches, with its adapter, block
streams, cost model and README row; refusals.py: the families it refuses and why) and one adapter
module per family (flux.py, unet.py, sd3.py, qwen_image.py, hunyuan_video.py, wan.py, kandinsky5.py,
lumina2.py, hidream.py), each with `apply(model_clone, settings)` that installs its hooks and returns
the runtime's adapter. A family's own helpers sit beside it under the family's prefix
(flux_attention.py; unet_sites.py, unet_blocks.py, unet_attention.py, unet_cost.py). May import
../machinery, ../run and the shared ../contract.py and ../settings.py; never ../node.
"""
