"""The real models of the real-size cost model (bench/speed/realsize.py): their ComfyUI classes and
configs, block lists, token grids, sampling set-ups, and which model evaluations a ToMA setting merges.

Nothing here is timed. Each family's full-size model is built on torch's ``meta`` device from its
``comfy.supported_models`` config (no memory, no weights): its ``diffusion_model`` gives the real
block list (and, for UNets, the pack's own ``find_sites`` gives every transformer block's level), and
its ModelPatcher carries the real ``model_sampling``, patched the way a user's workflow patches it
(``ModelSamplingFlux`` by resolution for Flux.1-dev, ``ModelSamplingSD3`` / ``ModelSamplingAuraFlow``
shifts for the others). The evaluations of a run come from ComfyUI's own schedule
(``comfy.samplers.calculate_sigmas``) and its own k-diffusion sampler run on a recording denoiser;
each evaluation is decided by the pack's ``MergeSchedule.decide``, as the APPLY_MODEL wrapper decides it.

Axis letters: N image tokens of a grid, D kept tokens, C channels, T text tokens, F latent frames.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

import torch

from harness.pack import pack_module
from harness.tiny_models import tree_config

from .. import cli


def import_comfy(device: str = "cpu") -> Path:
    """Import ComfyUI (cpu mode unless `device` is not cpu) with attention through torch SDPA (what
    ComfyUI uses on GPUs), via bench.cli."""
    return cli.import_comfy(argparse.Namespace(attention="pytorch", device=device))


@dataclass(frozen=True)
class Sampling:
    """How a workflow sets the model's sampling up: `node` None (the checkpoint's own model_sampling),
    "flux" (ModelSamplingFlux at the image size, max_shift 1.15, base_shift 0.5), "sd3"
    (ModelSamplingSD3) or "aura" (ModelSamplingAuraFlow) with `shift`; a shift per resolution label
    overrides it."""

    node: str | None = None
    shift: float = 0.0
    shift_by_resolution: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RealFamily:
    """One model as users run it.

    config_class: comfy.supported_models class; unet_config: its full-size config; reduced: the
    overrides of the few-block model that is timed (same width, same non-block layers); text_len:
    T of the usual prompt (ComfyUI's tokenizer minimum); steps / sampler / scheduler / cfg: the
    usual run (cfg > 1: a cond and an uncond evaluation per step, batched into one call of batch 2);
    video: tokens have a frame axis (latent frames = (frames - 1) // 4 + 1); frames: the usual
    frame count. probes: another family whose timed blocks are the same classes at the same width
    (its probes price this one). template: the ComfyUI workflow template the usual run is read from.
    size: the RESOLUTIONS label of the usual run (None: 720p for video, 1024 for images).
    scheduler "flux2" is the Flux2Scheduler node (comfy_extras.nodes_flux: its own shift from the
    image size and step count), as ComfyUI 0.33's Flux.2 templates wire it.
    """

    name: str
    title: str
    config_class: str
    unet_config: dict[str, Any]
    reduced: dict[str, Any]
    text_len: int
    steps: int
    sampler: str
    scheduler: str
    cfg: float
    sampling: Sampling = Sampling()
    video: bool = False
    probes: str | None = None
    frames: int = 81
    template: str = ""
    size: str | None = None

    @property
    def resolution(self) -> str:
        """The RESOLUTIONS label of the usual run."""
        return self.size or ("720p" if self.video else "1024")

    @property
    def cross_text(self) -> bool:
        """Text enters by cross-attention (Wan, Kandinsky 5): a block attends over image tokens only."""
        return self.name.startswith(("wan", "kandinsky5"))

    @property
    def probed(self) -> str:
        """The family whose probes time this one's blocks (itself, or one with the same block classes
        at the same width)."""
        return self.probes or self.name

    @property
    def unet(self) -> bool:
        return "model_channels" in self.unet_config


_FLUX = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "vec_in_dim": 768, "context_in_dim": 4096,
         "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24, "depth": 19, "depth_single_blocks": 38,
         "axes_dim": [16, 56, 56], "theta": 10000, "patch_size": 2, "qkv_bias": True, "guidance_embed": True}
_UNET = {"use_checkpoint": False, "image_size": 32, "in_channels": 4, "out_channels": 4, "model_channels": 320,
         "use_spatial_transformer": True, "legacy": False, "use_temporal_attention": False, "use_temporal_resblock": False}
_SDXL = _UNET | {"num_res_blocks": [2, 2, 2], "channel_mult": [1, 2, 4], "transformer_depth": [0, 0, 2, 2, 10, 10],
                 "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10], "transformer_depth_middle": 10,
                 "use_linear_in_transformer": True, "num_classes": "sequential", "adm_in_channels": 2816,
                 "context_dim": 2048, "num_heads": -1, "num_head_channels": 64}
_SD15 = _UNET | {"num_res_blocks": [2, 2, 2, 2], "channel_mult": [1, 2, 4, 4], "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
                 "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0], "transformer_depth_middle": 1,
                 "use_linear_in_transformer": False, "adm_in_channels": None, "context_dim": 768, "num_heads": 8,
                 "num_head_channels": -1}
_SD35L = {"in_channels": 16, "patch_size": 2, "depth": 38, "num_blocks": 38, "adm_in_channels": 2048, "out_channels": 16,
          "pos_embed_scaling_factor": None, "pos_embed_max_size": 192, "num_patches": 36864, "qk_norm": "rms",
          "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 4096, "out_features": 2432}}}
_QWEN = {"image_model": "qwen_image", "in_channels": 64, "out_channels": 16, "patch_size": 2, "num_layers": 60,
         "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584, "axes_dims_rope": (16, 56, 56)}
_WAN = {"image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "in_dim": 16, "out_dim": 16,
        "text_dim": 4096, "freq_dim": 256, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6}
_FLUX2 = {"image_model": "flux2", "in_channels": 128, "out_channels": 128, "vec_in_dim": None, "context_in_dim": 15360,
          "hidden_size": 6144, "mlp_ratio": 3.0, "num_heads": 48, "depth": 8, "depth_single_blocks": 48,
          "axes_dim": [32, 32, 32, 32], "theta": 2000, "patch_size": 1, "qkv_bias": False, "guidance_embed": True,
          "global_modulation": True, "mlp_silu_act": True, "ops_bias": False, "default_ref_method": "index",
          "ref_index_scale": 10.0, "txt_ids_dims": [3]}
"""Flux.2-dev as comfy.model_detection reads it (the flux2 branch: global modulation, SiLU-gated MLP,
no biases, 128 latent channels at patch 1)."""
_ZIMAGE = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 3840, "cap_feat_dim": 2560, "n_layers": 30,
           "n_refiner_layers": 2, "qk_norm": True, "n_heads": 30, "n_kv_heads": 30, "axes_dims": [32, 48, 48],
           "axes_lens": [1536, 512, 512], "rope_theta": 256.0, "ffn_dim_multiplier": 8.0 / 3.0, "z_image_modulation": True,
           "time_scale": 1000.0, "pad_tokens_multiple": 32}
"""Z-Image (Turbo) as comfy.model_detection reads it (the Lumina2 dim-3840 branch, caption and image
padded with pad tokens to a multiple of 32)."""
_HUNYUAN = {"image_model": "hunyuan_video", "in_channels": 16, "out_channels": 16, "vec_in_dim": 768,
            "context_in_dim": 4096, "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24, "depth": 20,
            "depth_single_blocks": 40, "axes_dim": [16, 56, 56], "theta": 256, "patch_size": [1, 2, 2],
            "qkv_bias": True, "guidance_embed": True, "byt5": False, "meanflow": False}
_HUNYUAN15 = _HUNYUAN | {"in_channels": 65, "out_channels": 32, "vec_in_dim": None, "context_in_dim": 3584, "hidden_size": 2048,
                         "num_heads": 16, "depth": 54, "depth_single_blocks": 0, "patch_size": [1, 1, 1], "guidance_embed": False,
                         "use_cond_type_embedding": True, "vision_in_dim": 1152, "meanflow_sum": True}
"""HunyuanVideo 1.5 (720p T2V) as comfy.model_detection reads it: 54 double blocks at hidden 2048 (16 heads
of 128), no single blocks, patch 1 on the 16x VAE's 32-channel latent plus 33 concat channels. Its
ByT5 glyph tokens are left out (they come only with quoted text in the prompt)."""
_KLEIN4B = _FLUX2 | {"hidden_size": 3072, "num_heads": 24, "depth": 5, "depth_single_blocks": 20, "context_in_dim": 7680,
                     "guidance_embed": False}
_KLEIN9B = _FLUX2 | {"hidden_size": 4096, "num_heads": 32, "depth": 8, "depth_single_blocks": 24, "context_in_dim": 12288,
                     "guidance_embed": False}
"""Flux.2 Klein 4B / 9B: the Flux.2 blocks at hidden 3072 / 4096, 5 + 20 / 8 + 24 blocks, Qwen3-4B / 8B
text (3 layers stacked: 7680 / 12288), no guidance embedding (the distilled models run cfg 1)."""
_LONGCAT = _FLUX | {"depth": 10, "depth_single_blocks": 20, "context_in_dim": 3584, "vec_in_dim": None, "guidance_embed": False,
                    "txt_ids_dims": [1, 2]}
"""LongCat-Image: Flux.1's block classes at hidden 3072 (10 double + 20 single), Qwen2.5-VL text, no pooled
vector or guidance (comfy.supported_models.LongCatImage)."""
_KANDINSKY5 = {"image_model": "kandinsky5", "model_dim": 1792, "ff_dim": 7168, "time_dim": 512, "axes_dims": (16, 24, 24),
               "visual_embed_dim": 132, "num_text_blocks": 2, "num_visual_blocks": 32, "in_text_dim": 3584, "in_text_dim2": 768}
_KANDINSKY5_PRO = _KANDINSKY5 | {"model_dim": 4096, "ff_dim": 16384, "time_dim": 1024, "axes_dims": (32, 48, 48),
                                 "num_text_blocks": 4, "num_visual_blocks": 60}
_KANDINSKY5_IMAGE = _KANDINSKY5 | {"model_dim": 2560, "ff_dim": 10240, "axes_dims": (32, 48, 48), "rope_scale_factor": (1.0, 1.0, 1.0),
                                   "visual_embed_dim": 64, "num_visual_blocks": 50}
"""Kandinsky 5 as comfy.model_detection's kandinsky5 branch reads it: Video Lite (model_dim 1792, head
dim sum(axes_dims) = 64: 28 heads), Video Pro (4096, 32 heads of 128; time_dim 1024 is read from the
checkpoint), Image Lite (2560, 20 heads of 128, rope scale 1). The video models take 16 latent channels
plus 17 concat channels (image and mask, comfy.model_base.Kandinsky5.concat_cond): 132 = 33 x 2 x 2
patch features; Image Lite the 16 channels alone. Text (Qwen2.5-VL 3584, pooled CLIP-L 768) is
cross-attention; the text blocks run on the text alone."""

FAMILIES: dict[str, RealFamily] = {f.name: f for f in (
    RealFamily("flux", "Flux.1-dev", "Flux", _FLUX, {"depth": 1, "depth_single_blocks": 1}, 256, 20, "euler", "simple", 1.0,
               Sampling("flux")),
    RealFamily("flux2", "Flux.2-dev", "Flux2", _FLUX2, {"depth": 1, "depth_single_blocks": 1}, 512, 20, "euler", "flux2", 1.0,
               template="image_flux2_text_to_image"),
    RealFamily("flux2_klein4b", "Flux.2 Klein 4B", "Flux2", _KLEIN4B, {"depth": 1, "depth_single_blocks": 1}, 512, 4, "euler",
               "flux2", 1.0, template="image_flux2_klein_text_to_image (distilled)"),
    RealFamily("flux2_klein9b", "Flux.2 Klein 9B", "Flux2", _KLEIN9B, {"depth": 1, "depth_single_blocks": 1}, 512, 4, "euler",
               "flux2", 1.0, template="as Klein 4B distilled (4 steps, cfg 1)"),
    RealFamily("zimage", "Z-Image Turbo", "ZImage", _ZIMAGE, {"n_layers": 1}, 128, 8, "res_multistep", "simple", 1.0,
               Sampling("aura", 3.0), template="image_z_image_turbo"),
    RealFamily("zimage_base", "Z-Image", "ZImage", _ZIMAGE, {"n_layers": 1}, 128, 25, "res_multistep", "simple", 4.0,
               Sampling("aura", 3.0), probes="zimage", template="image_z_image"),
    RealFamily("longcat_image", "LongCat-Image", "LongCatImage", _LONGCAT, {"depth": 1, "depth_single_blocks": 1}, 512, 20, "euler",
               "simple", 4.0, probes="flux", template="image_longcat_text_to_image"),
    RealFamily("sdxl", "SDXL", "SDXL", _SDXL,
               {"transformer_depth": [0, 0, 1, 1, 1, 1], "transformer_depth_output": [0, 0, 0, 1, 1, 1, 1, 1, 1],
                "transformer_depth_middle": 1}, 77, 30, "euler", "normal", 7.0),
    RealFamily("sd15", "SD1.5", "SD15", _SD15, {}, 77, 20, "euler", "normal", 7.0),
    RealFamily("sd35_large", "SD3.5 Large", "SD3", _SD35L, {"num_blocks": 2}, 154, 28, "euler", "sgm_uniform", 4.5,
               Sampling("sd3", 3.0)),
    RealFamily("qwen_image", "Qwen-Image", "QwenImage", _QWEN, {"num_layers": 1}, 128, 20, "euler", "simple", 2.5,
               Sampling("aura", 3.1)),
    RealFamily("wan14b", "Wan 2.1 14B", "WAN21_T2V", _WAN | {"dim": 5120, "ffn_dim": 13824, "num_heads": 40, "num_layers": 40},
               {"num_layers": 1}, 512, 30, "euler", "simple", 6.0, Sampling("sd3", 8.0, {"720p": 5.0}), video=True),
    RealFamily("wan22_14b", "Wan 2.2 14B", "WAN21_T2V", _WAN | {"dim": 5120, "ffn_dim": 13824, "num_heads": 40, "num_layers": 40},
               {"num_layers": 1}, 512, 20, "euler", "simple", 3.5, Sampling("sd3", 8.0), video=True, probes="wan14b",
               template="video_wan2_2_14B_t2v (its 20-step path: high-noise expert steps 1-10, low-noise 11-20)"),
    RealFamily("wan22_14b_4step", "Wan 2.2 14B + LightX2V", "WAN21_T2V",
               _WAN | {"dim": 5120, "ffn_dim": 13824, "num_heads": 40, "num_layers": 40}, {"num_layers": 1}, 512, 4, "euler",
               "simple", 1.0, Sampling("sd3", 5.0), video=True, probes="wan14b",
               template="video_wan2_2_14B_t2v (its default path: the 4-step LightX2V LoRA, steps 1-2 and 3-4)"),
    RealFamily("wan1.3b", "Wan 2.1 1.3B", "WAN21_T2V", _WAN | {"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30},
               {"num_layers": 1}, 512, 30, "euler", "simple", 6.0, Sampling("sd3", 8.0, {"720p": 5.0}), video=True),
    RealFamily("hunyuan_video", "HunyuanVideo", "HunyuanVideo", _HUNYUAN, {"depth": 1, "depth_single_blocks": 1}, 256, 20,
               "euler", "simple", 1.0, video=True),
    RealFamily("hunyuan_video15", "HunyuanVideo 1.5", "HunyuanVideo15", _HUNYUAN15, {"depth": 1, "in_channels": 32}, 256, 20,
               "euler", "simple", 6.0, Sampling("sd3", 7.0), video=True, frames=121, template="video_hunyuan_video_1.5_720p_t2v"),
    RealFamily("kandinsky5_lite", "Kandinsky 5 Video Lite", "Kandinsky5", _KANDINSKY5, {"num_visual_blocks": 1}, 128, 50,
               "euler_ancestral", "beta", 5.0, Sampling("sd3", 5.0), video=True, frames=121, template="video_kandinsky5_t2v",
               size="768x512"),
    RealFamily("kandinsky5_pro", "Kandinsky 5 Video Pro", "Kandinsky5", _KANDINSKY5_PRO, {"num_visual_blocks": 1}, 128, 50,
               "euler_ancestral", "beta", 5.0, Sampling("sd3", 5.0), video=True, frames=121,
               template="as Video Lite's video_kandinsky5_t2v", size="768x512"),
    RealFamily("kandinsky5_image", "Kandinsky 5 Image Lite", "Kandinsky5Image", _KANDINSKY5_IMAGE, {"num_visual_blocks": 1}, 128,
               50, "euler", "simple", 3.5, Sampling("sd3", 3.0), template="image_kandinsky5_t2i"),
)}

RESOLUTIONS: dict[str, tuple[int, int]] = {"256": (256, 256), "384": (384, 384), "512": (512, 512), "768": (768, 768), "1024": (1024, 1024), "2048": (2048, 2048),
                                           "480p": (832, 480), "720p": (1280, 720), "768x512": (768, 512)}
"""Labels -> (width, height) in pixels. 480p / 720p are Wan's 832 x 480 and 1280 x 720; 768x512 is the
Kandinsky 5 video templates' size."""


def family(name: str) -> RealFamily:
    if name not in FAMILIES:
        raise ValueError(f"family {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


# ------------------------------------------------------------------------------ models on meta


@cache
def meta_patcher(name: str, reduced: bool = False) -> Any:
    """The family's full-size (or few-block) model on the meta device, in a ModelPatcher."""
    import comfy.model_patcher
    import comfy.supported_models

    fam = family(name)
    unet_config = tree_config(fam.unet_config | (fam.reduced if reduced else {}))
    config = getattr(comfy.supported_models, fam.config_class)(dict(unet_config))
    config.unet_config.update(unet_config)
    model = config.get_model({}, device=torch.device("meta"))
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def model_sampling(name: str, resolution: str) -> Any:
    """The model_sampling a workflow samples `name` with at `resolution` (see Sampling)."""
    return workflow_patcher(name, meta_patcher(name), resolution).get_model_object("model_sampling")


def workflow_patcher(name: str, patcher: Any, resolution: str) -> Any:
    """`patcher` through the family's model-sampling node as a workflow wires it (or unchanged)."""
    from comfy_extras import nodes_model_advanced as nodes

    fam = family(name)
    s = fam.sampling
    shift = s.shift_by_resolution.get(resolution, s.shift)
    if s.node == "flux":
        width, height = RESOLUTIONS[resolution]
        patcher = nodes.ModelSamplingFlux().patch(patcher, 1.15, 0.5, width, height)[0]
    elif s.node == "sd3":
        patcher = nodes.ModelSamplingSD3().patch(patcher, shift)[0]
    elif s.node == "aura":
        patcher = nodes.ModelSamplingAuraFlow().patch_aura(patcher, shift)[0]
    return patcher


def sampling_text(name: str, resolution: str) -> str:
    """E.g. 'ModelSamplingFlux (shift 1.15)' for the tables."""
    ms = model_sampling(name, resolution)
    shift = getattr(ms, "shift", None)
    kind = type(ms).__mro__[1].__name__ if type(ms).__name__ in ("ModelSampling", "ModelSamplingAdvanced") else type(ms).__name__
    return f"{kind}" + (f" shift {float(shift):.3g}" if shift is not None else "")


# ------------------------------------------------------------------------------ block list and grids


@dataclass(frozen=True)
class BlockSite:
    """One transformer block of the full-size model: the timed kind it costs as, whether the setting
    merges it, and the token grid it runs on (a UNet level, else the model's grid)."""

    kind: str
    selected: bool
    level: int = 1


def dit_kinds(name: str, reduced: bool = False) -> dict[str, int]:
    """Block count per timed kind of a DiT family (full-size or few-block), in execution order."""
    dm = meta_patcher(name, reduced).get_model_object("diffusion_model")
    if hasattr(dm, "double_blocks"):
        return {"double": len(dm.double_blocks), "single": len(dm.single_blocks)}
    if hasattr(dm, "joint_blocks"):
        return {"joint": len(dm.joint_blocks) - 1, "joint_last": 1}
    if hasattr(dm, "layers"):
        return {"double": len(dm.layers)}
    if hasattr(dm, "transformer_blocks"):
        return {"double": len(dm.transformer_blocks)}
    if hasattr(dm, "visual_transformer_blocks"):  # Kandinsky 5: the text blocks run on text alone, never merged
        return {"double": len(dm.visual_transformer_blocks)}
    return {"double": len(dm.blocks)}


def pack_family(name: str) -> Any:
    """The pack's family (nodes/families/registry.py Family) of real family `name`: its `scope` auto
    and its `blocks` auto rule (video or not) are the pack's, whatever the run's frames."""
    return pack_module("nodes.families.registry").family_of(meta_patcher(name).model.diffusion_model)


def block_sites(name: str, blocks: str = "auto", reduced: bool = False) -> list[BlockSite]:
    """Every transformer block of the full-size (or the timed few-block) model, with the pack's own
    selection for `blocks` (dit_blocks.parse_dit_blocks with the adapter's stream names; unet_blocks
    for UNets)."""
    fam = family(name)
    if fam.unet:
        sites = pack_module("nodes.families.unet_sites").find_sites(meta_patcher(name, reduced).get_model_object("diffusion_model"))
        spec = pack_module("nodes.families.unet_blocks").parse_unet_blocks(blocks)
        return [BlockSite(f"unet{int(s.module.attn1.to_q.weight.shape[0])}", spec.selects(s.block, s.downsample), s.downsample)
                for s in sites]
    kinds = dit_kinds(name, reduced)
    parse = partial(pack_module("nodes.machinery.dit_blocks").parse_dit_blocks, video=pack_family(name).video)
    if "joint" in kinds:
        total = kinds["joint"] + 1
        chosen = parse(blocks, {"double": total})
        return [BlockSite("joint" if i < total - 1 else "joint_last", chosen.selects("double", i)) for i in range(total)]
    if fam.cross_text:  # Wan's and Kandinsky 5's adapters name one stream "blocks"
        chosen = parse(blocks, {"blocks": kinds["double"]})
        return [BlockSite("double", chosen.selects("blocks", i)) for i in range(kinds["double"])]
    chosen = parse(blocks, kinds)
    return [BlockSite(kind, chosen.selects(kind, i)) for kind, n in kinds.items() for i in range(n)]


@dataclass(frozen=True)
class Grid:
    """Token layout of a model call: F frames of an h x w grid (the model's input grid)."""

    height: int
    width: int
    frames: int = 1

    @property
    def tokens(self) -> int:
        return self.frames * self.height * self.width

    def level(self, downsample: int) -> Grid:
        """The grid a UNet level `downsample` times smaller runs on (each stride-2 layer: ceil(n / 2))."""
        h, w, d = self.height, self.width, 1
        while d < downsample:
            h, w, d = math.ceil(h / 2), math.ceil(w / 2), d * 2
        return Grid(h, w, self.frames)

    def level_of(self, tokens: int) -> Grid:
        """The UNet level (downsample 1, 2, 4, ... at most 64) a call of `tokens` image tokens runs
        on: the first whose grid holds no more than that."""
        d = 1
        while self.level(d).tokens > tokens and d < 64:
            d *= 2
        return self.level(d)


def grid_for(name: str, width: int, height: int, frames: int = 1) -> Grid:
    """The model's token grid for a width x height image (x frames): latent / 8, then the 2 x 2
    patchify of a DiT (ceil, as ComfyUI pads); a UNet's latent itself; video latents have
    (frames - 1) // 4 + 1 frames."""
    fam = family(name)
    lh, lw = height // 8, width // 8
    latent_frames = (frames - 1) // 4 + 1 if fam.video else 1
    if fam.unet:
        return Grid(lh, lw)
    return Grid(math.ceil(lh / 2), math.ceil(lw / 2), latent_frames)


def kept_tokens(grid: Grid, ratio: float, tile_size: int, tile_frames: int | None = None) -> int:
    """D of the pack's tiling for one call: per frame, times the frames (tile_frames None: spatial
    tiles); with `tile_frames`, as a video family's plan (toma_core.video): frame 0 in spatial tiles,
    the frames after it in tiles of tile_frames frames."""
    tiling = pack_module("toma_core").TileGrid
    first = tiling(grid.height, grid.width, tile_size, ratio).num_kept
    if tile_frames is None or grid.frames == 1:
        return first * grid.frames
    return first + tiling(grid.height, grid.width, tile_size, ratio, frames=grid.frames - 1, tile_frames=tile_frames).num_kept


# ------------------------------------------------------------------------------ evaluations of a run


@dataclass(frozen=True)
class Evaluation:
    """One model evaluation of a sampling run: its step, whether it merges, and whether it builds
    (re-selects) its plans."""

    step: int
    sigma: float
    merge: bool
    reselect: bool


def run_sigmas(name: str, resolution: str, steps: int, scheduler: str) -> torch.Tensor:
    """This run's sigma schedule from ComfyUI's scheduler code on the family's model_sampling."""
    import comfy.samplers

    if scheduler == "flux2":
        from comfy_extras.nodes_flux import Flux2Scheduler

        width, height = RESOLUTIONS[resolution]
        return torch.as_tensor(Flux2Scheduler.execute(steps, width, height).args[0]).float()
    return comfy.samplers.calculate_sigmas(model_sampling(name, resolution), scheduler, steps).float()


class _Recorder:
    """A denoiser that returns zeros and records the sigmas it is called at. Samplers that read the
    model's sampling (res_multistep's noise_scale, the CONST checks) find the workflow's patcher
    where ComfyUI's KSampler puts it (model.inner_model.model_patcher / .inner_model)."""

    def __init__(self, patcher: Any) -> None:
        self.seen: list[float] = []
        if patcher is not None:
            self.inner_model = type("Inner", (), {"model_patcher": patcher, "inner_model": patcher.model})()

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **_: Any) -> torch.Tensor:
        self.seen.append(float(sigma.flatten()[0]))
        return torch.zeros_like(x)


def evaluated_sigmas(sampler: str, sigmas: torch.Tensor, patcher: Any = None) -> list[float]:
    """The sigmas a ComfyUI sampler evaluates the model at for this schedule, recorded by running its
    own code (comfy.k_diffusion.sampling.sample_<name>, or uni_pc) on a denoiser that returns zeros
    (`patcher`: the workflow's model, for samplers that read its model_sampling)."""
    import comfy.k_diffusion.sampling as kd
    from comfy.extra_samplers import uni_pc

    denoiser = _Recorder(patcher)
    seen = denoiser.seen

    fn = {"uni_pc": uni_pc.sample_unipc, "uni_pc_bh2": uni_pc.sample_unipc_bh2}.get(sampler) or getattr(kd, f"sample_{sampler}")
    x = torch.zeros((1, 4, 8, 8))
    with torch.no_grad():
        fn(denoiser, x, sigmas, extra_args={}, disable=True)
    return seen


def evaluations(name: str, resolution: str, schedule: Any, steps: int | None = None, sampler: str | None = None,
                scheduler: str | None = None) -> list[Evaluation]:
    """Every model evaluation of the family's usual run (or the given steps / sampler / scheduler),
    each decided by the pack's MergeSchedule as the wrappers decide it (window from the patched
    model_sampling's percent_to_sigma, step = largest i with sigmas[i] >= sigma)."""
    fam = family(name)
    sigmas = run_sigmas(name, resolution, steps or fam.steps, scheduler or fam.scheduler)
    window = schedule.window(model_sampling(name, resolution).percent_to_sigma)
    listed = [float(s) for s in sigmas]
    out = []
    patcher = workflow_patcher(name, meta_patcher(name), resolution)
    for sigma in evaluated_sigmas(sampler or fam.sampler, sigmas, patcher):
        decision = schedule.decide(sigma, listed, window)
        out.append(Evaluation(decision.step, sigma, decision.merge, decision.reselect))
    return out


def calls_per_evaluation(name: str, cfg: float | None = None) -> int:
    """Samples per model call: 2 with CFG (cond and uncond batched), 1 for guidance-distilled runs."""
    return 2 if (family(name).cfg if cfg is None else cfg) > 1.0 else 1
