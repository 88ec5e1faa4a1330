"""Every diffusion-model class that the installed ComfyUI's `comfy.supported_models.models` can build
has a status in nodes/families/registry.py: a Family adapts it or a Refusal says why not, so the node never
falls back to its generic unknown-class error. The class a config builds is read from ComfyUI's own
source (the config's `get_model` names a `comfy.model_base` class, whose `__init__` passes
`unet_model=`), so no model is built."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest

from harness.pack import pack_module

BASE_MODEL = re.compile(r"model_base\.(\w+)\s*\(")
UNET_MODEL = re.compile(r"unet_model\s*=\s*([A-Za-z_][\w.]*)")

HANDLED_SUBCLASSES = {
    "comfy.ldm.modules.diffusionmodules.mmdit.OpenAISignatureMMDITWrapper":
        "sd3: MMDiT with ComfyUI's UNet call signature; the joint blocks are MMDiT's",
    "comfy.ldm.lumina.model.NextDiTPixelSpace":
        "lumina2: its _forward calls each of self.layers as NextDiT._forward does; only the decoder after them differs (test_family_lumina2.py test_zimage_pixel_space_merges_only_the_image)",
    "comfy.ldm.chroma_radiance.model.ChromaRadiance":
        "flux: Chroma's double/single blocks; the pixel decoder runs after them",
    "comfy.ldm.wan.model.VaceWanModel": "wan: its own variant (VACE blocks run unmerged)",
    "comfy.ldm.wan.model.WanModel_S2V": "wan: its own variant (runs unmerged)",
}
"""Subclasses of an adapted class that the adapter takes, and why their token layout fits it; every
other subclass must be refused by name rather than merged by the parent's adapter."""


def _get_model_targets(config: type) -> list[str]:
    for klass in config.__mro__:
        if "get_model" in vars(klass):
            return sorted(set(BASE_MODEL.findall(inspect.getsource(vars(klass)["get_model"]))))
    return []


def _unet_model(base: type) -> type:
    """The diffusion-model class `base.__init__` hands `BaseModel` (UNetModel when none is named)."""
    for klass in base.__mro__:
        if "__init__" not in vars(klass):
            continue
        for name in UNET_MODEL.findall(inspect.getsource(vars(klass)["__init__"])):
            if name != "unet_model":
                return eval(name, vars(sys.modules[klass.__module__]))  # a dotted name from ComfyUI's source
    raise AssertionError(f"{base.__qualname__} names no unet_model")


def diffusion_classes() -> dict[str, set[type]]:
    """{config class name: diffusion-model classes its get_model builds} for this ComfyUI."""
    import comfy.model_base
    import comfy.supported_models

    return {
        config.__name__: {_unet_model(getattr(comfy.model_base, base)) for base in _get_model_targets(config)}
        for config in comfy.supported_models.models
    }


def _matched(registry, cls: type, classes: tuple[str, ...]) -> list[type]:
    return [known for known in map(registry.resolve, classes) if known is not None and issubclass(cls, known)]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_every_supported_model_class_has_a_status(comfy: Path) -> None:
    registry, refusals = pack_module("nodes.families.registry"), pack_module("nodes.families.refusals")
    classes = diffusion_classes()
    assert classes and all(classes.values()), [name for name, found in classes.items() if not found]
    missing, silent = [], []
    for config, found in classes.items():
        for cls in found:
            if any(_matched(registry, cls, r.classes) for r in refusals.REFUSED):
                continue
            parents = [known for f in registry.FAMILIES for known in _matched(registry, cls, f.classes)]
            if not parents:
                missing.append(f"{config}: {_qualified(cls)}")
            elif cls not in parents and _qualified(cls) not in HANDLED_SUBCLASSES:
                silent.append(f"{config}: {_qualified(cls)} (a subclass of {_qualified(parents[0])})")
    assert not missing, f"no Family or Refusal for: {missing}"
    assert not silent, f"subclasses an adapter would take without a check of their layout: {silent}"


def _refused_classes() -> list[tuple[str, str]]:
    refusals = pack_module("nodes.families.refusals")
    return [(r.title, path) for r in refusals.REFUSED for path in r.classes]


@pytest.mark.parametrize("title, path", _refused_classes())
def test_refused_class_error_names_its_reason(comfy: Path, title: str, path: str) -> None:
    registry, refusals = pack_module("nodes.families.registry"), pack_module("nodes.families.refusals")
    cls = registry.resolve(path)
    if cls is None:
        pytest.skip(f"this ComfyUI has no {path.replace(':', '.')}")
    refusal = next(r for r in refusals.REFUSED if r.title == title)
    module = cls.__new__(cls)  # the real class, uninitialised: family_of reads only its type
    with pytest.raises(ValueError) as error:
        registry.family_of(module)
    message = str(error.value)
    assert f"ToMA does not support {title} (" in message and refusal.reason in message
