"""Families ToMA refuses: the node raises a ValueError that names the model and says
why, on tiny real ComfyUI models, and leaves the model untouched."""

from __future__ import annotations

from typing import Any

import pytest
from compat_support import patch

LTXV = {
    "image_model": "ltxv", "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 4,
    "cross_attention_dim": 64, "caption_channels": 32, "in_channels": 128,
}
COSMOS_PREDICT2 = {
    "image_model": "cosmos_predict2", "model_channels": 64, "num_blocks": 2, "num_heads": 4, "crossattn_emb_channels": 32,
    "adaln_lora_dim": 16, "rope_enable_fps_modulation": False, "in_channels": 16, "out_channels": 16, "patch_spatial": 2,
    "patch_temporal": 1, "max_img_h": 240, "max_img_w": 240, "max_frames": 128, "concat_padding_mask": True,
    "pos_emb_cls": "rope3d", "use_adaln_lora": True, "extra_per_block_abs_pos_emb": False,
}


@pytest.mark.parametrize("config_name, unet_config, words", [
    ("LTXV", LTXV, ["LTXV (comfy.ldm.lightricks.model.LTXVModel)", "per token under a noise mask"]),
    ("CosmosT2IPredict2", COSMOS_PREDICT2, ["Cosmos (comfy.ldm.cosmos.predict2.MiniTrainDIT)", "per-frame modulation"]),
])
def test_refused_with_the_reason(tiny: Any, toma: Any, config_name: str, unet_config: dict, words: list[str]) -> None:
    import comfy.supported_models

    model = tiny.build(getattr(comfy.supported_models, config_name), unet_config)
    with pytest.raises(ValueError) as error:
        patch(toma, model)
    for word in words:
        assert word in str(error.value)
    assert not model.model_options.get("transformer_options", {}) and not model.object_patches
