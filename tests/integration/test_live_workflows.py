"""The shipped example workflows queued end to end on a live ComfyUI server (issue 13.1).

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
tiling implies (N = grid tokens, D = per-tile round(n * (1 - ratio))), and ratio 0 bit-identical
to the same prompt without the ToMA node. Bad widget values come back as ComfyUI validation or
execution errors naming the value, and the server keeps serving afterwards.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import workflow_api as wa
from live_comfy import PACK_ROOT, LiveServer, Run, get_json, image_pixels, queue, run_prompt
from pack import pack_module

log = logging.getLogger(__name__)

EXAMPLES = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
SIZE = 256
STEPS = 2
LATENT_FACTOR = 8
FLUX_PATCH = 2
FILES = {
    "flux": "diffusion_models/toma_test_flux_1x1.safetensors",
    "clip_l": "text_encoders/toma_test_clip_l.safetensors",
    "taef1": "vae/toma_test_taef1.safetensors",
    "sd15": "checkpoints/toma_test_sd15_2level.safetensors",
}
TOKEN_PATTERN = re.compile(r"(\d+)->(\d+) tokens \((\d+)x(\d+)\)")


@pytest.fixture(scope="session")
def live_models(live_server: LiveServer) -> dict[str, str]:
    """The test's model files in the server's models folder; name in the loaders' lists by key."""
    import model_files

    makers = {
        "flux": model_files.flux_unet, "clip_l": model_files.clip_l,
        "taef1": model_files.taesd_vae, "sd15": model_files.sd15_checkpoint,
    }
    for key, relative in FILES.items():
        makers[key](live_server.models / relative)
    return {key: Path(relative).name for key, relative in FILES.items()}


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer, live_models: dict[str, str]) -> dict[str, Any]:
    """/object_info read after the model files exist (the loaders' file lists include them)."""
    return get_json(f"{live_server.url}/object_info")


def for_cpu(prompt: wa.Prompt, object_info: dict[str, Any], files: dict[str, str], name: str) -> wa.Prompt:
    """The shipped prompt with this test's model files, text-encoder loader, size and length."""
    prompt = wa.set_inputs(prompt, "UNETLoader", unet_name=files["flux"])
    prompt = wa.set_inputs(prompt, "VAELoader", vae_name=files["taef1"])
    prompt = wa.set_inputs(prompt, "CheckpointLoaderSimple", ckpt_name=files["sd15"])
    for node_id in wa.nodes_of(prompt, "DualCLIPLoader"):
        prompt = wa.replace_node(prompt, node_id, wa.api_node(object_info, "CLIPLoader", clip_name=files["clip_l"], type="sd3"))
    prompt = wa.set_inputs(prompt, "EmptyLatentImage", width=SIZE, height=SIZE)
    prompt = wa.set_inputs(prompt, "KSampler", steps=STEPS)
    prompt = wa.set_inputs(prompt, "ToMAPatch", start_percent=0.0)
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


def shared_run(server: LiveServer, runs: dict, key: tuple[str, str], prompt: wa.Prompt) -> Run:
    if key not in runs:
        runs[key] = run_prompt(server, prompt)
        log.info("%s: %s in %.1f s", key, runs[key].status, runs[key].seconds)
    return runs[key]


def family_of_workflow(prompt: wa.Prompt) -> str:
    return "flux" if wa.nodes_of(prompt, "UNETLoader") else "unet"


def expected_grids(family: str) -> set[tuple[int, int]]:
    """Token grids a SIZE x SIZE image can give: Flux's 2x2 patches; a 2-level UNet's two levels."""
    side = SIZE // LATENT_FACTOR
    if family == "flux":
        return {(side // FLUX_PATCH, side // FLUX_PATCH)}
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


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_shipped_workflow_runs_and_merges(live_server: LiveServer, prompts, runs, path: Path):
    prompt = prompts[path.stem]
    run = shared_run(live_server, runs, (path.stem, "toma"), prompt)
    assert_success(run)
    pixels = image_pixels(live_server, run.images()[0])
    assert pixels.shape == (SIZE, SIZE, 3)
    assert pixels.std() > 0, "a constant image cannot show whether ToMA changed it"

    toma = prompt[wa.only(prompt, "ToMAPatch")]["inputs"]
    family = family_of_workflow(prompt)
    lines = toma_lines(run)
    assert len(lines) == 1, f"expected one ToMA run line, got {lines}\n{run.log[-3000:]}"
    assert f"ToMA [{family}]" in lines[0]
    assert f"merged {STEPS}/{STEPS} steps" in lines[0], lines[0]
    grids = TOKEN_PATTERN.findall(lines[0])
    assert grids, lines[0]
    assert {(int(h), int(w)) for *_, h, w in grids} <= expected_grids(family), lines[0]
    for before, after, height, width in (map(int, grid) for grid in grids):
        assert before == height * width, lines[0]
        assert after == kept_tokens(height, width, toma["tile_size"], toma["ratio"]), lines[0]
        assert after < before


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_ratio_zero_is_bit_identical_to_no_toma(live_server: LiveServer, prompts, runs, path: Path):
    prompt = prompts[path.stem]
    toma_id = wa.only(prompt, "ToMAPatch")
    zero = shared_run(live_server, runs, (path.stem, "ratio0"), wa.set_inputs(prompt, "ToMAPatch", ratio=0.0))
    plain = shared_run(live_server, runs, (path.stem, "plain"), wa.remove_node(prompt, toma_id, "model"))
    merged = shared_run(live_server, runs, (path.stem, "toma"), prompt)
    for run in (zero, plain, merged):
        assert_success(run)
    reference = image_pixels(live_server, plain.images()[0])
    assert reference.std() > 0
    assert (image_pixels(live_server, zero.images()[0]) == reference).all(), "ratio 0 changed the image"
    assert not toma_lines(plain), "a prompt without the ToMA node printed a ToMA line"
    # Evidence that the comparison can fail: the merged run (ratio from the workflow) differs.
    assert (image_pixels(live_server, merged.images()[0]) != reference).any(), "ToMA at its ratio left the image unchanged"


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
