"""Trained tiny fixtures: model configs, the pixel codec, loading, conditioning, sampler settings.

Each family is a real ComfyUI model class built from a small config (``comfy.supported_models.Flux``
-> ``comfy.model_base.Flux``; ``comfy.supported_models.SDXL`` -> ``comfy.model_base.SDXL``), whose
weights ``bench/quality/train_fixtures.py`` trained on random crops of the photographs bundled with
scikit-image. ``fixtures/<family>.safetensors`` holds the weights (fp16; the model runs in fp32 on the
CPU) and the fixed conditioning tensors; ``fixtures/<family>.json`` the config and provenance. Without
the fixture file ``load_model`` returns the same class with seeded random weights (logged), so code
written against this module runs before training has finished.

The codec (in place of a VAE; exact, float-precision invertible, no learnt parts):

* pixels (B, 3, H, W) in [0, 1] -> ``CODEC_GAIN (2 x - 1)`` in [-2.5, 2.5]: the gain brings crops of
  the training photographs to about unit variance in model space, as ComfyUI's latent formats scale
  real VAE latents (at gain 1 their std is ~0.4, and an undertrained EPS UNet's error at sigma_max
  swamps the data);
* ``pixel_unshuffle(r)`` -> (B, P, H/r, W/r), P = 3 r^2 (Flux: r = 2, P = 12; SDXL: r = 1, P = 3);
* a fixed matrix with orthonormal columns, the first P columns of the Sylvester-Hadamard matrix of
  order C divided by sqrt(C), maps the P pixel channels to the C latent channels the class's latent
  format has (Flux 16, SDXL 4): z = M x, and M^T z = x (M^T is M's pseudo-inverse). z lives in a
  P-dimensional subspace: the model learns to put nothing in the other C - P directions;
* z is the *model-space* latent (what the diffusion model sees). ComfyUI's sampler maps latents
  with the class's ``latent_format.process_in`` before sampling and ``process_out`` after, so
  ``encode`` returns ``process_out(z)`` (Flux: z / 0.3611 + 0.1159; SDXL: z / 0.13025) and
  ``decode`` applies ``process_in`` first. ``comfy.sample.sample`` returns latents in that space:
  ``decode`` its result directly.

SD1.5: 32 x 32 px -> latent (4, 32, 32): transformers at 32 x 32 = 1,024 and 16 x 16 = 256 tokens
(4,096 at 64 x 64 px trained 4x slower on this CPU).

Sizes: Flux 128 x 128 px -> latent (16, 64, 64) -> 32 x 32 = 1,024 image tokens (patch 2).
SDXL 64 x 64 px -> latent (4, 64, 64): transformers at 32 x 32 = 1,024 and 16 x 16 = 256 tokens
(SDXL's topology: none at full latent resolution). A (4, 64, 64) latent cannot come from 128 px
with a 4-channel latent format, so the UNet sees 64 x 64 px images.

The models are unconditional: training used one fixed context (``conditioning``), and sampling at
cfg 1.0 runs the positive pass only.

Import only after ComfyUI is on sys.path (``cli.import_comfy`` or ``comfy_env.import_comfy``):
ComfyUI imports happen inside the functions.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .tiny_models import init_weights, model_config, tiny_sdxl_config

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DIR: Path = ROOT / "fixtures"

COND_PREFIX = "conditioning."
"""Key prefix of the fixed conditioning tensors stored next to the weights in the safetensors file."""

RANDOM_INIT_SEED = 0

CODEC_GAIN = 2.5
"""Pixels in [-1, 1] are multiplied by this before the channel map (see the module docstring)."""


@dataclass(frozen=True)
class Family:
    """What defines one fixture family: ComfyUI config class, unet_config, pixel size, codec, text."""

    config_class: str
    unet_config: dict[str, Any]
    pixels: tuple[int, int]
    unshuffle: int
    text_len: int
    context_dim: int
    pooled_dim: int
    extras: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)


FLUX_CONFIG: dict[str, Any] = {
    "image_model": "flux",
    "in_channels": 16,
    "out_channels": 16,
    "vec_in_dim": 32,
    "context_in_dim": 64,
    "hidden_size": 128,
    "mlp_ratio": 2.0,
    "num_heads": 4,
    "depth": 4,
    "depth_single_blocks": 8,
    "axes_dim": [8, 12, 12],
    "theta": 10000,
    "patch_size": 2,
    "qkv_bias": True,
    "guidance_embed": True,
}
"""Flux topology: hidden 128, 4 heads of 32 (RoPE axes 8+12+12), 4 double + 8 single blocks."""

SDXL_CONFIG: dict[str, Any] = tiny_sdxl_config() | {"image_size": 64, "channel_mult": [1, 2, 3], "num_head_channels": 32}
"""SDXL topology scaled down: levels 1/2/3 x 32 channels, no transformers at full latent resolution,
depth 1 at 1/2, depth 2 at 1/4 and in the middle (SDXL: 0, 2, 10), linear proj, ADM 2816."""

SD15_CONFIG: dict[str, Any] = {
    "use_checkpoint": False,
    "image_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 32,
    "num_res_blocks": [1, 1, 1],
    "channel_mult": [1, 2, 2],
    "transformer_depth": [1, 1, 0],
    "transformer_depth_output": [1, 1, 1, 1, 0, 0],
    "transformer_depth_middle": 1,
    "use_spatial_transformer": True,
    "use_linear_in_transformer": False,
    "legacy": False,
    "context_dim": 64,
    "num_heads": -1,
    "num_head_channels": 32,
    "use_temporal_attention": False,
    "use_temporal_resblock": False,
}
"""SD1.5 topology scaled down: transformers at full latent resolution (32 x 32 = 1,024 tokens, where
ComfyUI's ToMe merges) and at 1/2, none at the last level, conv proj_in, no ADM."""

SPECS: dict[str, Family] = {
    "flux": Family(
        config_class="Flux", unet_config=FLUX_CONFIG, pixels=(128, 128), unshuffle=2, text_len=8,
        context_dim=64, pooled_dim=32, extras={"guidance": 3.5},
        sampler={"steps": 20, "sampler_name": "euler", "scheduler": "simple", "cfg": 1.0},
    ),
    "sdxl": Family(
        config_class="SDXL", unet_config=SDXL_CONFIG, pixels=(64, 64), unshuffle=1, text_len=8,
        context_dim=64, pooled_dim=1280, extras={"width": 64, "height": 64},
        sampler={"steps": 20, "sampler_name": "euler", "scheduler": "normal", "cfg": 1.0},
    ),
    "sd15": Family(
        config_class="SD15", unet_config=SD15_CONFIG, pixels=(32, 32), unshuffle=1, text_len=8,
        context_dim=64, pooled_dim=32,
        sampler={"steps": 20, "sampler_name": "euler", "scheduler": "normal", "cfg": 1.0},
    ),
}

FAMILIES: tuple[str, ...] = ("flux", "sdxl", "sd15")

STUDENTS: dict[str, str] = {"flux_4step": "flux"}
"""Step-distilled students (``bench/quality/distill_fixtures.py``) and their teachers: the teacher's
class, codec and conditioning, sampled at 4 steps. Not in FAMILIES (the fixtures every bench and
test iterates over); name one where a study wants it (``quality.py --families flux_4step``)."""
SPECS |= {name: replace(SPECS[teacher], sampler=SPECS[teacher].sampler | {"steps": 4})
          for name, teacher in STUDENTS.items()}

SAMPLER: dict[str, dict[str, Any]] = {name: dict(spec.sampler) for name, spec in SPECS.items()}
"""Per family, the settings the quality bench samples with through ``comfy.sample.sample``."""


def spec(family: str) -> Family:
    """The family's definition; ValueError for an unknown name."""
    if family not in SPECS:
        raise ValueError(f"family {family!r} is not one of {sorted(SPECS)}")
    return SPECS[family]


def weights_path(family: str) -> Path:
    """fixtures/<family>.safetensors."""
    spec(family)
    return FIXTURE_DIR / f"{family}.safetensors"


def meta_path(family: str) -> Path:
    """fixtures/<family>.json (config and provenance)."""
    return weights_path(family).with_suffix(".json")


def available(students: bool = False) -> tuple[str, ...]:
    """Families whose fixture weights exist (with `students`, the step-distilled ones too)."""
    names = (*FAMILIES, *STUDENTS) if students else FAMILIES
    return tuple(name for name in names if weights_path(name).is_file())


def metadata(family: str) -> dict[str, Any]:
    """The fixture's json (config, provenance); {} when there is none."""
    path = meta_path(family)
    return json.loads(path.read_text()) if path.is_file() else {}


def pixel_size(family: str) -> tuple[int, int]:
    """(H, W) in pixels the model was trained and is evaluated at."""
    return spec(family).pixels


def _latent_format(family: str) -> Any:
    import comfy.supported_models

    return getattr(comfy.supported_models, spec(family).config_class).latent_format()


def latent_channels(family: str) -> int:
    """C of the class's latent format (Flux 16, SDXL 4)."""
    return spec(family).unet_config["in_channels"]


def latent_shape(family: str, batch: int = 1) -> tuple[int, int, int, int]:
    """(B, C, h, w) of the family's latent."""
    s = spec(family)
    h, w = s.pixels
    return (batch, latent_channels(family), h // s.unshuffle, w // s.unshuffle)


def _hadamard(order: int) -> torch.Tensor:
    """Sylvester-Hadamard matrix (order a power of 2) with entries +-1."""
    h = torch.ones(1, 1)
    while h.shape[0] < order:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def codec_matrix(family: str) -> torch.Tensor:
    """M (C, P): orthonormal columns mapping the P = 3 r^2 pixel channels into the C latent channels."""
    s = spec(family)
    channels, pixel_channels = latent_channels(family), 3 * s.unshuffle ** 2
    return _hadamard(channels)[:, :pixel_channels] / math.sqrt(channels)


def to_model_space(family: str, images: torch.Tensor) -> torch.Tensor:
    """Images (B, 3, H, W) in [0, 1] -> model-space latent z (B, C, h, w) (what the network denoises)."""
    s = spec(family)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    x = F.pixel_unshuffle((images.float() * 2 - 1) * CODEC_GAIN, s.unshuffle)
    return torch.einsum("cp,bphw->bchw", codec_matrix(family), x)


def from_model_space(family: str, z: torch.Tensor) -> torch.Tensor:
    """Model-space latent (B, C, h, w) -> images (B, 3, H, W), not clamped."""
    x = torch.einsum("cp,bchw->bphw", codec_matrix(family), z.float())
    return (F.pixel_shuffle(x, spec(family).unshuffle) / CODEC_GAIN + 1) / 2


def encode(family: str, images: torch.Tensor) -> torch.Tensor:
    """Images (B, 3, H, W) in [0, 1] -> latent (B, C, h, w) in ComfyUI's latent space (process_out of z)."""
    return _latent_format(family).process_out(to_model_space(family, images))


def decode(family: str, latent: torch.Tensor) -> torch.Tensor:
    """Latent (B, C, h, w) as ``comfy.sample.sample`` returns it -> images (B, 3, H, W) clamped to [0, 1]."""
    return from_model_space(family, _latent_format(family).process_in(latent.float())).clamp(0, 1)


def family_config(family: str, dtype: torch.dtype = torch.float32) -> Any:
    """The family's ``comfy.supported_models`` config (weights and compute in `dtype`)."""
    import comfy.supported_models

    s = spec(family)
    return model_config(getattr(comfy.supported_models, s.config_class), s.unet_config, dtype)


def build_model(family: str, dtype: torch.dtype = torch.float32) -> Any:
    """The family's ComfyUI BaseModel (CPU, weights and compute in `dtype`) with uninitialised weights."""
    return family_config(family, dtype).get_model({})


def tensors_digest(path: Path) -> str:
    """sha256 over a safetensors file's tensors (name, dtype, shape, bytes; sorted by name), not its
    metadata: equal digests mean bit-identical weights and conditioning."""
    import hashlib

    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(str(path)).items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _read_fixture(family: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(weights_path(family)))


def load_model(family: str, dtype: torch.dtype = torch.float32) -> Any:
    """The family's ComfyUI model in a ModelPatcher: trained weights (CPU; stored fp16, run in
    `dtype`, fp32 by default), or seeded random weights when fixtures/<family>.safetensors is missing."""
    import comfy.model_patcher

    config = family_config(family, dtype)
    model = config.get_model({})
    if weights_path(family).is_file():
        state = {k: v.to(dtype) for k, v in _read_fixture(family).items() if not k.startswith(COND_PREFIX)}
        # The tree's own key conversion, as its loaders apply it: ComfyUI 0.33 names Flux's RMSNorm
        # gains `*_norm.weight` where the fixture (and 0.3.64) says `*_norm.scale`.
        model.diffusion_model.load_state_dict(config.process_unet_state_dict(state), strict=True)
    else:
        log.warning("%s missing: %s has random weights", weights_path(family), family)
        init_weights(model.diffusion_model, RANDOM_INIT_SEED)
    model.eval()
    device = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def patch_at_node_defaults(model: Any) -> Any:
    """ToMA on a fixture with the ToMA Patch node's default inputs, but min_tokens 0.

    The node's min_tokens "auto" leaves these tiny fixtures unmerged: their width is far below a
    real model's, where auto merges at the sizes users run (tests/integration/test_cost_profile.py).
    A fixture stands in for a real model's image, so it is measured merging as the real one would.
    """
    from .pack import pack_module

    nodes, patching = pack_module("nodes.node.toma_nodes"), pack_module("nodes.node.patching")
    inputs = {i.id: i.default for i in nodes.ToMAPatch.define_schema().inputs if i.id != "model"}
    return patching.patch_model(model, nodes.build_settings(**inputs, min_tokens=0))


def default_conditioning_tensors(family: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The fixed conditioning a fresh training run draws: context (1, T, context_dim) and pooled."""
    s = spec(family)
    gen = torch.Generator().manual_seed(seed)
    return {
        "context": torch.randn((1, s.text_len, s.context_dim), generator=gen),
        "pooled_output": torch.randn((1, s.pooled_dim), generator=gen),
    }


def conditioning_tensors(family: str) -> dict[str, torch.Tensor]:
    """The conditioning the fixture was trained with (stored in its file), else the default draw."""
    if not weights_path(family).is_file():
        return default_conditioning_tensors(family)
    return {k[len(COND_PREFIX):]: v.float() for k, v in _read_fixture(family).items() if k.startswith(COND_PREFIX)}


def conditioning_extras(family: str, tensors: dict[str, torch.Tensor], batch: int = 1) -> tuple[torch.Tensor, dict]:
    """(context (B, T, C), extras dict) as a CONDITIONING entry holds them."""
    extras = dict(spec(family).extras)
    extras["pooled_output"] = tensors["pooled_output"].repeat(batch, 1)
    return tensors["context"].repeat(batch, 1, 1), extras


def conditioning(family: str, batch: int = 1) -> tuple[list, list]:
    """(positive, negative) ComfyUI CONDITIONING lists matching training. The model is unconditional
    (one fixed context): negative is the same as positive, and cfg 1.0 skips it."""
    context, extras = conditioning_extras(family, conditioning_tensors(family), batch)
    positive = [[context, extras]]
    negative = [[context.clone(), dict(extras)]]
    return positive, negative


def trainable(model: Any) -> Any:
    """`model` in train mode with gradients on every diffusion-model weight.

    ComfyUI 0.33's ``comfy.model_base.BaseModel.__init__`` freezes the diffusion model it builds
    (``requires_grad_(False)``; 0.3.64 leaves the weights trainable), so without this the loss has no
    graph to backpropagate through.
    """
    model.diffusion_model.requires_grad_(True)
    model.train()
    return model


@contextmanager
def comfy_training() -> Iterator[None]:
    """ComfyUI's training switch on, as ``comfy_extras.nodes_train.TrainLoraNode`` sets it around
    its loop: with ``comfy.model_management.in_training`` ComfyUI 0.33's
    ``comfy.ldm.flux.math.apply_rope1`` runs its differentiable torch path instead of the
    comfy_kitchen kernel, which has no backward. Trees without the switch (0.3.64) always run the
    torch path."""
    import comfy.model_management as mm

    if not hasattr(mm, "in_training"):
        yield
        return
    was = mm.in_training
    mm.in_training = True
    try:
        yield
    finally:
        mm.in_training = was
