"""Which model family a ModelPatcher holds, from its diffusion model's class.

Families:
- "flux": comfy.ldm.flux.model.Flux (Flux.1 dev/schnell, Fill, Kontext: one class) and
  comfy.ldm.chroma.model.Chroma (Chroma, Chroma Radiance). Same dit block replace keys and args.
- "unet": comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel (SDXL, SD1.x, SD2.x).

Anything else (including wrappers that only look like Flux, e.g. Nunchaku's) is refused with a
ValueError naming the class and the supported families: never a silent no-op.
"""

from __future__ import annotations

SUPPORTED = "Flux (dev, schnell, Fill, Kontext), Chroma, SDXL / SD1.x / SD2.x UNet"


def family_classes() -> dict[str, tuple[type, ...]]:
    """Family name -> ComfyUI diffusion-model classes (imported lazily: needs ComfyUI)."""
    import comfy.ldm.chroma.model
    import comfy.ldm.flux.model
    from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

    return {
        "flux": (comfy.ldm.flux.model.Flux, comfy.ldm.chroma.model.Chroma),
        "unet": (UNetModel,),
    }


def detect_family(model) -> str:
    """Family of `model` (a ModelPatcher): "flux" or "unet". ValueError for anything else."""
    diffusion_model = model.get_model_object("diffusion_model")
    return family_of(diffusion_model)


def family_of(diffusion_model) -> str:
    """Family of a diffusion-model module; ValueError naming its class when unsupported."""
    for family, classes in family_classes().items():
        if isinstance(diffusion_model, classes):
            return family
    cls = type(diffusion_model)
    raise ValueError(
        f"ToMA does not support the diffusion model class {cls.__module__}.{cls.__qualname__}; "
        f"supported families: {SUPPORTED}"
    )
