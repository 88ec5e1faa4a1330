"""The trained fixtures (fixtures/*.safetensors, harness/trained.py, bench/quality/train_fixtures.py).

Each shipped fixture loads into ComfyUI's own class; the pixel codec is a float-precision round trip;
the training-only out-of-place Flux blocks compute what ComfyUI's blocks compute (and, unlike them,
backpropagate); a 20-step sample through ``comfy.sample.sample`` decodes to an image with the spatial
correlation of a photograph, not of noise, and is reproducible bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture(scope="module")
def trained(comfy: Path) -> Any:
    """harness/trained.py (needs ComfyUI on sys.path for its lazy imports)."""
    from harness import trained

    return trained


@pytest.fixture(scope="module")
def train_fixtures(trained: Any) -> Any:
    """bench/quality/train_fixtures.py (the out-of-place blocks and the training data)."""
    from bench.quality import train_fixtures

    return train_fixtures


@pytest.fixture(scope="module", params=["flux", "sdxl", "sd15"])
def loaded(request: pytest.FixtureRequest, trained: Any) -> tuple[str, Any]:
    """(family, ModelPatcher) of each shipped fixture."""
    family = request.param
    assert trained.weights_path(family).is_file(), f"{trained.weights_path(family)} is not shipped"
    return family, trained.load_model(family)


def _lag1_autocorrelation(images: torch.Tensor) -> float:
    """Mean correlation of horizontally and vertically adjacent pixels of (B, 3, H, W) images."""
    x = images - images.mean(dim=(-2, -1), keepdim=True)
    var = (x * x).mean()
    horizontal = (x[..., :, 1:] * x[..., :, :-1]).mean()
    vertical = (x[..., 1:, :] * x[..., :-1, :]).mean()
    return float((horizontal + vertical) / (2 * var))


def test_fixture_is_comfy_class_with_the_shipped_weights(loaded: tuple[str, Any], trained: Any) -> None:
    import comfy.model_base
    from safetensors.torch import load_file

    family, patcher = loaded
    expected = {"flux": comfy.model_base.Flux, "sdxl": comfy.model_base.SDXL, "sd15": comfy.model_base.BaseModel}[family]
    assert type(patcher.model) is expected
    stored = load_file(str(trained.weights_path(family)))
    state = patcher.model.diffusion_model.state_dict()
    weights = trained.family_config(family).process_unet_state_dict(
        {k: v for k, v in stored.items() if not k.startswith(trained.COND_PREFIX)}
    )
    assert set(weights) == set(state)
    assert all(v.dtype == torch.float16 for v in weights.values())
    assert all(torch.equal(state[k], v.float()) for k, v in weights.items())
    assert trained.metadata(family)["unet_config"] == trained.spec(family).unet_config


@pytest.mark.parametrize("family", ["flux", "sdxl", "sd15"])
def test_codec_round_trip(trained: Any, family: str) -> None:
    gen = torch.Generator().manual_seed(3)
    images = torch.rand((2, 3, *trained.pixel_size(family)), generator=gen)
    latent = trained.encode(family, images)
    assert tuple(latent.shape) == trained.latent_shape(family, 2)
    assert torch.allclose(trained.decode(family, latent), images, atol=1e-6)
    matrix = trained.codec_matrix(family)
    assert torch.allclose(matrix.T @ matrix, torch.eye(matrix.shape[1]), atol=1e-6)


def test_flux_latent_has_at_least_1024_tokens(trained: Any) -> None:
    _, _, h, w = trained.latent_shape("flux")
    patch = trained.spec("flux").unet_config["patch_size"]
    assert (h // patch) * (w // patch) >= 1024


def _flux_block_inputs(dm: Any, tokens: int, text: int, seed: int) -> dict[str, torch.Tensor]:
    """Random img (1, N, C), txt (1, T, C), vec (1, C) and the model's RoPE of random positions."""
    gen = torch.Generator().manual_seed(seed)
    hidden = dm.hidden_size
    ids = torch.randint(0, 8, (1, text + tokens, 3), generator=gen).float()
    return {
        "img": torch.randn((1, tokens, hidden), generator=gen),
        "txt": torch.randn((1, text, hidden), generator=gen),
        "vec": torch.randn((1, hidden), generator=gen),
        "pe": dm.pe_embedder(ids),
    }


def test_out_of_place_blocks_equal_comfy_blocks(trained: Any, train_fixtures: Any) -> None:
    patcher = trained.load_model("flux")
    dm = patcher.model.diffusion_model
    for i, block in enumerate(dm.double_blocks):
        a = _flux_block_inputs(dm, 64, 8, seed=i)
        img, txt = block(img=a["img"].clone(), txt=a["txt"].clone(), vec=a["vec"], pe=a["pe"])
        img2, txt2 = train_fixtures.double_block_out_of_place(block, a["img"], a["txt"], a["vec"], a["pe"])
        assert not torch.equal(img, a["img"])  # the block does something (trained gates are not zero)
        assert torch.allclose(img, img2, atol=1e-4, rtol=1e-4) and torch.allclose(txt, txt2, atol=1e-4, rtol=1e-4)
    for i, block in enumerate(dm.single_blocks):
        a = _flux_block_inputs(dm, 64, 8, seed=100 + i)
        x = torch.cat((a["txt"], a["img"]), 1)
        out = block(x.clone(), vec=a["vec"], pe=a["pe"])
        assert not torch.equal(out, x)
        assert torch.allclose(out, train_fixtures.single_block_out_of_place(block, x, a["vec"], a["pe"]),
                              atol=1e-4, rtol=1e-4)


def test_training_path_matches_inference_and_backpropagates(trained: Any, train_fixtures: Any) -> None:
    """apply_model with the out-of-place block replacements equals the real model and has gradients."""
    patcher = trained.load_model("flux")
    model = trained.trainable(patcher.model)
    kwargs = train_fixtures.model_kwargs(model, "flux", trained.conditioning_tensors("flux"), 1)
    x = torch.randn((1, 16, 16, 16), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.6])
    with torch.no_grad():
        real = model.apply_model(x, sigma, **kwargs)
    options = train_fixtures.training_transformer_options(model)
    with trained.comfy_training():
        out = model.apply_model(x, sigma, transformer_options=options, **kwargs)
    assert torch.allclose(out.detach(), real, atol=1e-4, rtol=1e-4)
    out.square().mean().backward()
    grads = [p.grad for p in model.diffusion_model.single_blocks[0].parameters()]
    assert all(g is not None for g in grads) and any(float(g.abs().max()) > 0 for g in grads)
    model.diffusion_model.zero_grad(set_to_none=True)


MIN_AUTOCORRELATION = {"flux": 0.6, "sdxl": 0.6, "sd15": 0.4}
"""Lag-1 pixel autocorrelation a seed-0 sample must exceed. Training crops: 0.94 / 0.91 / 0.89 (32 px
crops are rougher); the sampler's starting noise and random weights: about 0. The SD1.5 fixture (1,311
steps) gives 0.45: textures with more grain than the other two."""


def test_sample_is_an_image_not_noise(loaded: tuple[str, Any], trained: Any) -> None:
    import comfy.sample

    family, patcher = loaded
    positive, negative = trained.conditioning(family)
    settings = trained.SAMPLER[family]
    latent = torch.zeros(trained.latent_shape(family))
    noise = comfy.sample.prepare_noise(latent, 0)

    def run() -> torch.Tensor:
        return comfy.sample.sample(patcher, noise, settings["steps"], settings["cfg"], settings["sampler_name"],
                                   settings["scheduler"], positive, negative, latent, seed=0, disable_pbar=True)

    first = run()
    image = trained.decode(family, first)
    noise_image = trained.from_model_space(family, noise).clamp(0, 1)  # where sampling starts (sigma_max ~ 1)
    assert _lag1_autocorrelation(image) > MIN_AUTOCORRELATION[family]
    assert _lag1_autocorrelation(noise_image) < 0.3
    assert float(image.std()) > 0.05  # not a flat field
    if family == "sdxl":  # the cheaper model: also check the run repeats bit for bit
        assert torch.equal(run(), first)


def test_training_crops_are_bundled_photographs(train_fixtures: Any, trained: Any) -> None:
    photos = train_fixtures.load_photos()
    assert len(photos) == len(train_fixtures.COLOUR_PHOTOS) + len(train_fixtures.GREY_PHOTOS)
    gen = torch.Generator().manual_seed(0)
    crops = train_fixtures.random_crops(photos, 3, trained.pixel_size("flux"), gen)
    assert tuple(crops.shape) == (3, 3, *trained.pixel_size("flux"))
    assert float(crops.min()) >= 0 and float(crops.max()) <= 1
    assert _lag1_autocorrelation(crops) > 0.6
