"""The trained tiny Wan fixture: config, clip codec, synthetic clips, loading, conditioning, sampler.

The model is ComfyUI's own Wan 2.1 T2V (``comfy.supported_models.WAN21_T2V`` ->
``comfy.model_base.WAN21`` -> ``comfy.ldm.wan.model.WanModel``; patch (1, 2, 2), text
cross-attention, ``ModelSamplingDiscreteFlow`` with the class's shift 8), at width 64, whose weights
``bench/quality/train_video_fixture.py`` trained on the synthetic clips below. The file layout
follows the image fixtures (``harness/trained.py``): ``fixtures/wan.safetensors`` holds fp16
weights and, under ``conditioning.``, the fixed fp32 context; ``fixtures/wan.json`` the config and
provenance. Without the file ``load_model`` returns the same class with seeded random weights.

Clip codec (in place of Wan's VAE; exact, float-precision invertible, no learnt parts): a clip
(B, 3, F, H, W) in [0, 1] is scaled to ``CODEC_GAIN (2 x - 1)``, each frame is pixel-unshuffled by 2
(12 channels) and mapped by the first 12 columns of the order-16 Sylvester-Hadamard matrix / 4 into
the 16 latent channels: z (B, 16, F, H/2, W/2) is the model-space latent; ``encode`` returns
``Wan21.process_out(z)`` and ``decode`` applies ``process_in`` first, so ``comfy.sample.sample``'s
output decodes directly. One latent frame is one video frame (Wan's VAE packs 4 frames into one
latent frame; the token grid the transformer sees is what matters here).

Size: 9 frames of 64 x 64 px -> latent (16, 9, 32, 32) -> 9 x 16 x 16 = 2,304 video tokens.

Clips (``make_clip``) come from the photographs the image fixtures use (``skimage.data``): a view of
side s (log-uniform between 64 px and the photo's short side / 1.25) resized to 64 px, which
- pans (``pan``) in a random direction at 0 to 2 tokens (0-8 px) per frame,
- zooms (``zoom``) in or out by up to 1.6x over the clip around a drifting centre, or
- holds still while a crop of another photograph (16-32 px) moves across it (``sprite``),
so that clips have the temporal redundancy and the motion of real footage.

The model is unconditional: one fixed context (``conditioning``); cfg 1.0 runs the positive only.
Import only after ComfyUI is on sys.path (``comfy_env.import_comfy``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import tiny_models, trained

log = logging.getLogger(__name__)

FAMILY = "wan"
FRAMES, PIXELS, UNSHUFFLE = 9, 64, 2
LATENT_CHANNELS = 16
TEXT_LEN, TEXT_DIM = 8, 64
CODEC_GAIN = trained.CODEC_GAIN
CLIP_KINDS = ("pan", "zoom", "sprite")

WAN_CONFIG: dict[str, Any] = {
    "image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "text_len": 512,
    "in_dim": 16, "dim": 64, "ffn_dim": 192, "freq_dim": 256, "text_dim": TEXT_DIM, "out_dim": 16,
    "num_heads": 2, "num_layers": 6, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True,
    "eps": 1e-6,
}
"""Wan 2.1 T2V topology at width 64: 2 heads of 32 (rope axes 12/10/10), ffn 192, 6 blocks, text 64.
Attention over 2,304 tokens is most of a forward at this width (as at Wan 14B's 32,760 tokens); width
128 trained 2.3x slower per step on one CPU thread."""

SAMPLER: dict[str, Any] = {"steps": 20, "sampler_name": "euler", "scheduler": "simple", "cfg": 1.0}

STUDENT = "wan_4step"
"""The step-distilled student (``bench/quality/distill_fixtures.py``): the same class, codec and
context, sampled with STUDENT_SAMPLER; ``load_model(student=True)``."""
STUDENT_SAMPLER: dict[str, Any] = SAMPLER | {"steps": 4}

LOADER_CONFIG: dict[str, Any] = {"num_heads": WAN_CONFIG["num_heads"], "text_dim": WAN_CONFIG["text_dim"]}
"""The WAN_CONFIG entries ``comfy.model_detection.detect_unet_config`` cannot read from the weights'
shapes (it sets num_heads = dim // 128, 0 at width 64, and leaves text_dim at WanModel's 4096). On
ComfyUI 0.33 it updates a Wan config with the ``"transformer"`` entry of the file's ``config``
metadata, so the fixture stores these there and UNETLoader loads it (``loader_metadata``)."""


def loader_metadata() -> dict[str, str]:
    """The safetensors metadata that lets ComfyUI's own loader read LOADER_CONFIG."""
    return {"config": json.dumps({"transformer": LOADER_CONFIG})}


def weights_path(student: bool = False) -> Path:
    return trained.FIXTURE_DIR / f"{STUDENT if student else FAMILY}.safetensors"


def meta_path(student: bool = False) -> Path:
    return weights_path(student).with_suffix(".json")


def available(student: bool = False) -> bool:
    return weights_path(student).is_file()


def metadata() -> dict[str, Any]:
    """fixtures/wan.json; {} when there is none."""
    return json.loads(meta_path().read_text()) if meta_path().is_file() else {}


def latent_shape(batch: int = 1) -> tuple[int, int, int, int, int]:
    """(B, C, F, h, w) of the fixture's latent."""
    side = PIXELS // UNSHUFFLE
    return (batch, LATENT_CHANNELS, FRAMES, side, side)


def _latent_format() -> Any:
    import comfy.latent_formats

    return comfy.latent_formats.Wan21()


def codec_matrix() -> torch.Tensor:
    """M (16, 12): orthonormal columns from the 12 pixel channels into the 16 latent channels."""
    return trained._hadamard(LATENT_CHANNELS)[:, :3 * UNSHUFFLE ** 2] / math.sqrt(LATENT_CHANNELS)


def to_model_space(clips: torch.Tensor) -> torch.Tensor:
    """Clips (B, 3, F, H, W) in [0, 1] -> model-space latent z (B, 16, F, H/2, W/2)."""
    if clips.ndim != 5 or clips.shape[1] != 3:
        raise ValueError(f"clips must be (B, 3, F, H, W), got {tuple(clips.shape)}")
    b, _, f, h, w = clips.shape
    frames = clips.float().permute(0, 2, 1, 3, 4).reshape(b * f, 3, h, w)
    x = F.pixel_unshuffle((frames * 2 - 1) * CODEC_GAIN, UNSHUFFLE)
    z = torch.einsum("cp,nphw->nchw", codec_matrix(), x)
    return z.reshape(b, f, *z.shape[1:]).permute(0, 2, 1, 3, 4)


def from_model_space(z: torch.Tensor) -> torch.Tensor:
    """Model-space latent (B, 16, F, h, w) -> clips (B, 3, F, H, W), not clamped."""
    b, _, f, h, w = z.shape
    x = torch.einsum("cp,nchw->nphw", codec_matrix(), z.float().permute(0, 2, 1, 3, 4).reshape(b * f, -1, h, w))
    frames = (F.pixel_shuffle(x, UNSHUFFLE) / CODEC_GAIN + 1) / 2
    return frames.reshape(b, f, *frames.shape[1:]).permute(0, 2, 1, 3, 4)


def encode(clips: torch.Tensor) -> torch.Tensor:
    """Clips (B, 3, F, H, W) in [0, 1] -> latent in ComfyUI's latent space (process_out of z)."""
    return _latent_format().process_out(to_model_space(clips))


def decode(latent: torch.Tensor) -> torch.Tensor:
    """Latent (B, 16, F, h, w) as ``comfy.sample.sample`` returns it -> clips (B, 3, F, H, W) in [0, 1]."""
    return from_model_space(_latent_format().process_in(latent.float())).clamp(0, 1)


# ---- synthetic clips -------------------------------------------------------------------------------

def _view(photo: torch.Tensor, top: float, left: float, side: float, size: int) -> torch.Tensor:
    """(3, size, size): the square view of `photo` at (top, left) of `side` px, antialiased resize."""
    s = max(1, min(int(round(side)), *photo.shape[1:]))
    t = min(max(0, int(round(top))), photo.shape[1] - s)
    l = min(max(0, int(round(left))), photo.shape[2] - s)
    crop = photo[None, :, t:t + s, l:l + s]
    return F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


def _uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=gen))


def make_clip(photos: list[torch.Tensor], kind: str, gen: torch.Generator, speed: float | None = None,
              frames: int = FRAMES, size: int = PIXELS) -> torch.Tensor:
    """One clip (3, F, size, size) in [0, 1] of `kind` (CLIP_KINDS; see the module docstring).
    `speed`: pan speed in output px per frame (random in [0, 8] when None)."""
    if kind not in CLIP_KINDS:
        raise ValueError(f"kind {kind!r} is not one of {CLIP_KINDS}")
    photo = photos[int(torch.randint(len(photos), (1,), generator=gen))]
    short = min(photo.shape[1:])
    side = math.exp(_uniform(gen, math.log(size), math.log(short / 1.25)))
    scale = side / size  # source px per output px
    if kind == "pan":
        speed = _uniform(gen, 0.0, 8.0) if speed is None else speed
        angle = _uniform(gen, 0.0, 2 * math.pi)
        dy, dx = (speed * scale * math.sin(angle), speed * scale * math.cos(angle))
        span_y, span_x = abs(dy) * (frames - 1), abs(dx) * (frames - 1)
        side = min(side, photo.shape[1] - span_y - 1, photo.shape[2] - span_x - 1)
        top0 = _uniform(gen, 0, photo.shape[1] - side - span_y) + (span_y if dy < 0 else 0)
        left0 = _uniform(gen, 0, photo.shape[2] - side - span_x) + (span_x if dx < 0 else 0)
        shots = [_view(photo, top0 + f * dy, left0 + f * dx, side, size) for f in range(frames)]
    elif kind == "zoom":
        factor = math.exp(_uniform(gen, -math.log(1.6), math.log(1.6)))
        sides = [side * factor ** (f / (frames - 1)) for f in range(frames)]
        sides = [s * min(1.0, (short - 1) / max(sides)) for s in sides]
        big = max(sides)
        cy, cx = _uniform(gen, big / 2, photo.shape[1] - big / 2), _uniform(gen, big / 2, photo.shape[2] - big / 2)
        shots = [_view(photo, cy - s / 2, cx - s / 2, s, size) for s in sides]
    else:
        top, left = _uniform(gen, 0, photo.shape[1] - side), _uniform(gen, 0, photo.shape[2] - side)
        background = _view(photo, top, left, side, size)
        other = photos[int(torch.randint(len(photos), (1,), generator=gen))]
        sprite_side = int(torch.randint(16, 33, (1,), generator=gen))
        sprite = _view(other, _uniform(gen, 0, other.shape[1] - 160), _uniform(gen, 0, other.shape[2] - 160),
                       160, sprite_side)
        y0, x0 = _uniform(gen, 0, size - sprite_side), _uniform(gen, 0, size - sprite_side)
        y1, x1 = _uniform(gen, 0, size - sprite_side), _uniform(gen, 0, size - sprite_side)
        shots = []
        for f in range(frames):
            a = f / (frames - 1)
            y, x = int(round(y0 + a * (y1 - y0))), int(round(x0 + a * (x1 - x0)))
            shot = background.clone()
            shot[:, y:y + sprite_side, x:x + sprite_side] = sprite
            shots.append(shot)
    clip = torch.stack(shots, dim=1).clamp(0, 1)
    return clip.flip(-1) if float(torch.rand((), generator=gen)) < 0.5 else clip


def random_clips(photos: list[torch.Tensor], batch: int, gen: torch.Generator, crop: int | None = None) -> torch.Tensor:
    """(B, 3, F, H, W): clips of random kinds (pans half the time, zooms and sprites a quarter each).
    `crop`: each clip cut to a random `crop` x `crop` px window, the same in every frame, so it keeps
    the full-size clip's motion and pixel statistics on fewer tokens."""
    kinds = ("pan", "pan", "zoom", "sprite")
    clips = [make_clip(photos, kinds[int(torch.randint(4, (1,), generator=gen))], gen) for _ in range(batch)]
    if crop is not None:
        if not 0 < crop <= PIXELS or crop % (2 * UNSHUFFLE):
            raise ValueError(f"crop {crop} must be a multiple of {2 * UNSHUFFLE} in [{2 * UNSHUFFLE}, {PIXELS}] px")
        corners = torch.randint(PIXELS - crop + 1, (batch, 2), generator=gen).tolist()
        clips = [c[..., y:y + crop, x:x + crop] for c, (y, x) in zip(clips, corners)]
    return torch.stack(clips)


# ---- model, conditioning ----------------------------------------------------------------------------

def build_model(dtype: torch.dtype = torch.float32) -> Any:
    """ComfyUI's WAN21 BaseModel (CPU, weights and compute in `dtype`), uninitialised weights."""
    import comfy.supported_models

    return tiny_models.model_config(comfy.supported_models.WAN21_T2V, WAN_CONFIG, dtype).get_model({})


def _read_fixture(student: bool = False) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(weights_path(student)))


def load_model(dtype: torch.dtype = torch.float32, student: bool = False) -> Any:
    """The fixture (`student`: the 4-step student) in a ModelPatcher: trained weights (stored fp16, run
    in `dtype`), or seeded random weights when its file is missing (logged)."""
    import comfy.model_patcher

    model = build_model(dtype)
    if available(student):
        state = {k: v.to(dtype) for k, v in _read_fixture(student).items() if not k.startswith(trained.COND_PREFIX)}
        model.diffusion_model.load_state_dict(state, strict=True)
    else:
        log.warning("%s missing: the Wan fixture has random weights", weights_path(student))
        tiny_models.init_weights(model.diffusion_model, trained.RANDOM_INIT_SEED)
    model.eval()
    device = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def default_conditioning_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """The fixed context (1, TEXT_LEN, TEXT_DIM) a fresh training run draws."""
    return {"context": torch.randn((1, TEXT_LEN, TEXT_DIM), generator=torch.Generator().manual_seed(seed))}


def conditioning_tensors() -> dict[str, torch.Tensor]:
    """The context the fixture was trained with (stored in its file), else the default draw."""
    if not available():
        return default_conditioning_tensors()
    n = len(trained.COND_PREFIX)
    return {k[n:]: v.float() for k, v in _read_fixture().items() if k.startswith(trained.COND_PREFIX)}


def conditioning(batch: int = 1) -> tuple[list, list]:
    """(positive, negative) CONDITIONING lists; negative equals positive (cfg 1.0 skips it)."""
    context = conditioning_tensors()["context"].repeat(batch, 1, 1)
    return [[context, {}]], [[context.clone(), {}]]
