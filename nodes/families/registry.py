"""The family registry: which ComfyUI diffusion-model classes ToMA patches, with which adapter,
what the README and the nodes say about them; the models it refuses and why are in refusals.py.

Each Family holds its adapter's `apply(model_clone, settings) -> FamilyAdapter` (contract.py)
itself, so a reader (and any tool) follows a model from here to its module in families/. The
model classes are named as "module:Class" strings and resolved only when a model is detected, so
the registry (and the README table test) needs no ComfyUI, and a class missing from the
installed ComfyUI (a family added after it) is skipped. The README's "Supported models" table is
`readme_table()`, checked by tests/test_families.py; the nodes' description and tooltips name the
families through `node_models()`, `blocks_examples()` and `video_models()`. Adding a family:
docs/adding_a_family.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..contract import FamilyAdapter
from ..run.prediction import CostModel, DitCost
from ..settings import AUTO_SCOPE, KEYS_VALUES, ToMASettings
from . import (
    flux,
    hidream,
    hunyuan_video,
    kandinsky5,
    lumina2,
    qwen_image,
    sd3,
    unet,
    wan,
)
from .refusals import REFUSED
from .unet_blocks import GROUPS as UNET_GROUPS
from .unet_cost import UNetCost

Apply = Callable[..., FamilyAdapter]
"""apply(model_clone, settings): install a family's hooks on a ModelPatcher clone; return its adapter."""


@dataclass(frozen=True)
class Family:
    """One supported family: everything the pack knows of it. name: for logs; classes: ComfyUI
    diffusion-model classes ("module:Class"); apply: its adapter's apply (families/<name>.py);
    streams: ((group, ModuleList attribute), ...) of the blocks its `blocks` setting names (a DiT's;
    the UNet names its blocks by level, families/unet_blocks.py); cost: how the cost model prices it
    (run/prediction.py); title, models, how, limits: its README row; node_models: how the nodes'
    description and model tooltip name it; blocks_example: a `blocks` list for the Advanced node's
    tooltip, valid on every model of the family; video: it reads `tile_frames`. scope: what scope
    "auto" runs on it (chosen from the scope study on the trained fixtures, docs/video.md)."""

    name: str
    classes: tuple[str, ...]
    apply: Apply
    streams: tuple[tuple[str, str], ...]
    cost: CostModel
    title: str
    models: str
    how: str
    limits: str
    node_models: str
    blocks_example: str
    video: bool = False
    scope: str = "block"

    def resolve(self, settings: ToMASettings) -> ToMASettings:
        """`settings` with scope "auto" made this family's choice."""
        return replace(settings, scope=self.scope) if settings.scope == AUTO_SCOPE else settings

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups its `blocks` list names: its streams' (a DiT), else the UNet's levels
        (unet_blocks.GROUPS), by which the UNet names its blocks."""
        return tuple(group for group, _ in self.streams) or UNET_GROUPS


FAMILIES: tuple[Family, ...] = (
    Family(
        "flux", ("comfy.ldm.flux.model:Flux", "comfy.ldm.chroma.model:Chroma"), flux.apply,
        (("double", "double_blocks"), ("single", "single_blocks")), DitCost("hidden_size", ("double_blocks", "single_blocks")), "Flux",
        "Flux.1 dev, schnell, Fill, Kontext; Flux.2 dev, Klein 4B / 9B (incl. multi-reference editing) and LongCat-Image (ComfyUI 0.33); Chroma (incl. Radiance)",
        "Replaces the dit double/single blocks. Text tokens and Kontext reference-image tokens pass through unmerged; reference tokens of ComfyUI 0.33's `index_timestep_zero` method keep their own modulation.",
        "`scope = attention`: double blocks merge q/k/v after ComfyUI's rope (see below). With ComfyUI 0.33's Flux KV Cache node the cached reference keys pass through unmerged (`scope = block`, `keys_values`).",
        "Flux (incl. Kontext, Fill), Flux.2, LongCat-Image, Chroma", "double:1-4,single:5-19",
    ),
    Family(
        "unet", ("comfy.ldm.modules.diffusionmodules.openaimodel:UNetModel",), unet.apply, (), UNetCost(), "UNet",
        "SDXL, SD1.x, SD2.x",
        "Patches each selected `BasicTransformerBlock` (whole block), only its attention (`scope = attention`), or only attn1's keys and values (`scope = keys_values`).",
        "Video UNets (SVD) refused; `proportional_attention` not available.",
        "SDXL, SD1.5, SD2", "input:4-8,middle,output:0-5",
    ),
    Family(
        "sd3", ("comfy.ldm.modules.diffusionmodules.mmdit:MMDiT",), sd3.apply,
        (("double", "joint_blocks"),), DitCost("hidden_size", ("joint_blocks",)), "SD3",
        "SD3 Medium, SD3.5 Large / Large Turbo / Medium (MMDiT)",
        "Replaces the dit joint blocks (`double:` in `blocks`); the text stream passes through. No rope: positions ride in the tokens.",
        "No `scope = attention`, no `proportional_attention`. `scope = keys_values` merges the keys of SD3.5 Medium's second self-attention too.",
        "SD3/SD3.5", "double:5-23",
    ),
    Family(
        "qwen_image", ("comfy.ldm.qwen_image.model:QwenImageTransformer2DModel",), qwen_image.apply,
        (("double", "transformer_blocks"),), DitCost("inner_dim", ("transformer_blocks",)), "Qwen-Image",
        "Qwen-Image (incl. 2512), Qwen-Image-Edit (2509, 2511 with `index_timestep_zero` references), Qwen-Image-Layered (multi-frame latents): one class",
        "Replaces the dit blocks (`double:` in `blocks`); merged tokens take their destinations' rope rows. Edit reference-image tokens pass through unmerged with their own modulation; each layer of a layered latent merges on its own.",
        "No `scope = attention`, no `proportional_attention`. Edit: the reference tokens are not merged, so the gain is smaller (about half the tokens stay).",
        "Qwen-Image(-Edit)", "double:5-23",
    ),
    Family(
        "lumina2", ("comfy.ldm.lumina.model:NextDiT",), lumina2.apply,
        (("layers", "layers"),), DitCost("dim", ("layers", "noise_refiner")), "Lumina2",
        "Lumina-Image 2.0, Z-Image, Z-Image Turbo (NextDiT; Z-Image on ComfyUI 0.33)",
        "Object-patches each selected main layer (`layers:` in `blocks`); caption tokens and Z-Image's pad tokens pass through, merged tokens take their destinations' rope rows and mask columns.",
        "No `scope = attention`, no `proportional_attention`. The refiner layers stay exact. Z-Image: tested on tiny models of 0.33's class, quality not measured on real weights.",
        "Lumina2, Z-Image", "layers:5-25",
    ),
    Family(
        "hunyuan_video", ("comfy.ldm.hunyuan_video.model:HunyuanVideo",), hunyuan_video.apply,
        (("double", "double_blocks"), ("single", "single_blocks")), DitCost("hidden_size", ("double_blocks", "single_blocks")), "HunyuanVideo",
        "HunyuanVideo (T2V, custom I2V, image-to-video v2), HunyuanVideo 1.5 (ComfyUI 0.33), HunyuanImage 2.1",
        "Replaces the dit double/single blocks with spatio-temporal tiles (frame 0 alone; later frames in tiles of `tile_frames` (default 4) frames x `tile_size` x `tile_size`). Text tokens (before or after the video, as each ComfyUI lays them out), the text mask and reference-latent tokens pass through unmerged.",
        "No `scope = attention`, no `proportional_attention`. Image-to-video \"v2 (replace)\": frame 0 merges on its own and its modulation spans follow (ComfyUI runs it at batch 1 only).",
        "HunyuanVideo", "double:5-19", video=True, scope=KEYS_VALUES,
    ),
    Family(
        "wan", ("comfy.ldm.wan.model:WanModel",), wan.apply,
        (("blocks", "blocks"),), DitCost("dim", ("blocks",), joint=False), "Wan",
        "Wan 2.1 T2V / I2V / FLF2V (1.3B, 14B), Wan 2.2 A14B T2V / I2V (each expert is its own MODEL: patch both), Wan 2.2-5B TI2V; Fun reference, Phantom, VACE, Bernini (ComfyUI 0.33); S2V runs unmerged",
        "Replaces the dit blocks (`blocks:` in `blocks`) with spatio-temporal tiles (`tile_size` x `tile_size` tokens x `tile_frames` frames); text is cross-attention and never merged; frame 0 and frames of different timesteps never merge with other frames; Fun reference and Phantom frames and Bernini's in-context tokens pass through.",
        "No `scope = attention`, no `proportional_attention`. VACE blocks run unmerged; S2V runs unmerged (logged); Camera, HuMo and Animate refused. Quality not measured on real Wan weights.",
        "Wan", "blocks:5-29", video=True, scope=KEYS_VALUES,
    ),
    Family(
        "kandinsky5", ("comfy.ldm.kandinsky5.model:Kandinsky5",), kandinsky5.apply,
        (("blocks", "visual_transformer_blocks"),), DitCost("model_dim", ("visual_transformer_blocks",), joint=False), "Kandinsky 5",
        "Kandinsky 5.0 Video Lite / Pro (T2V, I2V), Image Lite (ComfyUI 0.33)",
        "Object-patches each selected visual block (`blocks:` in `blocks`); spatio-temporal tiles as for Wan (frame 0 alone); text is cross-attention and never merged, the text blocks run as they are; merged tokens take their destinations' rope rows.",
        "No `scope = attention`, no `proportional_attention`. Tested on tiny models of ComfyUI's class; quality not measured on real weights.",
        "Kandinsky 5", "blocks:5-29", video=True, scope=KEYS_VALUES,
    ),
    Family(
        "hidream", ("comfy.ldm.hidream.model:HiDreamImageTransformer2DModel",), hidream.apply,
        (("double", "double_stream_blocks"), ("single", "single_stream_blocks")),
        DitCost("inner_dim", ("double_stream_blocks", "single_stream_blocks")), "HiDream",
        "HiDream-I1 (Full, Dev, Fast)",
        "Object-patches each selected double/single stream block; text tokens pass through, merged tokens take their destinations' rope rows.",
        "No `scope = attention`, no `proportional_attention`. Attention is ~9% of its block compute (MoE feed-forward): the gain is in the linear layers (little for `scope = keys_values`); merged tokens are routed on merged features. E1 edit calls run unmerged.",
        "HiDream", "double:5-15,single:5-31",
    ),
)



def resolve(path: str) -> type | None:
    """The class named "module:Class", or None when this ComfyUI does not have it."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _matches(diffusion_model, classes: tuple[str, ...]) -> bool:
    return any(cls is not None and isinstance(diffusion_model, cls) for cls in map(resolve, classes))


def supported_text() -> str:
    """'Flux (...), UNet (...), ...' for error messages."""
    return ", ".join(f"{f.title} ({f.models})" for f in FAMILIES)


def family_of(diffusion_model) -> Family:
    """The Family of a diffusion-model module; ValueError naming its class (and the reason, for a
    refused family) when ToMA has no adapter for it."""
    cls = type(diffusion_model)
    name = f"{cls.__module__}.{cls.__qualname__}"
    for refusal in REFUSED:
        if _matches(diffusion_model, refusal.classes):
            raise ValueError(f"ToMA does not support {refusal.title} ({name}): {refusal.reason}")
    for family in FAMILIES:
        if _matches(diffusion_model, family.classes):
            return family
    raise ValueError(f"ToMA does not support the diffusion model class {name}; supported families: {supported_text()}")


def detect_family(model) -> Family:
    """Family of `model` (a ModelPatcher), from its diffusion model's class."""
    return family_of(model.get_model_object("diffusion_model"))


def apply_family(family: Family, model, settings: ToMASettings) -> FamilyAdapter:
    """Install the family's hooks on `model` (a ModelPatcher clone); return its runtime adapter."""
    return family.apply(model, settings)


def node_models() -> str:
    """'Flux (incl. Kontext, Fill), Chroma, SDXL, ...': the families as the nodes name them."""
    return ", ".join(f.node_models for f in FAMILIES)


def blocks_examples() -> str:
    """"'double:1-4,single:5-19' (Flux), ...": one `blocks` example per block layout, with the
    families that share it; each is valid for every model of those families (tests/integration/test_blocks_examples.py)."""
    layouts: dict[str, list[str]] = {}
    for f in FAMILIES:
        layouts.setdefault(f.blocks_example, []).append(f.title)
    return ", ".join(f"'{example}' ({', '.join(titles)})" for example, titles in layouts.items())


def block_groups() -> tuple[str, ...]:
    """Every group a `blocks` list may name on some family, each once: what a list can be checked
    against before the model, and so its family, is known (node/input_checks.py)."""
    return tuple(dict.fromkeys(group for f in FAMILIES for group in f.groups))


def video_models() -> str:
    """'HunyuanVideo, Wan': the families whose tiles span frames (`tile_frames`)."""
    return ", ".join(f.title for f in FAMILIES if f.video)


def readme_table() -> str:
    """The README's "Supported models" table (markdown), one row per family, then one row naming
    every refused family; their reasons are in docs/compatibility.md and in the node's error."""
    rows = ["| Family | Models | How | Limits |", "|---|---|---|---|"]
    rows += [f"| {f.title} | {f.models} | {f.how} | {f.limits} |" for f in FAMILIES]
    refused = "; ".join(r.title for r in REFUSED)
    rows.append(
        f"| Refused | {refused} | - | The node's error names the reason; every ComfyUI 0.33 class with its status: "
        f"[compatibility](docs/compatibility.md#diffusion-classes-of-comfyui-033). |"
    )
    return "\n".join(rows)
