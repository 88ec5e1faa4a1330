"""Tiny, randomly initialised Wan models (ComfyUI's real classes) and their conditioning.

Configs (toy sizes of ``comfy.ldm.wan.model.WanModel``'s arguments): dim 64, 4 heads of 16 (rope axes 8/4/4), ffn 128,
3 blocks, text_dim 32. Kinds and the ComfyUI classes they build:

- "t2v": supported_models.WAN21_T2V -> model_base.WAN21 -> WanModel (Wan 2.1 / 2.2 A14B T2V)
- "i2v": WAN21_I2V (in_dim 36: mask + image channels, CLIP image branch)
- "ti2v": WAN22_T2V -> model_base.WAN22 (in/out 48: Wan 2.2-5B; per-frame timesteps under a noise mask)
- "fun_ref": WAN21_T2V with a ref_conv (Fun / 2.2-Fun reference latent: one prepended frame)
- "vace": WAN21_Vace -> VaceWanModel (a vace block after every block)
- "s2v": WAN22_S2V -> WanModel_S2V
- "camera": WAN21_Camera -> CameraWanModel (refused by ToMA)

Import only after comfy_env.import_comfy() succeeded.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from . import tiny_models

TEXT_LEN = 19
"""Text tokens of the test conditioning (umT5 pads to 512 in real workflows; the length is free here)."""


WAN_SHAPED: dict[str, Any] = {"dim": 256, "ffn_dim": 1024, "num_heads": 2, "num_layers": 4}
"""wan_config overrides of the Wan-shaped model: width 256 (2 heads of 128, Wan's head width), ffn 4x,
4 blocks. At its latent (WAN_SHAPED_LATENT) and the node's tiles (8 x 8 x 4 frames) a call is near
ToMA's break-even on a CPU: the plan costs about as much as merging saves (min_tokens "auto" tests;
docs/advice.md)."""

WAN_SHAPED_LATENT = (1, 16, 7, 24, 40)
"""The Wan-shaped model's latent (B, C, F, H, W): 7 x 12 x 20 = 1,680 tokens per call."""


def wan_config(**overrides: Any) -> dict[str, Any]:
    """unet_config of a tiny Wan 2.1 T2V."""
    return {
        "image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "text_len": 512,
        "in_dim": 16, "dim": 64, "ffn_dim": 128, "freq_dim": 256, "text_dim": 32, "out_dim": 16,
        "num_heads": 4, "num_layers": 3, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True,
        "eps": 1e-6,
    } | overrides


def build_wan(kind: str = "t2v", seed: int = 0, **overrides: Any) -> Any:
    """A tiny Wan ModelPatcher of `kind` (see the module docstring)."""
    import comfy.supported_models as sm

    kinds = {
        "t2v": (sm.WAN21_T2V, {}),
        "i2v": (sm.WAN21_I2V, {"model_type": "i2v", "in_dim": 36}),
        "ti2v": (sm.WAN22_T2V, {"in_dim": 48, "out_dim": 48}),
        "fun_ref": (sm.WAN21_T2V, {"in_dim_ref_conv": 16}),
        "vace": (sm.WAN21_Vace, {"model_type": "vace", "vace_layers": 3, "vace_in_dim": 96}),
        "s2v": (sm.WAN22_S2V, {"model_type": "s2v", "audio_inject_layers": [0], "cond_dim": 0}),
        "camera": (sm.WAN21_Camera, {"model_type": "camera", "in_dim": 32}),
    }
    config_cls, extra = kinds[kind]
    return tiny_models.build(config_cls, wan_config(**extra) | overrides, seed)


def latent_channels(model: Any) -> int:
    return model.model.model_config.unet_config["out_dim"]


def conditioning(model: Any, seed: int, latent: tuple[int, ...] | None = None, **extras: Any) -> list[list[Any]]:
    """Random CONDITIONING [[context (1, TEXT_LEN, text_dim), extras]] for a tiny Wan.

    An I2V model also gets what WanImageToVideo makes from a start image: concat_latent_image
    (1, 16, F, H, W), concat_mask (1, 1, F, H, W) with frame 0 known (0), and a CLIP vision output
    of 257 tokens; pass `latent` (the latent shape) for those.
    """
    config = model.model.model_config.unet_config
    gen = torch.Generator().manual_seed(seed)
    if config.get("model_type") == "i2v":
        shape = (1, 16, *latent[2:])
        mask = torch.ones((1, 1, *latent[2:]))
        mask[:, :, 0] = 0.0
        extras.setdefault("concat_latent_image", torch.randn(shape, generator=gen))
        extras.setdefault("concat_mask", mask)
        extras.setdefault("clip_vision_output", SimpleNamespace(penultimate_hidden_states=torch.randn((1, 257, 1280), generator=gen)))
    context = torch.randn((1, TEXT_LEN, config["text_dim"]), generator=gen)
    return [[context, extras]]


def first_frame_mask(latent: tuple[int, ...]) -> torch.Tensor:
    """Wan22ImageToVideoLatent's noise mask (1, 1, F, H, W): frame 0 kept (0), the rest denoised (1)."""
    mask = torch.ones((1, 1, *latent[2:]))
    mask[:, :, 0] = 0.0
    return mask
