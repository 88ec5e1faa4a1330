"""Model files in ComfyUI's real on-disk formats, made at test time with random weights.

Nothing here is downloaded or committed: each function builds ComfyUI's own module class (so
the key names and shapes are exactly what its loaders and model detection expect), fills it
with ``tiny_models.init_weights`` and writes a safetensors file into a temporary models folder.

ComfyUI's detection fixes what cannot shrink, so the files are as small as detection allows:

- ``flux_unet``: a Flux-dev DiT at full width (hidden 3072, context 4096, detection hard-codes
  both) with 1 double + 1 single block, about 549M parameters, bf16 (1.1 GB). ``UNETLoader``.
- ``clip_l``: a CLIP-L text encoder (123M, fp16). ``CLIPLoader(type="sd3")`` pads its output to
  the 4096 channels Flux expects; a T5-XXL for ``DualCLIPLoader`` cannot be made small.
- ``taesd_vae``: a TAESD-layout VAE (detected by its ``taesd_decoder`` keys), 16 or 4 latent
  channels. ``VAELoader``.
- ``sd15_checkpoint``: an SD1.5-class UNet (320 channels, context 768, 2 levels), CLIP-L and a
  TAESD VAE in one file. ``CheckpointLoaderSimple``.
- ``wan_unet``: a Wan 2.1 / 2.2 T2V DiT (detection reads its width and depth: 128 wide, one head,
  one block; the text input stays 4096 wide, as CLIP-L padded by ``CLIPLoader(type="sd3")``).
  ``UNETLoader``.
- ``wan_lora``: a LoRA for ``wan_unet``'s model on every linear layer of its blocks (what a
  Wan 2.2 LightX2V 4-step LoRA patches), rank 4, in ComfyUI's generic LoRA keys.
  ``LoraLoaderModelOnly``.
- ``wan_vae``: the Wan 2.1 VAE (detection fixes its layout: 127M parameters, fp16).
  ``VAELoader``.
- ``flux_gguf_q8_0``: ``flux_unet``'s model in GGUF Q8_0 (ComfyUI-GGUF's loader).
- ``flux2_unet`` (ComfyUI 0.33): a Flux.2 [klein]-style DiT (detection fixes four rope axes of 32,
  so one head of 128; no guidance embedding; the text input 4096 wide, as CLIP-L padded by
  ``CLIPLoader(type="sd3")``), 1 double + 1 single block, bf16. ``UNETLoader``.
- ``zimage_unet`` (ComfyUI 0.33): a Z-Image DiT at full width (detection matches Z-Image by its
  width, 3840, and hard-codes its 30 heads) with 1 main layer beside the 2 + 2 refiner layers
  (``NextDiT``'s default, not read from the file), 0.9B parameters, bf16 (1.8 GB); caption input
  4096 wide. ``UNETLoader``.
- ``taesd_half``: the encoder or decoder of a TAESD as ComfyUI's ``vae_approx`` folder holds them;
  the pair ``taef2_encoder`` / ``taef2_decoder`` is ``VAELoader``'s "taef2", which stands in for the
  Flux.2 VAE on 0.33 (``comfy.taesd.taesd`` unpacks its 128 latent channels as 2 x 2 patches of 32).

Import only after ComfyUI is importable (the ``comfy`` fixture).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

FLUX_UNET_CONFIG: dict[str, Any] = {
    "image_model": "flux", "in_channels": 16, "out_channels": 16, "vec_in_dim": 768,
    "context_in_dim": 4096, "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24,
    "depth": 1, "depth_single_blocks": 1, "axes_dim": [16, 56, 56], "theta": 10000,
    "patch_size": 2, "qkv_bias": True, "guidance_embed": True,
}
"""What ``comfy.model_detection`` reads back from the file: only the block counts are ours."""

SD15_UNET_CONFIG: dict[str, Any] = {
    "use_checkpoint": False, "image_size": 32, "in_channels": 4, "out_channels": 4,
    "model_channels": 320, "num_res_blocks": [1, 1], "channel_mult": [1, 2],
    "transformer_depth": [1, 1], "transformer_depth_output": [1, 1, 1, 1],
    "transformer_depth_middle": 1, "use_spatial_transformer": True,
    "use_linear_in_transformer": False, "legacy": False, "adm_in_channels": None,
    "context_dim": 768, "num_heads": 8, "num_head_channels": -1,
    "use_temporal_attention": False, "use_temporal_resblock": False,
}
"""SD1.5's width and context (what ``supported_models.SD15`` matches), two levels of one res block."""


def _filled(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """``module``'s state dict after ``init_weights`` (the test models' O(1)-activation init)."""
    from .tiny_models import init_weights

    torch.manual_seed(seed)
    init_weights(module, None)
    return {key: value.contiguous() for key, value in module.state_dict().items()}


def _save(tensors: dict[str, torch.Tensor], path: Path) -> Path:
    import comfy.utils

    path.parent.mkdir(parents=True, exist_ok=True)
    comfy.utils.save_torch_file(tensors, str(path))
    return path


def flux_module(dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> torch.nn.Module:
    """ComfyUI's Flux DiT (``comfy.ldm.flux.model.Flux``) with random weights, not yet saved."""
    import comfy.ldm.flux.model
    import comfy.ops

    from .tiny_models import tree_config

    config = tree_config(FLUX_UNET_CONFIG | overrides)  # the keys this tree's FluxParams requires
    module = comfy.ldm.flux.model.Flux(dtype=dtype, operations=comfy.ops.disable_weight_init, **config)
    _filled(module, seed=0)
    return module


def flux_unet(path: Path, **overrides: Any) -> Path:
    """A Flux-dev ``diffusion_models`` file (bare DiT keys, bf16)."""
    return _save(flux_module(**overrides).state_dict(), path)


def _clip_l_module() -> torch.nn.Module:
    import comfy.clip_model
    import comfy.ops
    import comfy.sd1_clip

    config_path = Path(comfy.sd1_clip.__file__).with_name("sd1_clip_config.json")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    return comfy.clip_model.CLIPTextModel(config, torch.float16, "cpu", comfy.ops.manual_cast)


def clip_l_tensors(seed: int = 1) -> dict[str, torch.Tensor]:
    """CLIP-L's keys as a standalone ``text_encoders`` file has them (``text_model.*``)."""
    tensors = _filled(_clip_l_module(), seed)
    tensors["text_model.embeddings.position_ids"] = torch.arange(77).unsqueeze(0)
    return tensors


def clip_l(path: Path) -> Path:
    return _save(clip_l_tensors(), path)


def taesd_tensors(latent_channels: int, seed: int = 2) -> dict[str, torch.Tensor]:
    """A TAESD-layout VAE (``taesd_encoder.*``, ``taesd_decoder.*``, scale and shift)."""
    import comfy.taesd.taesd

    module = comfy.taesd.taesd.TAESD(latent_channels=latent_channels)
    tensors = _filled(module, seed)
    tensors["vae_scale"], tensors["vae_shift"] = torch.tensor(1.0), torch.tensor(0.0)
    return tensors


def taesd_vae(path: Path, latent_channels: int = 16) -> Path:
    return _save(taesd_tensors(latent_channels), path)


def taesd_half(path: Path, half: str, latent_channels: int = 128) -> Path:
    """The ``half`` ("encoder" or "decoder") of ``taesd_tensors(latent_channels)`` without its
    ``taesd_<half>.`` prefix, as ``VAELoader.load_taesd`` reads ``vae_approx/<name>_<half>.*``."""
    prefix = f"taesd_{half}."
    return _save({k.removeprefix(prefix): v for k, v in taesd_tensors(latent_channels).items() if k.startswith(prefix)}, path)


def sd15_checkpoint(path: Path) -> Path:
    """One checkpoint file: ``model.diffusion_model.*``, ``cond_stage_model.transformer.*``,
    ``first_stage_model.*`` (fp16)."""
    import comfy.supported_models

    from .tiny_models import build

    unet = build(comfy.supported_models.SD15, SD15_UNET_CONFIG, seed=3).model.diffusion_model
    tensors = {f"model.diffusion_model.{k}": v.half() for k, v in unet.state_dict().items()}
    tensors |= {f"cond_stage_model.transformer.{k}": v for k, v in clip_l_tensors().items()}
    tensors |= {f"first_stage_model.{k}": v.half() for k, v in taesd_tensors(4).items()}
    return _save(tensors, path)


WAN_UNET_CONFIG: dict[str, Any] = {
    "model_type": "t2v", "patch_size": (1, 2, 2), "text_len": 512, "in_dim": 16, "dim": 128,
    "ffn_dim": 256, "freq_dim": 256, "text_dim": 4096, "out_dim": 16, "num_heads": 1,
    "num_layers": 1, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6,
}
"""Read back by detection: dim from ``head.modulation``, heads = dim // 128, ffn, depth, in/out."""

WAN_VAE_CONFIG: dict[str, Any] = {
    "dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
    "temperal_downsample": [False, True, True], "dropout": 0.0,
}
"""The Wan 2.1 VAE's layout as ``comfy.sd.VAE`` builds it for these keys."""


def wan_unet(path: Path, seed: int = 0) -> Path:
    """A Wan T2V ``diffusion_models`` file (bare keys, bf16)."""
    import comfy.ldm.wan.model
    import comfy.ops

    module = comfy.ldm.wan.model.WanModel(dtype=torch.bfloat16, operations=comfy.ops.disable_weight_init, **WAN_UNET_CONFIG)
    return _save(_filled(module, seed), path)


WAN_LORA_RANK = 4
WAN_LORA_SCALE = 0.1
"""A LoRA update of about this share of each layer's weight: it changes the clip, and the model
stays as well-behaved as ``wan_unet``'s own initialisation."""


def wan_lora(path: Path, seed: int = 6) -> Path:
    """A LoRA file for ``wan_unet``'s model: ``diffusion_model.<layer>.lora_up.weight`` /
    ``.lora_down.weight`` / ``.alpha`` for every ``nn.Linear`` of its ``blocks`` (self- and
    cross-attention, FFN), the generic keys ``comfy.lora.model_lora_keys_unet`` maps on both trees;
    alpha = rank (scale 1), fp16."""
    import comfy.ldm.wan.model
    import comfy.ops

    module = comfy.ldm.wan.model.WanModel(dtype=torch.float32, device="meta", operations=comfy.ops.disable_weight_init, **WAN_UNET_CONFIG)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, layer in module.named_modules():
        if name.startswith("blocks.") and isinstance(layer, torch.nn.Linear):
            key = f"diffusion_model.{name}"
            down = torch.randn(WAN_LORA_RANK, layer.in_features, generator=generator) / layer.in_features ** 0.5
            up = torch.randn(layer.out_features, WAN_LORA_RANK, generator=generator) * WAN_LORA_SCALE / WAN_LORA_RANK ** 0.5
            tensors |= {f"{key}.lora_down.weight": down.half(), f"{key}.lora_up.weight": up.half(), f"{key}.alpha": torch.tensor(float(WAN_LORA_RANK))}
    return _save(tensors, path)


def wan_vae(path: Path) -> Path:
    import comfy.ldm.wan.vae

    module = comfy.ldm.wan.vae.WanVAE(**WAN_VAE_CONFIG)
    return _save({k: v.half() for k, v in _filled(module, seed=4).items()}, path)


def flux_gguf_q8_0(path: Path) -> Path:
    """The same Flux as ``flux_unet``, written with the ``gguf`` package: 2-d weights whose rows
    split into 32-value blocks as Q8_0, everything else F32 (what ComfyUI-GGUF's loader reads)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch="flux")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, tensor in flux_module().state_dict().items():
        data = tensor.float().numpy()
        if data.ndim == 2 and data.shape[-1] % gguf.GGML_QUANT_SIZES[q8][0] == 0:
            writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


FLUX2_UNET_OVERRIDES: dict[str, Any] = {
    "hidden_size": 128, "num_heads": 1, "axes_dim": [32, 32, 32, 32], "context_in_dim": 4096,
    "guidance_embed": False, "depth": 1, "depth_single_blocks": 1,
}
"""``tiny_dits.flux2_config`` at the widths ``comfy.model_detection`` reads back for Flux.2."""

ZIMAGE_UNET_OVERRIDES: dict[str, Any] = {
    "dim": 3840, "n_heads": 30, "n_kv_heads": 30, "axes_dims": [32, 48, 48], "n_layers": 1, "n_refiner_layers": 2,
    "cap_feat_dim": 4096,
}
"""``tiny_dits.zimage_config`` at what ``comfy.model_detection``'s Z-Image branch hard-codes."""


def flux2_unet(path: Path) -> Path:
    """A Flux.2 ``diffusion_models`` file (bare DiT keys, bf16); ComfyUI 0.33 only."""
    from .tiny_dits import flux2_config

    return _save(flux_module(**flux2_config(**FLUX2_UNET_OVERRIDES)).state_dict(), path)


def zimage_unet(path: Path) -> Path:
    """A Z-Image ``diffusion_models`` file (bare ``NextDiT`` keys with the caption / image pad
    tokens, bf16); ComfyUI 0.33 only."""
    import comfy.ldm.lumina.model
    import comfy.ops

    from .tiny_dits import zimage_config

    module = comfy.ldm.lumina.model.NextDiT(dtype=torch.bfloat16, operations=comfy.ops.disable_weight_init, **zimage_config(**ZIMAGE_UNET_OVERRIDES))
    return _save(_filled(module, seed=5), path)
