"""The shipped fixtures through ComfyUI's own loader node, and their weights as recorded.

Each fixture's tensors hash to the ``tensors_sha256`` its json records and its header carries the
metadata ``bench/quality/fixture_metadata.py`` writes (rewriting a header leaves the weights
bit-identical). The Wan fixture loads through ``nodes.UNETLoader`` (folder_paths pointed at a
temporary folder holding a link to it) into the same model ``trained_video.load_model`` builds, and
one step through the ToMA Patch (Advanced) node on it merges exactly as on that model. Flux, SDXL and
SD1.5 fixtures cannot be detected by ComfyUI (fixtures/README.md, "ComfyUI's loaders", says why):
the loader refuses each, so the README's list stays true.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("flux", "sdxl", "sd15", "wan")
UNDETECTABLE = ("flux", "sdxl", "sd15")


@pytest.fixture(scope="module")
def fixture_metadata(comfy: Path) -> Any:
    from bench.quality import fixture_metadata

    return fixture_metadata


@pytest.fixture(scope="module")
def tv(comfy: Path) -> Any:
    from harness import trained_video

    return trained_video


@pytest.fixture(scope="module")
def models_folder(comfy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A diffusion_models folder holding a link to each fixture, as a user would install them."""
    import folder_paths

    folder = tmp_path_factory.mktemp("diffusion_models")
    for family in FAMILIES:
        (folder / f"{family}.safetensors").symlink_to(ROOT / "fixtures" / f"{family}.safetensors")
    saved = folder_paths.folder_names_and_paths["diffusion_models"]
    folder_paths.folder_names_and_paths["diffusion_models"] = ([str(folder)], saved[1])
    try:
        yield folder
    finally:
        folder_paths.folder_names_and_paths["diffusion_models"] = saved


def load_unet(family: str) -> Any:
    """The fixture as ComfyUI's UNETLoader node returns it."""
    import nodes as comfy_nodes

    return comfy_nodes.UNETLoader().load_unet(f"{family}.safetensors", "default")[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_and_header_are_as_recorded(fixture_metadata: Any, family: str) -> None:
    assert fixture_metadata.problems(family) == []


def test_header_rewrite_keeps_tensors(fixture_metadata: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from harness import trained

    copy = tmp_path / "wan.safetensors"
    copy.write_bytes((ROOT / "fixtures" / "wan.safetensors").read_bytes())
    digest = fixture_metadata.rewrite(copy, {"config": "{}"})
    assert fixture_metadata.read_metadata(copy) == {"config": "{}"}
    before, after = load_file(str(ROOT / "fixtures" / "wan.safetensors")), load_file(str(copy))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert digest == trained.tensors_digest(ROOT / "fixtures" / "wan.safetensors")


def _skip_unless_wan_metadata_is_read(tv: Any) -> None:
    """Skip where this ComfyUI's Wan detection ignores the metadata the fixture carries (asked with
    ``loader_metadata``, not the file's header, so a file without it fails the test instead)."""
    import comfy.model_detection
    import comfy.utils

    from harness import comfy_env

    state = comfy.utils.load_torch_file(str(tv.weights_path()))
    config = comfy.model_detection.detect_unet_config(state, "", metadata=tv.loader_metadata())
    if config.get("num_heads") != tv.LOADER_CONFIG["num_heads"]:
        pytest.skip(f"ComfyUI {comfy_env.comfy_version(comfy_env.import_comfy())}'s "
                    "comfy.model_detection.detect_unet_config reads no config metadata for Wan "
                    "(num_heads = dim // 128 = 0): the Wan fixture cannot load there")


def _one_step(patcher: Any, tv: Any) -> torch.Tensor:
    import comfy.sample

    positive, negative = tv.conditioning()
    latent = torch.zeros(tv.latent_shape())
    noise = comfy.sample.prepare_noise(latent, 0)
    s = tv.SAMPLER
    return comfy.sample.sample(patcher, noise, 1, s["cfg"], s["sampler_name"], s["scheduler"],
                               positive, negative, latent, seed=0, disable_pbar=True)


def _toma_node(model: Any, toma: Any) -> Any:
    """The ToMA Patch (Advanced) node at its defaults, merging from the first step and at any size."""
    schema = toma.nodes.ToMAPatchAdvanced.define_schema()
    inputs = {i.id: i.default for i in schema.inputs if i.id != "model"}
    inputs |= {"start_percent": 0.0, "min_tokens": 0}
    return toma.nodes.ToMAPatchAdvanced.execute(model, **inputs)[0]


def test_wan_loads_through_unet_loader_and_merges(models_folder: Path, tv: Any, toma: Any) -> None:
    _skip_unless_wan_metadata_is_read(tv)
    loaded = load_unet("wan")
    reference = tv.load_model()
    net = loaded.model.diffusion_model
    assert type(loaded.model).__name__ == "WAN21" and net.num_heads == tv.WAN_CONFIG["num_heads"]
    want = reference.model.diffusion_model.state_dict()
    got = net.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k].float(), want[k]) for k in want)

    merged = _one_step(_toma_node(loaded, toma), tv)
    assert torch.equal(merged, _one_step(_toma_node(reference, toma), tv))
    assert not torch.equal(merged, _one_step(loaded, tv))  # ToMA merged on the loaded model


@pytest.mark.parametrize("family", UNDETECTABLE)
def test_undetectable_fixtures_are_refused_as_the_readme_says(models_folder: Path, family: str) -> None:
    readme = (ROOT / "fixtures" / "README.md").read_text()
    section = readme.split("## ComfyUI's loaders", 1)[1].split("\n## ", 1)[0]
    assert f"`{family}.safetensors`" in section
    with pytest.raises(RuntimeError):
        load_unet(family)
