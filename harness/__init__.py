"""What the benches and the tests share (the tests never import bench/): the pack import (``pack``),
ComfyUI's location and import (``comfy_env``), tiny and random-weight ComfyUI models
(``tiny_models``, ``tiny_dits``, ``tiny_wan``, ``model_files``), the trained fixtures (``trained``,
``trained_video``), image metrics (``metrics``) and the third-party packs' location (``third_party``)."""
