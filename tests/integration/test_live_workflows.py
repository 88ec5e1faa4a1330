"""The shipped example workflows queued end to end on a live ComfyUI server.

Each ``example_workflows/*.json`` is converted from the frontend's format to an API prompt by
``workflow_api.ui_to_api`` (driven by the server's ``/object_info``), then changed only where a
CPU test must:

- model file names: files made at test time in ComfyUI's real formats (``model_files.py``, random
  weights, never downloaded) in the server's temporary models folder: a full-width Flux-dev with
  1 double + 1 single block for ``UNETLoader``, a TAESD-layout VAE for ``VAELoader``, an SD1.5-class
  checkpoint (320 channels, 2 levels) for ``CheckpointLoaderSimple`` (SDXL's layout cannot shrink);
- the text-encoder loader where the real one cannot be made small: ``DualCLIPLoader`` (CLIP-L +
  T5-XXL) becomes ``CLIPLoader(type="sd3")`` with a CLIP-L, which pads to Flux's 4096 channels;
- size and length: 256x256 images, ``STEPS`` sampler steps, and ``start_percent`` 0 on the ToMA
  node, because with 2 steps the shipped 0.75 window holds no step and nothing would merge.

Checked per workflow: status success, an image written, ToMA's run line with the token counts the
tiling implies (N = grid tokens, D = per-tile round(n * (1 - ratio))) and what the run gained, and
ratio 0 bit-identical to the same prompt without the ToMA node. The basic node's min_tokens is
"auto": the cost model leaves calls of these small test models unmerged where merging would not
pay, and the line says so; the merging checks run the same prompt with each ToMA Patch replaced by
ToMA Patch (Advanced) at min_tokens 0 (``forced``). Bad widget values come back as ComfyUI validation or
execution errors naming the value, and the server keeps serving afterwards.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import workflow_api as wa
from live_comfy import PACK_ROOT, LiveServer, Run, get_json, media_frames, queue, run_prompt
from bench.harness.pack import pack_module

log = logging.getLogger(__name__)

EXAMPLES = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
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
    "clip_l": "text_encoders/toma_test_clip_l.safetensors",
    "taef1": "vae/toma_test_taef1.safetensors",
    "wan_vae": "vae/toma_test_wan_2.1_vae.safetensors",
    "sd15": "checkpoints/toma_test_sd15_2level.safetensors",
}
SWAPS = {
    "flux1-dev.safetensors": "flux",
    "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": "wan_high",
    "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": "wan_low",
    "ae.safetensors": "taef1",
    "wan_2.1_vae.safetensors": "wan_vae",
    "sd_xl_base_1.0.safetensors": "sd15",
}
"""Shipped model file name -> this test's file (a name missing here fails the test: a new
workflow needs its file made too)."""
LOADERS = {"UNETLoader": "unet_name", "VAELoader": "vae_name", "CheckpointLoaderSimple": "ckpt_name"}
TEXT_LOADERS = ("DualCLIPLoader", "CLIPLoader")
"""T5-XXL and umT5-XXL cannot be made small: CLIP-L through CLIPLoader(type="sd3"), padded to 4096."""
TOMA_NODES = ("ToMAPatch", "ToMAPatchAdvanced")
TOKEN_PATTERN = re.compile(r"(\d+)->(\d+) tokens \((\d+)x(\d+)\)")
GAIN_PATTERN = re.compile(r"this run about \d+\.\d\dx (faster|slower) than without ToMA")
AUTO_REASON = "min_tokens auto: merging"


@pytest.fixture(scope="session")
def live_models(live_server: LiveServer) -> Iterator[dict[str, str]]:
    """The test's model files in the server's models folder; name in the loaders' lists by key.
    Deleted afterwards (2 GB; pytest keeps its last temporary folders)."""
    from bench.harness import model_files

    makers = {
        "flux": model_files.flux_unet, "wan_high": lambda p: model_files.wan_unet(p, seed=0),
        "wan_low": lambda p: model_files.wan_unet(p, seed=1), "clip_l": model_files.clip_l,
        "taef1": model_files.taesd_vae, "wan_vae": model_files.wan_vae, "sd15": model_files.sd15_checkpoint,
    }
    paths = [live_server.models / relative for relative in FILES.values()]
    try:
        for key, path in zip(FILES, paths):
            makers[key](path)
        yield {key: path.name for key, path in zip(FILES, paths)}
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer, live_models: dict[str, str]) -> dict[str, Any]:
    """/object_info read after the model files exist (the loaders' file lists include them)."""
    return get_json(f"{live_server.url}/object_info")


def shorter(node: dict[str, Any]) -> None:
    """KSamplerAdvanced: STEPS steps, its start/end steps scaled alike (Wan 2.2's expert split)."""
    inputs = node["inputs"]
    total = inputs["steps"]
    for name in ("start_at_step", "end_at_step"):
        if inputs[name] < total:
            inputs[name] = round(inputs[name] * STEPS / total)
    inputs["steps"] = STEPS


def for_cpu(prompt: wa.Prompt, object_info: dict[str, Any], files: dict[str, str], name: str) -> wa.Prompt:
    """The shipped prompt with this test's model files, text-encoder loader, size and length."""
    prompt = wa.set_inputs(prompt, "ToMAPatch", start_percent=0.0)  # 2 steps: the 0.75 window holds none
    for node in prompt.values():
        if node["class_type"] in LOADERS:
            key = LOADERS[node["class_type"]]
            node["inputs"][key] = files[SWAPS[node["inputs"][key]]]
        elif node["class_type"] == "KSamplerAdvanced":
            shorter(node)
    for node_id in [i for c in TEXT_LOADERS for i in wa.nodes_of(prompt, c)]:
        prompt = wa.replace_node(prompt, node_id, wa.api_node(object_info, "CLIPLoader", clip_name=files["clip_l"], type="sd3"))
    prompt = wa.set_inputs(prompt, "EmptyLatentImage", width=SIZE, height=SIZE)
    prompt = wa.set_inputs(prompt, "EmptyHunyuanLatentVideo", width=VIDEO_SIZE, height=VIDEO_SIZE, length=VIDEO_FRAMES)
    prompt = wa.set_inputs(prompt, "KSampler", steps=STEPS)
    prompt = wa.set_inputs(prompt, "SaveVideo", filename_prefix=f"toma_test_{name}")
    return wa.set_inputs(prompt, "SaveImage", filename_prefix=f"toma_test_{name}")


@pytest.fixture(scope="module")
def prompts(object_info: dict[str, Any], live_models: dict[str, str]) -> dict[str, wa.Prompt]:
    return {
        path.stem: for_cpu(wa.ui_to_api(json.loads(path.read_text(encoding="utf-8")), object_info), object_info, live_models, path.stem)
        for path in EXAMPLES
    }


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], Run]:
    """Runs shared between the tests of this module (each prompt is sampled once)."""
    return {}


def forced(prompt: wa.Prompt, object_info: dict[str, Any]) -> wa.Prompt:
    """The prompt with every ToMA Patch replaced by ToMA Patch (Advanced) with the same inputs and
    min_tokens 0 (a number, as a workflow saved before min_tokens took "auto"): merging on these
    small models whatever the cost model predicts."""
    for node_id in wa.nodes_of(prompt, "ToMAPatch"):
        advanced = wa.api_node(object_info, "ToMAPatchAdvanced", **prompt[node_id]["inputs"], min_tokens=0)
        prompt = wa.replace_node(prompt, node_id, advanced)
    return prompt


def shared_run(server: LiveServer, runs: dict, key: tuple[str, str], prompt: wa.Prompt) -> Run:
    if key not in runs:
        runs[key] = run_prompt(server, prompt)
        log.info("%s: %s in %.1f s", key, runs[key].status, runs[key].seconds)
    return runs[key]


FAMILIES = {"flux": "flux", "wan_high": "wan", "wan_low": "wan", "sd15": "unet"}


def family_of_workflow(prompt: wa.Prompt) -> str:
    """The model family of the prompt's diffusion-model files."""
    keys = {Path(relative).name: key for key, relative in FILES.items()}
    names = [node["inputs"][LOADERS[node["class_type"]]] for node in prompt.values() if node["class_type"] in LOADERS]
    (family,) = {FAMILIES[keys[name]] for name in names if keys[name] in FAMILIES}
    return family


def expected_grids(family: str) -> set[tuple[int, int]]:
    """Token grids of this test's sizes: Flux's and Wan's 2x2 patches (per frame for Wan); a
    2-level UNet's two levels."""
    if family == "flux":
        return {(SIZE // LATENT_FACTOR // PATCH,) * 2}
    if family == "wan":
        return {(VIDEO_SIZE // LATENT_FACTOR // PATCH,) * 2}
    side = SIZE // LATENT_FACTOR
    return {(side, side), (side // 2, side // 2)}


def kept_tokens(height: int, width: int, tile: int, ratio: float) -> int:
    """Tokens left by ToMA's tiling on a grid whose sides the tile divides."""
    tiling = pack_module("toma_core.tiling")
    return (height // tile) * (width // tile) * tiling.kept_per_tile(tile * tile, ratio)


def toma_lines(run: Run) -> list[str]:
    return [line for line in run.log.splitlines() if "ToMA [" in line]


def assert_success(run: Run) -> None:
    errors = run.messages("execution_error")
    assert run.status == "success", f"status {run.status}: {errors}\n{run.log[-3000:]}"
    assert run.images(), f"no image in {run.history.get('outputs')}"


def toma_ids(prompt: wa.Prompt) -> list[str]:
    return [node_id for kind in TOMA_NODES for node_id in wa.nodes_of(prompt, kind)]


def check_run_line(line: str, family: str, toma: dict[str, Any]) -> None:
    assert f"ToMA [{family}]" in line, line
    merged = re.search(r"merged (\d+)/(\d+) steps", line)
    assert merged and merged[1] == merged[2] != "0", line  # start_percent 0: every step merged
    grids = TOKEN_PATTERN.findall(line)
    assert grids and {(int(h), int(w)) for *_, h, w in grids} <= expected_grids(family), line
    frames = LATENT_FRAMES if family == "wan" else 1  # video: the grid is per latent frame
    for before, after, height, width in (map(int, grid) for grid in grids):
        assert before == frames * height * width, line
        assert after == frames * kept_tokens(height, width, toma["tile_size"], toma["ratio"]) < before, line
    assert GAIN_PATTERN.search(line), line


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_shipped_workflow_runs_and_merges(live_server: LiveServer, object_info, prompts, runs, path: Path):
    prompt = forced(prompts[path.stem], object_info)
    run = shared_run(live_server, runs, (path.stem, "forced"), prompt)
    assert_success(run)
    frames = media_frames(live_server, run.images()[0])
    video = family_of_workflow(prompt) == "wan"
    assert frames.shape == ((VIDEO_FRAMES, VIDEO_SIZE, VIDEO_SIZE, 3) if video else (1, SIZE, SIZE, 3))
    assert frames.std() > 0, "a constant image cannot show whether ToMA changed it"

    ids = toma_ids(prompt)
    lines = toma_lines(run)
    assert len(lines) == len(ids), f"expected {len(ids)} ToMA run lines (one per patched model), got {lines}\n{run.log[-3000:]}"
    for line, node_id in zip(lines, ids):
        check_run_line(line, family_of_workflow(prompt), prompt[node_id]["inputs"])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_shipped_workflow_at_min_tokens_auto_says_what_it_gained_or_why_not(live_server: LiveServer, prompts, runs, path: Path):
    prompt = prompts[path.stem]
    run = shared_run(live_server, runs, (path.stem, "toma"), prompt)
    assert_success(run)
    lines = toma_lines(run)
    assert len(lines) == len(toma_ids(prompt)), f"{lines}\n{run.log[-3000:]}"
    for line in lines:
        merged = re.search(r"merged (\d+)/(\d+) steps", line)
        assert merged, line
        if merged[1] == "0":
            assert AUTO_REASON in line and "predicted" in line, line  # unmerged, and the line says why
        else:
            assert GAIN_PATTERN.search(line), line


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_ratio_zero_is_bit_identical_to_no_toma(live_server: LiveServer, object_info, prompts, runs, path: Path):
    prompt = prompts[path.stem]
    without = prompt
    for node_id in toma_ids(prompt):
        without = wa.remove_node(without, node_id, "model")
    zero = shared_run(live_server, runs, (path.stem, "ratio0"), wa.set_inputs(prompt, "ToMAPatch", ratio=0.0))
    plain = shared_run(live_server, runs, (path.stem, "plain"), without)
    merged = shared_run(live_server, runs, (path.stem, "forced"), forced(prompt, object_info))
    for run in (zero, plain, merged):
        assert_success(run)
    reference = media_frames(live_server, plain.images()[0])
    assert reference.std() > 0
    assert (media_frames(live_server, zero.images()[0]) == reference).all(), "ratio 0 changed the image"
    assert not toma_lines(plain), "a prompt without the ToMA node printed a ToMA line"
    # Evidence that the comparison can fail: the merged run (ratio from the workflow) differs.
    assert (media_frames(live_server, merged.images()[0]) != reference).any(), "ToMA at its ratio left the image unchanged"


def node_error_details(answer: dict[str, Any]) -> str:
    return json.dumps(answer.get("node_errors", {}))


@pytest.mark.parametrize("name, value", [("ratio", 1.5), ("tile_size", 0)])
def test_out_of_range_widget_is_a_validation_error(live_server: LiveServer, prompts, name: str, value: Any):
    prompt = wa.set_inputs(prompts[EXAMPLES[0].stem], "ToMAPatch", **{name: value})
    status, answer = queue(live_server, prompt)
    assert status == 400, answer
    details = node_error_details(answer)
    toma_id = wa.only(prompt, "ToMAPatch")
    assert toma_id in answer["node_errors"], details
    assert f"Value {value} " in details and name in details, details  # ComfyUI's wording: "Value 1.5 bigger than max of 0.95: ratio"


def test_bad_block_list_is_an_execution_error_and_the_server_keeps_serving(live_server: LiveServer, object_info, prompts, runs):
    flux = next(stem for stem, prompt in prompts.items() if family_of_workflow(prompt) == "flux")
    prompt = prompts[flux]
    toma_id = wa.only(prompt, "ToMAPatch")
    basic = prompt[toma_id]["inputs"]
    advanced = wa.api_node(object_info, "ToMAPatchAdvanced", **basic, blocks="double:99")
    run = run_prompt(live_server, wa.replace_node(prompt, toma_id, advanced))
    assert run.status == "error", run.history
    errors = run.messages("execution_error")
    assert errors and errors[0]["node_id"] == toma_id, errors
    assert "double:99" in errors[0]["exception_message"], errors

    assert get_json(f"{live_server.url}/object_info/ToMAPatch")
    cheapest = next(p for p in prompts.values() if family_of_workflow(p) == "unet")
    again = run_prompt(live_server, wa.set_inputs(cheapest, "KSampler", seed=1))
    assert_success(again)
