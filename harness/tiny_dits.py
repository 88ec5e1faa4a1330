"""Tiny, randomly initialised DiTs of the families beyond Flux, SDXL and Wan (SD3, Qwen-Image,
Lumina2, Z-Image, HunyuanVideo, HiDream, Flux.2, LongCat-Image, Kandinsky 5), built from ComfyUI's own ``comfy.supported_models`` classes and
their unet configs at toy width and depth, with conditioning shaped for each. Weights are filled by ``tiny_models.init_weights``.

Import only once ComfyUI is importable (the ``tiny`` fixture makes sure).
"""

from __future__ import annotations

from typing import Any

import torch

from .tiny_models import build


def sd3_config(**overrides: Any) -> dict[str, Any]:
    """MMDiT: depth 2 (hidden 128, 2 heads of 64), 3 joint blocks, the first with SD3.5-Medium's
    extra image self-attention, learned pos-embed of 32 x 32, context 32 -> 128."""
    return {
        "in_channels": 16, "patch_size": 2, "depth": 2, "num_blocks": 3, "adm_in_channels": 48,
        "pos_embed_scaling_factor": None, "num_patches": 1024, "pos_embed_max_size": 32,
        "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 32, "out_features": 128}},
        "qk_norm": "rms", "x_block_self_attn_layers": [0],
    } | overrides


def qwen_config(**overrides: Any) -> dict[str, Any]:
    """Qwen-Image: 3 blocks, 4 heads of 16 (rope axes 4/6/6), text features 32."""
    return {
        "image_model": "qwen_image", "in_channels": 64, "out_channels": 16, "patch_size": 2, "num_layers": 3,
        "attention_head_dim": 16, "num_attention_heads": 4, "joint_attention_dim": 32, "axes_dims_rope": (4, 6, 6),
    } | overrides


def lumina_config(**overrides: Any) -> dict[str, Any]:
    """Lumina2 NextDiT: dim 64, 3 layers, 4 heads (2 kv heads), rope axes 4/6/6, caption features 32."""
    return {
        "image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 64, "n_layers": 3,
        "n_refiner_layers": 1, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 16, "ffn_dim_multiplier": None,
        "norm_eps": 1e-5, "qk_norm": True, "cap_feat_dim": 32, "axes_dims": [4, 6, 6], "axes_lens": [300, 64, 64],
    } | overrides


def zimage_config(**overrides: Any) -> dict[str, Any]:
    """Z-Image NextDiT (comfy.model_detection's dim-3840 branch at toy width): dim 256, the least
    width whose adaLN input takes z_image_modulation's 256-wide timestep embedding; 3 layers, 4
    heads of 64 (rope axes 16/24/24, theta 256), caption and image padded with pad tokens to a
    multiple of 32. siglip_feat_dim (e.g. 24) adds the omni SigLIP embedder, refiner and pad token."""
    return lumina_config(
        dim=256, n_heads=4, n_kv_heads=4, axes_dims=[16, 24, 24], axes_lens=[1536, 512, 512], rope_theta=256.0,
        ffn_dim_multiplier=8.0 / 3.0, z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32,
    ) | overrides


def hunyuan_config(**overrides: Any) -> dict[str, Any]:
    """HunyuanVideo: hidden 64, 4 heads of 16 (rope axes 4/6/6), 2 double + 2 single blocks."""
    return {
        "image_model": "hunyuan_video", "in_channels": 16, "out_channels": 16, "vec_in_dim": 24, "context_in_dim": 32,
        "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 4, "depth": 2, "depth_single_blocks": 2, "axes_dim": [4, 6, 6],
        "theta": 256, "patch_size": [1, 2, 2], "qkv_bias": True, "guidance_embed": True, "byt5": False, "meanflow": False,
    } | overrides


def hidream_config(**overrides: Any) -> dict[str, Any]:
    """HiDream-I1: 2 double + 2 single blocks, 4 heads of 16 (rope axes 4/6/6), MoE of 2 experts
    (top 1), one Llama layer per block (4) of width 32, T5 width 32, pooled 24."""
    return {
        "image_model": "hidream", "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 2,
        "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 4, "caption_channels": [32, 32],
        "text_emb_dim": 24, "num_routed_experts": 2, "num_activated_experts": 1, "axes_dims_rope": (4, 6, 6),
        "max_resolution": (128, 128), "llama_layers": [0, 1, 2, 3],
    } | overrides


def build_sd3(seed: int = 0, **overrides: Any) -> Any:
    """A tiny ``comfy.model_base.SD3``; its pos_embed buffer (torch.empty in ComfyUI) is filled too."""
    import comfy.supported_models

    model = build(comfy.supported_models.SD3, sd3_config(**overrides), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        buffer = model.model.diffusion_model.pos_embed
        buffer.copy_(torch.randn(buffer.shape, generator=gen) * 0.1)
    return model


def build_qwen(seed: int = 0, **overrides: Any) -> Any:
    import comfy.supported_models

    return build(comfy.supported_models.QwenImage, qwen_config(**overrides), seed)


def build_lumina(seed: int = 0, **overrides: Any) -> Any:
    import comfy.supported_models

    return build(comfy.supported_models.Lumina2, lumina_config(**overrides), seed)


def build_zimage(seed: int = 0, **overrides: Any) -> Any:
    """A tiny Z-Image (``comfy.supported_models.ZImage``, a ``comfy.model_base.Lumina2``); None on a
    ComfyUI without that class (0.3.64)."""
    import comfy.supported_models

    config_cls = getattr(comfy.supported_models, "ZImage", None)
    return None if config_cls is None else build(config_cls, zimage_config(**overrides), seed)


def build_zimage_pixel(seed: int = 0) -> Any:
    """A tiny pixel-space Z-Image (``comfy.supported_models.ZImagePixelSpace``, a
    ``comfy.model_base.ZImagePixelSpace`` around ``NextDiTPixelSpace``): RGB in 4 x 4 patches, a
    32-wide decoder of one residual block; None on a ComfyUI without that class."""
    import comfy.supported_models

    config_cls = getattr(comfy.supported_models, "ZImagePixelSpace", None)
    config = zimage_config(
        image_model="zimage_pixel", patch_size=4, in_channels=3, decoder_in_channels=48, decoder_hidden_size=32,
        decoder_num_res_blocks=1, decoder_max_freqs=4,
    )
    return None if config_cls is None else build(config_cls, config, seed)


def build_hunyuan(seed: int = 0, **overrides: Any) -> Any:
    import comfy.supported_models

    return build(comfy.supported_models.HunyuanVideo, hunyuan_config(**overrides), seed)


def hunyuan15_config(**overrides: Any) -> dict[str, Any]:
    """HunyuanVideo 1.5 (comfy.model_detection's cond_type_embedding / vision_in branch) at the width of
    `hunyuan_config`: 32 latent channels in, the concat image (32) and mask (1) beside them, no pooled
    vector or guidance embedding, byT5 glyph tokens, vision tokens of width 16 (SigLIP's 1152 in the
    real model), the cond-type embedding."""
    return hunyuan_config(
        in_channels=65, out_channels=32, vec_in_dim=None, guidance_embed=False, byt5=True,
        use_cond_type_embedding=True, vision_in_dim=16, meanflow_sum=True,
    ) | overrides


def build_hunyuan15(seed: int = 0, sr: bool = False, **overrides: Any) -> Any:
    """A tiny HunyuanVideo 1.5 (``comfy.supported_models.HunyuanVideo15``, the HunyuanVideo class), or
    with `sr` its super-resolution model (``HunyuanVideo15_SR_Distilled``: the noise, the upscaled
    low-resolution latent and its noise-augmentation channels, 32 + 66 in); None on a ComfyUI without
    that class (0.3.64)."""
    import comfy.supported_models

    config_cls = getattr(comfy.supported_models, "HunyuanVideo15_SR_Distilled" if sr else "HunyuanVideo15", None)
    if sr:
        overrides.setdefault("in_channels", 98)
    return None if config_cls is None else build(config_cls, hunyuan15_config(**overrides), seed)


def flux2_config(**overrides: Any) -> dict[str, Any]:
    """Flux.2 (comfy.model_detection's double_stream_modulation_img branch) at toy width: hidden 64,
    4 heads of 16 (four rope axes of 4, theta 2000), 2 double + 2 single blocks, global modulation,
    SiLU-gated MLP of ratio 3, no biases, 128 latent channels at patch 1, text position ids on axis
    3, reference images by "index" (scale 10), text features 32, a guidance embedding (dev; Klein
    has none: guidance_embed=False)."""
    return {
        "image_model": "flux2", "in_channels": 128, "out_channels": 128, "vec_in_dim": None, "context_in_dim": 32,
        "hidden_size": 64, "mlp_ratio": 3.0, "num_heads": 4, "depth": 2, "depth_single_blocks": 2,
        "axes_dim": [4, 4, 4, 4], "theta": 2000, "patch_size": 1, "qkv_bias": False, "guidance_embed": True,
        "global_modulation": True, "mlp_silu_act": True, "ops_bias": False, "default_ref_method": "index",
        "ref_index_scale": 10.0, "txt_ids_dims": [3],
    } | overrides


def build_flux2(seed: int = 0, **overrides: Any) -> Any:
    """A tiny Flux.2 (``comfy.supported_models.Flux2``, a ``comfy.model_base.Flux2`` around
    ``comfy.ldm.flux.model.Flux``; its conditioning is left-padded to 512 text tokens); None on a
    ComfyUI without that class (0.3.64)."""
    import comfy.supported_models

    config_cls = getattr(comfy.supported_models, "Flux2", None)
    return None if config_cls is None else build(config_cls, flux2_config(**overrides), seed)


def longcat_config(**overrides: Any) -> dict[str, Any]:
    """LongCat-Image (comfy.model_detection's Flux branch with context_in_dim 3584 and no pooled
    vector) at the width of `tiny_models.tiny_flux_config`: no guidance embedding, text position ids
    on axes 1 and 2, text features 32 (Qwen2.5-VL's 3584 in the real model)."""
    return {
        "image_model": "flux", "in_channels": 16, "out_channels": 16, "vec_in_dim": None, "context_in_dim": 32,
        "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 4, "depth": 2, "depth_single_blocks": 2,
        "axes_dim": [4, 6, 6], "theta": 10000, "patch_size": 2, "qkv_bias": True, "guidance_embed": False,
        "txt_ids_dims": [1, 2],
    } | overrides


def build_longcat(seed: int = 0, **overrides: Any) -> Any:
    """A tiny LongCat-Image (``comfy.supported_models.LongCatImage``, a ``comfy.model_base.LongCatImage``
    that shifts the image's rope positions past the text); None on a ComfyUI without that class (0.3.64)."""
    import comfy.supported_models

    config_cls = getattr(comfy.supported_models, "LongCatImage", None)
    return None if config_cls is None else build(config_cls, longcat_config(**overrides), seed)


def kandinsky5_config(image: bool = False, **overrides: Any) -> dict[str, Any]:
    """Kandinsky 5 (comfy.model_detection's kandinsky5 branch) at toy width: model width 64, 4 heads
    of 16 (rope axes 4/6/6), 1 text block and 3 visual blocks, text features 32 (Qwen2.5-VL's 3584 in
    the real model), pooled 24 (CLIP's 768). Video (Lite / Pro): 16 latent channels plus the concat
    image and mask ((16 + 16 + 1) x 2 x 2 = 132 patch features, comfy.model_base.Kandinsky5.concat_cond);
    image (Image Lite): the 16 channels alone (64 features)."""
    return {
        "image_model": "kandinsky5", "model_dim": 64, "ff_dim": 128, "time_dim": 32, "axes_dims": (4, 6, 6),
        "in_text_dim": 32, "in_text_dim2": 24, "num_text_blocks": 1, "num_visual_blocks": 3,
        "visual_embed_dim": 64 if image else 132,
    } | overrides


def build_kandinsky5(seed: int = 0, image: bool = False, **overrides: Any) -> Any:
    """A tiny Kandinsky 5 (``comfy.supported_models.Kandinsky5``, or ``Kandinsky5Image`` with
    `image`); None on a ComfyUI without that class (0.3.64)."""
    import comfy.supported_models

    config_cls = getattr(comfy.supported_models, "Kandinsky5Image" if image else "Kandinsky5", None)
    return None if config_cls is None else build(config_cls, kandinsky5_config(image, **overrides), seed)


def build_hidream(seed: int = 0, **overrides: Any) -> Any:
    import comfy.supported_models

    return build(comfy.supported_models.HiDream, hidream_config(**overrides), seed)


def build_hunyuan_image(seed: int = 0) -> Any:
    """HunyuanImage 2.1 (the HunyuanVideo class with a 2-D 1 x 1 patch, 64 latent channels, no pooled vector)."""
    import comfy.supported_models

    config = hunyuan_config(patch_size=[1, 1], vec_in_dim=None, in_channels=64, out_channels=64, axes_dim=[8, 8])
    return build(comfy.supported_models.HunyuanImage21, config, seed)


def conditioning(family: str, seed: int, text_len: int = 12, **extras: Any) -> list[list[Any]]:
    """Batch-1 CONDITIONING for a tiny model of `family`; extras go into its dict (e.g.
    reference_latents for Qwen-Image-Edit)."""
    gen = torch.Generator().manual_seed(seed)
    if family == "sd3":
        extras.setdefault("pooled_output", torch.randn((1, 48), generator=gen))
    if family == "hunyuan_video":
        extras.setdefault("pooled_output", torch.randn((1, 24), generator=gen))
        extras.setdefault("guidance", 6.0)
    if family == "hidream":
        extras.setdefault("pooled_output", torch.randn((1, 24), generator=gen))
        extras.setdefault("conditioning_llama3", torch.randn((1, 4, text_len, 32), generator=gen))
    if family == "kandinsky5":
        extras.setdefault("pooled_output", torch.randn((1, 24), generator=gen))
    if family == "lumina2":
        extras.setdefault("attention_mask", torch.ones((1, text_len), dtype=torch.long))
    return [[torch.randn((1, text_len, 32), generator=gen), extras]]
