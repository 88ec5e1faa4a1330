"""The trained Wan fixture (fixtures/wan.safetensors, harness/trained_video.py,
bench/quality/train_video_fixture.py) and the video defaults' quality on it.

The fixture loads into ComfyUI's own WAN21 / WanModel with the shipped weights; the clip codec is a
float-precision round trip; the synthetic clips move as they claim (a still pan repeats its frame, a
moving crop leaves the background alone); the training objective backpropagates through the real
blocks; a 20-step sample through ``comfy.sample.sample`` decodes to frames correlated in space and
from frame to frame like the training clips, not like noise. fixtures/video_baseline.json records
the PSNR and flicker of the video defaults (``bench/quality/video_baseline.py --write``): a drop
beyond the margins, or settings that no longer match the record, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

MARGIN_DB = 1.0
"""Allowed drop of a setting's mean PSNR (float differences between CPUs may flip a near-tie)."""
FLICKER_MARGIN = 0.02
"""Allowed rise of a setting's mean flicker (relative error of frame-to-frame differences)."""
MIN_SPATIAL = 0.6
"""Lag-1 correlation of neighbouring pixels a seed-0 sample must exceed: 0.81 for the shipped
weights (training clips about 0.9, the sampler's starting noise about 0)."""
MIN_TEMPORAL = 0.4
"""Correlation of consecutive frames (each frame's mean removed) a seed-0 sample must exceed: 0.67
for the shipped weights (seeds 1 and 2: 0.59, 0.35; training clips 0.3-1: about 1 for still shots,
0.3 for fast pans over textures; the starting noise about 0). The fixture before the crop curriculum
and the local attention start (bench/quality/train_video_fixture.py) gave 0.00."""


@pytest.fixture(scope="module")
def tv(comfy: Path) -> Any:
    from harness import trained_video

    return trained_video


@pytest.fixture(scope="module")
def patcher(tv: Any) -> Any:
    assert tv.available(), f"{tv.weights_path()} is not shipped"
    return tv.load_model()


@pytest.fixture(scope="module")
def photos() -> list[torch.Tensor]:
    from bench.quality.train_fixtures import load_photos

    return load_photos()


def _lag1(x: torch.Tensor, dim: int) -> float:
    """Correlation of neighbours along `dim` of (3, F, H, W) clips, means removed per frame."""
    x = x - x.mean(dim=(-2, -1), keepdim=True)
    n = x.shape[dim]
    return float((x.narrow(dim, 1, n - 1) * x.narrow(dim, 0, n - 1)).mean() / (x * x).mean())


def test_fixture_is_comfy_wan_with_the_shipped_weights(patcher: Any, tv: Any) -> None:
    import comfy.ldm.wan.model
    import comfy.model_base
    from safetensors.torch import load_file

    assert type(patcher.model) is comfy.model_base.WAN21
    assert type(patcher.model.diffusion_model) is comfy.ldm.wan.model.WanModel
    stored = {k: v for k, v in load_file(str(tv.weights_path())).items() if not k.startswith("conditioning.")}
    state = patcher.model.diffusion_model.state_dict()
    assert set(stored) == set(state) and all(v.dtype == torch.float16 for v in stored.values())
    assert all(torch.equal(state[k], v.float()) for k, v in stored.items())
    assert tv.metadata()["unet_config"] == json.loads(json.dumps(tv.WAN_CONFIG))


def test_codec_round_trip_and_token_count(tv: Any) -> None:
    clips = torch.rand((2, 3, tv.FRAMES, tv.PIXELS, tv.PIXELS), generator=torch.Generator().manual_seed(3))
    latent = tv.encode(clips)
    assert tuple(latent.shape) == tv.latent_shape(2)
    assert torch.allclose(tv.decode(latent), clips, atol=1e-6)
    _, _, frames, h, w = latent.shape
    assert frames >= 9 and (h // 2) * (w // 2) >= 256  # patch (1, 2, 2): at least 9 x 16 x 16 tokens


def test_clips_move_as_described(tv: Any, photos: list[torch.Tensor]) -> None:
    gen = torch.Generator().manual_seed(5)
    still = tv.make_clip(photos, "pan", gen, speed=0.0)
    assert torch.equal(still[:, 0], still[:, -1])
    moving = tv.make_clip(photos, "pan", gen, speed=6.0)
    assert not torch.equal(moving[:, 0], moving[:, 1])
    sprite = tv.make_clip(photos, "sprite", gen)
    changed = (sprite[:, 0] != sprite[:, -1]).any(0).float().mean()
    assert 0 < float(changed) < 0.6  # the crop moved; most of the background did not
    slow = tv.make_clip(photos, "pan", gen, speed=0.5)
    assert _lag1(slow, 1) > 0.5  # consecutive frames are alike: the redundancy video has
    for kind in tv.CLIP_KINDS:
        clip = tv.make_clip(photos, kind, gen)
        assert tuple(clip.shape) == (3, tv.FRAMES, tv.PIXELS, tv.PIXELS)
        assert 0 <= float(clip.min()) and float(clip.max()) <= 1
    with pytest.raises(ValueError, match="kind"):
        tv.make_clip(photos, "spin", gen)


def test_crop_windows_keep_each_clip_whole_in_time(tv: Any, photos: list[torch.Tensor]) -> None:
    full = tv.random_clips(photos, 3, torch.Generator().manual_seed(8))
    cropped = tv.random_clips(photos, 3, torch.Generator().manual_seed(8), crop=32)
    assert tuple(cropped.shape) == (3, 3, tv.FRAMES, 32, 32)
    for clip, window in zip(full, cropped):  # one window, the same in every frame, of the same clip
        hits = [(y, x) for y in range(tv.PIXELS - 31) for x in range(tv.PIXELS - 31)
                if torch.equal(clip[..., y:y + 32, x:x + 32], window)]
        assert hits, "the crop is not a window of the full clip"
    for bad in (0, 30, tv.PIXELS + 4):
        with pytest.raises(ValueError, match="crop"):
            tv.random_clips(photos, 1, torch.Generator().manual_seed(8), crop=bad)


def test_local_attention_start_peaks_at_zero_offset(tv: Any) -> None:
    """With the local start, a block's self-attention on content-free tokens attends most to the
    same place and frame, and less to tokens further away in time or space."""
    from comfy.ldm.flux.math import apply_rope1

    from bench.quality import train_video_fixture as tvf
    from harness import tiny_models

    model = tv.build_model()
    tiny_models.init_weights(model.diffusion_model, 2)
    tvf.local_attention_init(model, 3.0)
    net, f, h, w = model.diffusion_model, 5, 6, 6
    attn, d = net.blocks[0].self_attn, net.dim // net.num_heads
    freqs = net.rope_encode(f, h * 2, w * 2, dtype=torch.float32)
    x = torch.zeros((1, f * h * w, net.dim))
    q = apply_rope1(attn.norm_q(attn.q(x)).view(1, -1, net.num_heads, d), freqs)
    k = apply_rope1(attn.norm_k(attn.k(x)).view(1, -1, net.num_heads, d), freqs)
    centre = (f // 2 * h + h // 2) * w + w // 2
    logits = torch.einsum("hd,nhd->hn", q[0, centre], k[0]).view(net.num_heads, f, h, w)
    at = logits[:, f // 2, h // 2, w // 2]
    assert torch.equal(logits.flatten(1).argmax(1), torch.full((net.num_heads,), centre))
    assert (logits[:, f // 2 + 1, h // 2, w // 2] < at).all() and (logits[:, f // 2, h // 2 + 2, w // 2] < at).all()
    off, reference = tv.build_model(), tv.build_model()
    for m in (off, reference):
        tiny_models.init_weights(m.diffusion_model, 2)
    tvf.local_attention_init(off, 0.0)
    assert torch.equal(off.diffusion_model.blocks[0].self_attn.q.bias, reference.diffusion_model.blocks[0].self_attn.q.bias)
    assert not torch.equal(net.blocks[0].self_attn.q.bias, reference.diffusion_model.blocks[0].self_attn.q.bias)


def test_training_objective_backpropagates_through_comfy_blocks(tv: Any, photos: list[torch.Tensor]) -> None:
    from bench.quality import train_video_fixture as tvf
    from harness import tiny_models, trained

    model = trained.trainable(tv.build_model())
    tiny_models.init_weights(model.diffusion_model, 1)
    gen = torch.Generator().manual_seed(1)
    x0 = tv.to_model_space(tv.random_clips(photos, 1, gen))
    loss = tvf.flow_loss(model, x0, tvf.model_kwargs(model, tv.default_conditioning_tensors(), 1), gen, "uniform")
    loss.backward()
    grads = [p.grad for p in model.diffusion_model.blocks[0].parameters()]
    assert torch.isfinite(loss) and all(g is not None for g in grads) and any(float(g.abs().max()) > 0 for g in grads)


def test_sample_decodes_to_frames_not_noise(patcher: Any, tv: Any) -> None:
    import comfy.sample

    positive, negative = tv.conditioning()
    s = tv.SAMPLER
    latent = torch.zeros(tv.latent_shape())
    noise = comfy.sample.prepare_noise(latent, 0)
    out = comfy.sample.sample(patcher, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
                              positive, negative, latent, seed=0, disable_pbar=True)
    clip = tv.decode(out)[0]
    start = tv.from_model_space(noise).clamp(0, 1)[0]
    assert _lag1(clip, 3) > MIN_SPATIAL and _lag1(clip, 1) > MIN_TEMPORAL
    assert _lag1(start, 3) < 0.3 and abs(_lag1(start, 1)) < 0.1
    assert float(clip.std()) > 0.05


# ---- the video defaults' quality ----------------------------------------------------------------


@pytest.fixture(scope="module")
def record(tv: Any) -> dict[str, Any]:
    from bench.quality import video_baseline

    path = video_baseline.baseline_path()
    assert path.is_file(), f"{path} missing: run python -m bench.quality.video_baseline --write"
    return json.loads(path.read_text())


def test_record_is_for_the_current_video_defaults(record: dict[str, Any]) -> None:
    from bench.quality import video_baseline

    current = {k: list(v) for k, v in video_baseline.settings().items()}
    assert json.loads(json.dumps(current)) == record["settings"], "video defaults changed: measure and re-record"


def test_video_defaults_quality_does_not_drop(record: dict[str, Any]) -> None:
    from bench.quality import video_baseline

    seeds = tuple(next(iter(record["results"].values()))["seeds"])
    now = video_baseline.measure(seeds)["results"]
    for name, was in record["results"].items():
        got = now[name]
        assert got["mean"] >= was["mean"] - MARGIN_DB, f"{name}: PSNR {got['psnr']} < recorded {was['mean']:.2f} - {MARGIN_DB}"
        assert got["flicker_mean"] <= was["flicker_mean"] + FLICKER_MARGIN, f"{name}: flicker {got['flicker']}"
        assert got["mean"] < float("inf"), f"{name} left the clip bit-identical: it did not merge"
