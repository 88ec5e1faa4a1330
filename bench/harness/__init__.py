"""What the benches and the tests share: the pack import (``pack``), ComfyUI's location and import
(``comfy_env``), tiny and random-weight ComfyUI models (``tiny_models``, ``tiny_dits``, ``tiny_wan``,
``model_files``, ``sampling``), the trained fixtures (``trained``), timing (``timing``), the
benches' command line (``cli``) and the third-party packs' location (``third_party``)."""
