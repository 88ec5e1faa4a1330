"""Tiny, randomly initialised ComfyUI models and a sampling helper for integration tests.

The models are real ComfyUI classes (``comfy.model_base.Flux``, ``SDXL``, ``BaseModel`` with a
SD1.5-style ``UNetModel``) built from small configs, wrapped in a ``ModelPatcher``, so patches go
through exactly the code paths a workflow uses. Real checkpoints cannot be shrunk: ComfyUI's model
detection hard-codes Flux's hidden size and SDXL's channel count.

``comfy.ops`` layers leave their weights uninitialised, so every builder fills them: matrices and
kernels with a seeded normal scaled by ``gain / sqrt(fan_in)``, every 1-d weight or scale (the
GroupNorm, LayerNorm and RMSNorm gains, named ``scale``, ``out.0.weight``, ``in_layers.0.weight``,
...) with 1, every bias with 0. Zeroing the 1-d weights instead would make a UNet's output exactly
zero and every "output changed" assertion meaningless.

Import this module only after ``comfy_env.import_comfy()`` succeeded: the ComfyUI imports below
are done lazily inside the functions, but they need ComfyUI on ``sys.path``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

log = logging.getLogger(__name__)

FLUX_LATENT = (1, 16, 16, 16)
"""Default Flux test latent (B, C, H, W): an 8 x 8 token grid."""

UNET_LATENT = (1, 4, 16, 16)
"""Default SD1.5 / SDXL test latent: transformer levels at 16 x 16 (SD1.5 only), 8 x 8 and 4 x 4."""

FLUX_TEXT_LEN = 256
"""Default text length for Flux conditioning (T5 pads to at least 256 tokens)."""

CLIP_TEXT_LEN = 77
"""Default text length for UNet conditioning (one CLIP chunk)."""

SDXL_POOLED_DIM = 1280
"""``comfy.model_base.SDXL.encode_adm`` appends 6 x 256 size embeddings to a 1280-d pooled vector
(1280 + 1536 = 2816 = ``adm_in_channels``)."""


def tiny_flux_config() -> dict[str, Any]:
    """Unet config for a Flux-topology DiT: hidden 64, 4 heads of 16 (axes 4+6+6), 2 double + 2 single blocks."""
    return {
        "image_model": "flux",
        "in_channels": 16,
        "out_channels": 16,
        "vec_in_dim": 32,
        "context_in_dim": 64,
        "hidden_size": 64,
        "mlp_ratio": 4.0,
        "num_heads": 4,
        "depth": 2,
        "depth_single_blocks": 2,
        "axes_dim": [4, 6, 6],
        "theta": 10000,
        "patch_size": 2,
        "qkv_bias": True,
        "guidance_embed": True,
    }


def tiny_sdxl_config() -> dict[str, Any]:
    """Unet config with SDXL's topology scaled down.

    Three levels (channel_mult 1, 2, 4), two res blocks each, no transformers at full latent
    resolution, depth 1 at 1/2 and depth 2 at 1/4 and in the middle block (SDXL: 0, 2, 10), linear
    proj_in/proj_out, ADM input 2816. Block ids match SDXL: transformers in ("input", 4/5/7/8),
    ("middle", 0), ("output", 0..5).
    """
    return {
        "use_checkpoint": False,
        "image_size": 32,
        "in_channels": 4,
        "out_channels": 4,
        "model_channels": 32,
        "num_res_blocks": [2, 2, 2],
        "channel_mult": [1, 2, 4],
        "transformer_depth": [0, 0, 1, 1, 2, 2],
        "transformer_depth_output": [0, 0, 0, 1, 1, 1, 2, 2, 2],
        "transformer_depth_middle": 2,
        "use_spatial_transformer": True,
        "use_linear_in_transformer": True,
        "legacy": False,
        "num_classes": "sequential",
        "adm_in_channels": 2816,
        "context_dim": 64,
        "num_heads": -1,
        "num_head_channels": 16,
        "use_temporal_attention": False,
        "use_temporal_resblock": False,
    }


def tiny_sd15_config() -> dict[str, Any]:
    """Unet config with SD1.5's topology scaled down.

    Four levels (channel_mult 1, 2, 4, 4), two res blocks each, one transformer after every res
    block of the first three levels (including full latent resolution) and in the middle, none at
    the lowest level, conv proj_in/proj_out, 8 heads, no ADM.
    """
    return {
        "use_checkpoint": False,
        "image_size": 32,
        "in_channels": 4,
        "out_channels": 4,
        "model_channels": 32,
        "num_res_blocks": [2, 2, 2, 2],
        "channel_mult": [1, 2, 4, 4],
        "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
        "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        "transformer_depth_middle": 1,
        "use_spatial_transformer": True,
        "use_linear_in_transformer": False,
        "legacy": False,
        "adm_in_channels": None,
        "context_dim": 64,
        "num_heads": 8,
        "num_head_channels": -1,
        "use_temporal_attention": False,
        "use_temporal_resblock": False,
    }


def init_weights(module: torch.nn.Module, seed: int | None = None, gain: float = 1.0) -> None:
    """Fill every parameter of ``module``.

    Biases -> 0; other 1-d parameters (norm gains and scales) -> 1; everything else -> normal *
    gain / sqrt(fan_in), fan_in being the size of one output row (in_features, or in_channels *
    kernel area for a conv): activations stay O(1) through many blocks. With ``seed`` the normals
    are drawn on the CPU from a generator seeded with it (deterministic on any device); with None
    they are drawn in place, on the parameter's device and dtype, from torch's global RNG (the
    benchmarks: seeded by ``torch.manual_seed``, fast for real model sizes on a GPU). Floating
    buffers of 2 or more dims that hold non-finite values (left empty by ``comfy.ops``, e.g. a
    positional table) get normal(0, 0.1).
    """
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif param.ndim <= 1:
                param.fill_(1.0)
            else:
                std = gain / math.sqrt(param[0].numel())
                if gen is None:
                    param.normal_(0.0, std)
                else:
                    param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)
        for buffer in module.buffers():
            if buffer.is_floating_point() and buffer.ndim >= 2 and not torch.isfinite(buffer).all():
                buffer.normal_(0.0, 0.1)


def zero_weights(module: torch.nn.Module) -> None:
    """Set every parameter of ``module`` to 0 (for 'does the output depend on this block' checks)."""
    with torch.no_grad():
        for param in module.parameters():
            param.zero_()


TREE_KEYS: dict[str, Any] = {
    "txt_ids_dims": [],
    "vec_in_dim": None,
    "use_cond_type_embedding": False,
    "vision_in_dim": None,
    "meanflow_sum": False,
}
"""Model-config keys that newer ComfyUI trees require and older ones reject, with the value that
builds the model the older tree built: ComfyUI 0.33 added ``FluxParams.txt_ids_dims`` (Flux.1: no
text position ids), ``ChromaParams.vec_in_dim`` (Chroma: none) and ``HunyuanVideoParams``'
``use_cond_type_embedding`` / ``vision_in_dim`` / ``meanflow_sum`` (HunyuanVideo 1.0: off)."""

PARAMS_CLASSES = {
    "flux": ("comfy.ldm.flux.model", "FluxParams"),
    "chroma": ("comfy.ldm.chroma.model", "ChromaParams"),
    "hunyuan_video": ("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams"),
}
"""image_model -> the dataclass its DiT builds its config into (module, class)."""


def tree_config(unet_config: dict[str, Any], image_model: str | None = None) -> dict[str, Any]:
    """unet_config plus the TREE_KEYS this ComfyUI tree's params dataclass has and the config lacks,
    so one tiny config builds on ComfyUI 0.3.64 and 0.33 alike. image_model: the params class to
    read (default: unet_config["image_model"])."""
    import dataclasses
    import importlib

    where = PARAMS_CLASSES.get(image_model or unet_config.get("image_model", ""))
    if where is None:
        return unet_config
    fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(where[0]), where[1]))}
    return {k: v for k, v in TREE_KEYS.items() if k in fields and k not in unet_config} | unet_config


def model_config(config_cls: type, unet_config: dict[str, Any], dtype: torch.dtype = torch.float32) -> Any:
    """Instantiate a ``comfy.supported_models`` config with our unet_config (completed by
    ``tree_config``) winning over its extras, weights and compute in `dtype`."""
    unet_config = tree_config(unet_config)
    config = config_cls(dict(unet_config))
    config.unet_config.update(unet_config)  # BASE.__init__ overlays unet_extra_config (e.g. 64-ch heads)
    config.set_inference_dtype(dtype, None)
    return config


def _wrap(model: torch.nn.Module, seed: int, gain: float) -> Any:
    """Initialise ``model.diffusion_model`` and wrap the model in a ModelPatcher on ComfyUI's devices."""
    import comfy.model_management as mm
    import comfy.model_patcher

    init_weights(model.diffusion_model, seed, gain)
    model.eval()
    return comfy.model_patcher.ModelPatcher(
        model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()
    )


def build(config_cls: type, unet_config: dict[str, Any], seed: int = 0, gain: float = 1.0) -> Any:
    """A ``comfy.supported_models`` config class's model built from ``unet_config``, its weights
    filled by ``init_weights(seed, gain)``, in a ModelPatcher."""
    return _wrap(model_config(config_cls, unet_config).get_model({}), seed, gain)


def build_flux(seed: int = 0, gain: float = 1.0, **overrides: Any) -> Any:
    """A tiny ``comfy.model_base.Flux`` in a ModelPatcher.

    The same class serves Flux dev/schnell and Kontext: pass ``reference_latents`` in the
    conditioning (see ``make_conditioning``) and the reference tokens are appended after the image
    tokens.
    """
    import comfy.supported_models

    return build(comfy.supported_models.Flux, tiny_flux_config() | overrides, seed, gain)


def build_sdxl(seed: int = 0, gain: float = 1.0, **overrides: Any) -> Any:
    """A tiny ``comfy.model_base.SDXL`` (EPS) in a ModelPatcher."""
    import comfy.supported_models

    return build(comfy.supported_models.SDXL, tiny_sdxl_config() | overrides, seed, gain)


def build_sd15(seed: int = 0, gain: float = 1.0, **overrides: Any) -> Any:
    """A tiny SD1.5-topology ``comfy.model_base.BaseModel`` (EPS) in a ModelPatcher."""
    import comfy.supported_models

    return build(comfy.supported_models.SD15, tiny_sd15_config() | overrides, seed, gain)


def model_family(model_patcher: Any) -> str:
    """'flux', 'sdxl' or 'sd15' for a patcher built here (by model class)."""
    import comfy.model_base

    model = model_patcher.model
    if isinstance(model, comfy.model_base.Flux):
        return "flux"
    if isinstance(model, comfy.model_base.SDXL):
        return "sdxl"
    return "sd15"


def transformer_block_paths(model_patcher: Any) -> list[str]:
    """Dotted paths (``diffusion_model.input_blocks.4.1.transformer_blocks.0``) of every UNet
    ``BasicTransformerBlock``, in module order; usable with ``add_object_patch(path + '.forward', fn)``."""
    from comfy.ldm.modules.attention import BasicTransformerBlock

    return [
        f"diffusion_model.{name}"
        for name, module in model_patcher.model.diffusion_model.named_modules()
        if isinstance(module, BasicTransformerBlock)
    ]


def make_conditioning(
    model_patcher: Any,
    seed: int,
    text_len: int | None = None,
    guidance: float = 3.5,
    reference_latents: list[torch.Tensor] | None = None,
    width: int = 1024,
    height: int = 1024,
) -> list[list[Any]]:
    """Random CONDITIONING (``[[cross_attn, extras]]``, batch 1) shaped for the model.

    Flux: context (1, T, context_in_dim), ``pooled_output`` (1, vec_in_dim), ``guidance`` and
    optional Kontext ``reference_latents`` (list of (1, 16, h, w) latents). SDXL: context
    (1, T, context_dim), ``pooled_output`` (1, 1280), width/height for the size embedding.
    SD1.5: context only. ComfyUI repeats batch-1 conditioning to the latent batch.
    """
    family = model_family(model_patcher)
    config = model_patcher.model.model_config.unet_config
    gen = torch.Generator().manual_seed(seed)
    extras: dict[str, Any] = {}
    if family == "flux":
        context_dim = config["context_in_dim"]
        text_len = FLUX_TEXT_LEN if text_len is None else text_len
        extras["pooled_output"] = torch.randn((1, config["vec_in_dim"]), generator=gen)
        extras["guidance"] = guidance
        if reference_latents is not None:
            extras["reference_latents"] = list(reference_latents)
    else:
        context_dim = config["context_dim"]
        text_len = CLIP_TEXT_LEN if text_len is None else text_len
        if family == "sdxl":
            extras.update(pooled_output=torch.randn((1, SDXL_POOLED_DIM), generator=gen), width=width, height=height)
    context = torch.randn((1, text_len, context_dim), generator=gen)
    return [[context, extras]]


def sample(
    model_patcher: Any,
    latent_shape: tuple[int, ...] | None = None,
    seed: int = 0,
    steps: int = 4,
    cfg: float = 2.0,
    sampler_name: str = "euler",
    scheduler: str = "simple",
    positive: list[list[Any]] | None = None,
    negative: list[list[Any]] | None = None,
    denoise: float = 1.0,
    latent_image: torch.Tensor | None = None,
    cond_seed: int = 1234,
    **sample_kwargs: Any,
) -> torch.Tensor:
    """Run ``comfy.sample.sample`` the way the KSampler node does and return the latent.

    ``latent_image`` defaults to zeros of ``latent_shape`` (an empty latent; its channel count is
    fixed up to the model's). Missing conditioning is random (``make_conditioning`` with
    ``cond_seed`` for positive, ``cond_seed + 1`` for negative). ``sample_kwargs`` go to
    ``comfy.sample.sample`` (start_step, last_step, force_full_denoise, noise_mask, sigmas,
    callback, disable_noise).
    """
    import comfy.sample

    if latent_image is None:
        if latent_shape is None:
            raise ValueError("give latent_shape or latent_image")
        latent_image = torch.zeros(latent_shape)
    latent_image = comfy.sample.fix_empty_latent_channels(model_patcher, latent_image)
    if positive is None:
        positive = make_conditioning(model_patcher, cond_seed)
    if negative is None:
        negative = make_conditioning(model_patcher, cond_seed + 1)
    noise = comfy.sample.prepare_noise(latent_image, seed)
    sample_kwargs.setdefault("disable_pbar", True)
    return comfy.sample.sample(
        model_patcher, noise, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
        denoise=denoise, seed=seed, **sample_kwargs,
    )
