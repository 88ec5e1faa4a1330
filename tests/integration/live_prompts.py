"""The shipped example workflows as CPU-sized API prompts on test-made model files, shared by the
live workflow test and the soak test (test_live_workflows.py, test_live_soak.py).

Each ``example_workflows/*.json`` (``EXAMPLES``; the ToMA Compare templates are ``COMPARISONS``) is
converted from the frontend's format to an API prompt by
``workflow_api.ui_to_api`` (driven by the server's ``/object_info``), then changed only where a
CPU test must:

- model file names: files made at test time in ComfyUI's real formats (``model_files.py``, random
  weights, never downloaded) in the server's models folder: a full-width Flux-dev with 1 double +
  1 single block for ``UNETLoader``, a TAESD-layout VAE for ``VAELoader``, an SD1.5-class
  checkpoint (320 channels, 2 levels) for ``CheckpointLoaderSimple`` (SDXL's layout cannot shrink);
  on ComfyUI 0.33 also a Flux.2 [klein]-style DiT (1 double + 1 single block), a Z-Image DiT at full
  width with one main layer, and a 128-channel TAESD pair in ``vae_approx`` for the Flux.2 VAE
  (``VAELoader``'s "taef2"); for ``LoraLoaderModelOnly``, a rank-4 LoRA on every linear layer of the
  test's Wan (one per expert, as the LightX2V 4-step LoRAs);
- the text-encoder loader where the real one cannot be made small: ``DualCLIPLoader`` (CLIP-L +
  T5-XXL) becomes ``CLIPLoader(type="sd3")`` with a CLIP-L, which pads to Flux's 4096 channels;
- size and length: 256x256 images, 128x128 videos of 5 frames, ``STEPS`` sampler steps (KSampler,
  KSamplerAdvanced, Flux2Scheduler), and ``start_percent`` 0 on the ToMA nodes, because with 2 steps
  the shipped window holds no step.

Templates of models a ComfyUI tree lacks (Flux.2 and Z-Image on 0.3.64: ``NEEDS_CLASS`` of the files
their loaders are swapped for) are left out there, and the tests skip them by name with
``missing_model_reason``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import workflow_api as wa
from live_comfy import PACK_ROOT

from harness.pack import pack_module

TEMPLATES = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
COMPARE_NODE = "ToMACompare"


def is_comparison(path: Path) -> bool:
    """A template built around ToMA Compare (its own live test: test_live_compare.py)."""
    return any(node["type"] == COMPARE_NODE for node in json.loads(path.read_text(encoding="utf-8"))["nodes"])


EXAMPLES = [path for path in TEMPLATES if not is_comparison(path)]
COMPARISONS = [path for path in TEMPLATES if is_comparison(path)]
"""The templates that sample with KSampler (these tests and the soak), and the comparison templates."""
SIZE = 256
VIDEO_SIZE, VIDEO_FRAMES = 128, 5
LATENT_FRAMES = 1 + (VIDEO_FRAMES - 1) // 4
"""Wan's VAE: the first frame, then one latent frame per 4."""
STEPS = 2
LATENT_FACTOR = 8
PATCH = 2
"""Flux's and Wan's 2x2 patches (a token per 16x16 pixels)."""
FILES = {
    "flux": "diffusion_models/toma_test_flux_1x1.safetensors",
    "wan_high": "diffusion_models/toma_test_wan_high.safetensors",
    "wan_low": "diffusion_models/toma_test_wan_low.safetensors",
    "wan_lora_high": "loras/toma_test_wan_lora_high.safetensors",
    "wan_lora_low": "loras/toma_test_wan_lora_low.safetensors",
    "clip_l": "text_encoders/toma_test_clip_l.safetensors",
    "taef1": "vae/toma_test_taef1.safetensors",
    "wan_vae": "vae/toma_test_wan_2.1_vae.safetensors",
    "sd15": "checkpoints/toma_test_sd15_2level.safetensors",
    "flux2": "diffusion_models/toma_test_flux2_1x1.safetensors",
    "zimage": "diffusion_models/toma_test_zimage_1layer.safetensors",
    "taef2": "vae_approx/taef2_decoder.safetensors",
    "taef2_encoder": "vae_approx/taef2_encoder.safetensors",
}
SWAPS = {
    "flux1-dev.safetensors": "flux",
    "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": "wan_high",
    "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": "wan_low",
    "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors": "wan_lora_high",
    "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors": "wan_lora_low",
    "ae.safetensors": "taef1",
    "wan_2.1_vae.safetensors": "wan_vae",
    "sd_xl_base_1.0.safetensors": "sd15",
    "flux-2-klein-4b.safetensors": "flux2",
    "flux2-vae.safetensors": "taef2",
    "z_image_turbo_bf16.safetensors": "zimage",
}
"""Shipped model file name -> this test's file (a name missing here fails the test: a new
workflow needs its file made too)."""
LOADER_NAMES = {"taef2": "taef2"}
"""FILES key -> the name the loader lists where it is not the file's (VAELoader lists a
``vae_approx`` TAESD pair by its name)."""
LOADERS = {"UNETLoader": "unet_name", "VAELoader": "vae_name", "CheckpointLoaderSimple": "ckpt_name", "LoraLoaderModelOnly": "lora_name"}
TEXT_LOADERS = ("DualCLIPLoader", "CLIPLoader")
"""T5-XXL, umT5-XXL and Qwen3-4B cannot be made small: CLIP-L through CLIPLoader(type="sd3"), padded to
4096 (the test's Flux.2 and Z-Image files take 4096-wide text)."""
TOMA_NODES = ("ToMAPatch", "ToMAPatchAdvanced")
RUN_LINE = re.compile(r"ToMA \[\w+\]: (\d+->\d+ tokens|no tokens merged)")
"""Where a ToMA run line starts in a server log line (ComfyUI may prefix it): the family, then the
token grids or report.NO_TOKENS; not the per-call "ToMA call:" lines nor the layout warnings."""


def run_records(log: str) -> list[Any]:
    """The RunRecords (nodes/run/report.py) of the ToMA run lines in a server log, in order, read back
    with report.parse_run_line (which fails on a line that is not a run line)."""
    report = pack_module("nodes.run.report")
    return [report.parse_run_line(line[m.start():]) for line in log.splitlines() if (m := RUN_LINE.search(line))]

FAMILIES = {"flux": "flux", "wan_high": "wan", "wan_low": "wan", "sd15": "unet", "flux2": "flux", "zimage": "lumina2"}
"""Model file key -> the family name ToMA's run line gives ("ToMA [flux]: ...")."""

NEEDS_CLASS = {"flux2": "Flux2", "taef2": "Flux2", "taef2_encoder": "Flux2", "zimage": "ZImage"}
"""FILES keys of models a ComfyUI tree may lack -> the ``comfy.supported_models`` class they need
(0.33 has them; 0.3.64 has neither these classes nor Flux.2's EmptyFlux2LatentImage /
Flux2Scheduler nodes). A template needs the classes of the files its loaders are swapped for."""


def template_files(name: str) -> list[str]:
    """The FILES keys of template ``name``'s (file stem) loaders, by SWAPS; [] for a name that is no template."""
    path = PACK_ROOT / "example_workflows" / f"{name}.json"
    if not path.is_file():
        return []
    nodes = json.loads(path.read_text(encoding="utf-8"))["nodes"]
    return [SWAPS[node["widgets_values"][0]] for node in nodes if node["type"] in LOADERS]


def missing_model_reason(name: str) -> str | None:
    """Why this ComfyUI cannot run template (file stem) or FILES key ``name`` (a model class it needs
    is absent), or None. Import only once ComfyUI is importable (the ``comfy`` fixture)."""
    import comfy.supported_models

    needed = sorted({NEEDS_CLASS[key] for key in template_files(name) or [name] if key in NEEDS_CLASS})
    absent = [kind for kind in needed if not hasattr(comfy.supported_models, kind)]
    if not absent:
        return None
    return f"{name}: this ComfyUI has no comfy.supported_models.{absent[0]} (its model, nodes and template need ComfyUI 0.33)"


def make_model_files(models: Path) -> list[Path]:
    """Write every file of FILES this ComfyUI can load under ``models`` (a server's models
    folder); their paths."""
    from harness import model_files

    makers = {
        "flux": model_files.flux_unet, "wan_high": lambda p: model_files.wan_unet(p, seed=0),
        "wan_low": lambda p: model_files.wan_unet(p, seed=1), "clip_l": model_files.clip_l,
        "wan_lora_high": lambda p: model_files.wan_lora(p, seed=6), "wan_lora_low": lambda p: model_files.wan_lora(p, seed=7),
        "taef1": model_files.taesd_vae, "wan_vae": model_files.wan_vae, "sd15": model_files.sd15_checkpoint,
        "flux2": model_files.flux2_unet, "zimage": model_files.zimage_unet,
        "taef2": lambda p: model_files.taesd_half(p, "decoder"), "taef2_encoder": lambda p: model_files.taesd_half(p, "encoder"),
    }
    keys = [key for key in FILES if missing_model_reason(key) is None]
    for key in keys:
        makers[key](models / FILES[key])
    return [models / FILES[key] for key in keys]


def with_steps(node: dict[str, Any], steps: int) -> None:
    """KSamplerAdvanced: ``steps`` steps, its start/end steps scaled alike (Wan 2.2's expert split)."""
    inputs = node["inputs"]
    total = inputs["steps"]
    for name in ("start_at_step", "end_at_step"):
        if inputs[name] < total:
            inputs[name] = round(inputs[name] * steps / total)
    inputs["steps"] = steps


def for_cpu(prompt: wa.Prompt, object_info: dict[str, Any], files: dict[str, str], name: str) -> wa.Prompt:
    """The shipped prompt with this test's model files, text-encoder loader, size and length."""
    for toma in TOMA_NODES:  # 2 steps: the shipped 0.75 window holds none
        prompt = wa.set_inputs(prompt, toma, start_percent=0.0)
    for node in prompt.values():
        if node["class_type"] in LOADERS:
            key = LOADERS[node["class_type"]]
            swap = SWAPS[node["inputs"][key]]
            node["inputs"][key] = LOADER_NAMES.get(swap, files[swap])
        elif node["class_type"] == "KSamplerAdvanced":
            with_steps(node, STEPS)
    for node_id in [i for c in TEXT_LOADERS for i in wa.nodes_of(prompt, c)]:
        prompt = wa.replace_node(prompt, node_id, wa.api_node(object_info, "CLIPLoader", clip_name=files["clip_l"], type="sd3"))
    for latent in ("EmptyLatentImage", "EmptySD3LatentImage", "EmptyFlux2LatentImage"):
        prompt = wa.set_inputs(prompt, latent, width=SIZE, height=SIZE)
    prompt = wa.set_inputs(prompt, "Flux2Scheduler", steps=STEPS, width=SIZE, height=SIZE)
    prompt = wa.set_inputs(prompt, "EmptyHunyuanLatentVideo", width=VIDEO_SIZE, height=VIDEO_SIZE, length=VIDEO_FRAMES)
    prompt = wa.set_inputs(prompt, "KSampler", steps=STEPS)
    prompt = wa.set_inputs(prompt, "SaveVideo", filename_prefix=f"toma_test_{name}")
    return wa.set_inputs(prompt, "SaveImage", filename_prefix=f"toma_test_{name}")


def shipped_prompts(object_info: dict[str, Any], files: dict[str, str], templates: list[Path] = EXAMPLES) -> dict[str, wa.Prompt]:
    """Every template of `templates` this ComfyUI can run, as its CPU prompt, by file stem (workflow_check.FLUX_TEMPLATE, ...)."""
    return {
        path.stem: for_cpu(wa.ui_to_api(json.loads(path.read_text(encoding="utf-8")), object_info), object_info, files, path.stem)
        for path in templates if missing_model_reason(path.stem) is None
    }


def family_of_workflow(prompt: wa.Prompt) -> str:
    """The model family of the prompt's diffusion-model files."""
    keys = {Path(relative).name: key for key, relative in FILES.items()} | {name: key for key, name in LOADER_NAMES.items()}
    names = [node["inputs"][LOADERS[node["class_type"]]] for node in prompt.values() if node["class_type"] in LOADERS]
    (family,) = {FAMILIES[keys[name]] for name in names if keys[name] in FAMILIES}
    return family


def expected_grids(family: str, size: int = SIZE, video_size: int = VIDEO_SIZE) -> set[tuple[int, int]]:
    """Token grids of square images of ``size`` and videos of ``video_size`` pixels: a token per 16 x
    16 pixels for Flux, Z-Image (``lumina2``) and Wan (per frame; Flux.2's 1 x 1 patches of its 16x
    latent alike); a 2-level UNet's two levels."""
    if family in ("flux", "lumina2"):
        return {(size // LATENT_FACTOR // PATCH,) * 2}
    if family == "wan":
        return {(video_size // LATENT_FACTOR // PATCH,) * 2}
    side = size // LATENT_FACTOR
    return {(side, side), (side // 2, side // 2)}


def toma_ids(prompt: wa.Prompt) -> list[str]:
    return [node_id for kind in TOMA_NODES for node_id in wa.nodes_of(prompt, kind)]
