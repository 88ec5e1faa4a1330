"""Per-family adapters: one module per model family ToMA patches (flux.py, unet.py, sd3.py,
qwen_image.py, hunyuan_video.py, wan.py, lumina2.py, hidream.py), each with `apply(model_clone,
settings)` that installs its hooks and returns the runtime's adapter. A family's own helpers sit
beside it under the family's prefix (flux_attention.py; unet_sites.py, unet_blocks.py,
unet_attention.py). What several families share lives in ../machinery/; which model class goes to
which adapter is ../registry.py.
"""
