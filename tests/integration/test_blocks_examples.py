"""Every `blocks` example the pack shows (the Advanced node's tooltip, registry.blocks_examples(),
and so the README) is valid for every model of its family: each family's real models are built on
the meta device with their real block counts and the example is parsed against their streams, as
the family's adapter parses it. Full-size configs come from bench/speed/realsize_setup.py where it
has one (Flux.1, SD3.5 Large, Qwen-Image, Wan 14B / 1.3B, HunyuanVideo, SDXL, SD1.5); the other
models are the tiny configs of harness at the real models' block counts (the counts are all
the parse reads)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.pack import PACK_ROOT, pack_module

registry = pack_module("nodes.families.registry")


def _full(name: str) -> Callable[[], Any]:
    def build() -> Any:
        from bench.speed import realsize_setup

        return realsize_setup.meta_patcher(name).get_model_object("diffusion_model")
    return build


def _tiny(config_class: str, config: Callable[[], dict[str, Any]]) -> Callable[[], Any]:
    def build() -> Any:
        import comfy.supported_models

        from harness import tiny_models

        cls = getattr(comfy.supported_models, config_class, None)
        if cls is None:
            pytest.skip(f"this ComfyUI has no comfy.supported_models.{config_class}")
        return tiny_models.model_config(cls, config()).get_model({}, device=torch.device("meta")).diffusion_model
    return build


def _flux(depth: int, single: int) -> Callable[[], dict[str, Any]]:
    from harness import tiny_models

    return lambda: tiny_models.tiny_flux_config() | {"depth": depth, "depth_single_blocks": single}


def _dits(name: str, **counts: Any) -> Callable[[], dict[str, Any]]:
    from harness import tiny_dits, tiny_wan

    configs = {"sd3": tiny_dits.sd3_config, "lumina": tiny_dits.lumina_config, "zimage": tiny_dits.zimage_config,
               "hunyuan15": tiny_dits.hunyuan15_config, "hidream": tiny_dits.hidream_config, "wan": tiny_wan.wan_config,
               "kandinsky5": tiny_dits.kandinsky5_config}
    return lambda: configs[name](**counts)


MODELS: list[tuple[str, str, Callable[[], Any]]] = [
    ("flux", "Flux.1 / Chroma (19 + 38)", _full("flux")),
    ("flux", "Flux.2 dev (8 + 48)", _tiny("Flux", _flux(8, 48))),
    ("flux", "Flux.2 klein 4B (5 + 20)", _tiny("Flux", _flux(5, 20))),
    ("flux", "Flux.2 klein 9B (8 + 24)", _tiny("Flux", _flux(8, 24))),
    ("sd3", "SD3.5 Large (38)", _full("sd35_large")),
    ("sd3", "SD3 Medium / SD3.5 Medium (24)", _tiny("SD3", _dits("sd3", num_blocks=24))),
    ("qwen_image", "Qwen-Image (60)", _full("qwen_image")),
    ("lumina2", "Lumina-Image 2.0 (26)", _tiny("Lumina2", _dits("lumina", n_layers=26))),
    ("lumina2", "Z-Image (30)", _tiny("ZImage", _dits("zimage", n_layers=30))),
    ("hunyuan_video", "HunyuanVideo / HunyuanImage 2.1 (20 + 40)", _full("hunyuan_video")),
    ("hunyuan_video", "HunyuanVideo 1.5 (54 + 0)", _tiny("HunyuanVideo15", _dits("hunyuan15", depth=54, depth_single_blocks=0))),
    ("wan", "Wan 2.1 / 2.2 14B (40)", _full("wan14b")),
    ("wan", "Wan 2.1 1.3B (30)", _full("wan1.3b")),
    ("wan", "Wan 2.2 5B (30)", _tiny("WAN22_T2V", _dits("wan", num_layers=30, in_dim=48, out_dim=48))),
    ("kandinsky5", "Kandinsky 5 Video Lite (32)", _tiny("Kandinsky5", _dits("kandinsky5", num_visual_blocks=32))),
    ("kandinsky5", "Kandinsky 5 Image Lite (50)", _tiny("Kandinsky5Image", _dits("kandinsky5", image=True, num_visual_blocks=50))),
    ("kandinsky5", "Kandinsky 5 Video Pro (60)", _tiny("Kandinsky5", _dits("kandinsky5", num_visual_blocks=60))),
    ("hidream", "HiDream-I1 (16 + 32)", _tiny("HiDream", _dits("hidream", num_layers=16, num_single_layers=32, llama_layers=[31] * 48))),
    ("unet", "SDXL", _full("sdxl")),
    ("unet", "SD1.5", _full("sd15")),
]

BLOCK_LIST = re.compile(r"[`']((?:double|single|layers|blocks|input|middle|output)(?::[\d,-]+)?"
                        r"(?:,(?:double|single|layers|blocks|input|middle|output)(?::[\d,-]+)?)*)[`']")


def test_every_family_has_its_real_models_here() -> None:
    assert {f.name for f in registry.FAMILIES} == {family for family, _, _ in MODELS}


@pytest.mark.parametrize("family, model, build", MODELS, ids=[m for _, m, _ in MODELS])
def test_blocks_example_is_valid_on_every_real_model(comfy, family: str, model: str, build: Callable[[], Any]) -> None:
    example = next(f.blocks_example for f in registry.FAMILIES if f.name == family)
    dm = build()
    if family == "unet":
        spec = pack_module("nodes.families.unet_blocks").parse_unet_blocks(example)
        sites = pack_module("nodes.families.unet_sites").find_sites(dm)
        assert any(spec.selects(s.block, s.downsample) for s in sites), (model, example)
        return
    streams = next(f.streams for f in registry.FAMILIES if f.name == family)
    sizes = {group: len(getattr(dm, attr)) for group, attr in streams}
    chosen = pack_module("nodes.machinery.dit_blocks").parse_dit_blocks(example, sizes)
    assert chosen.count > 0, (model, example, sizes)


def test_readme_shows_only_the_registry_examples() -> None:
    """A block list quoted in the README is one of the tooltip's (which the test above checks)."""
    examples = {f.blocks_example for f in registry.FAMILIES}
    shown = {m for m in BLOCK_LIST.findall((PACK_ROOT / "README.md").read_text(encoding="utf-8")) if re.search(r"\d", m)}
    assert shown <= examples, f"README quotes block lists that are not registry examples: {shown - examples}"


@pytest.mark.parametrize("family, model, build", [m for m in MODELS if m[0] != "unet"], ids=[m for f, m, _ in MODELS if f != "unet"])
def test_cost_profile_sees_every_block_and_the_width(comfy, family: str, model: str, build: Callable[[], Any]) -> None:
    """min_tokens "auto" prices a DiT from the width and block lists its registry entry names
    (Family.cost): a family whose entry missed a block list would be priced at fewer blocks than the
    `blocks` setting selects, and one without a width would never merge. Its priced blocks must cover
    every block its streams (Family.streams) hold, and the merged ones be those the setting selects."""
    settings = pack_module("nodes.settings")
    entry = next(f for f in registry.FAMILIES if f.name == family)
    dm = build()
    selectable = sum(len(getattr(dm, attr)) for _, attr in entry.streams)
    profile = entry.cost.profile(dm, selectable, settings.ToMASettings(), entry.video)
    assert profile.width > 0, (model, "no width")
    assert sum(b.count for b in profile.blocks) >= selectable, (model, "block lists missing from Family.cost")
    assert sum(b.count for b in profile.blocks if b.merged) == selectable
