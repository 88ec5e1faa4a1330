"""The shipped example workflows queued end to end on a live ComfyUI server.

The prompts: the shipped workflows made CPU-sized on test-made model files (live_prompts.py).

Checked per workflow: status success, an image (a video: every frame) written, one ToMA run line per
ToMA node (a Wan template: one per expert) with the node's scope, the token counts the tiling implies
(N = grid tokens, D = per-tile round(n * (1 - ratio))) and what the run gained, every LoRA key
applied (and the LoRA loaders changing the output), and ratio 0 bit-identical to the same prompt
without the ToMA nodes. The basic node's min_tokens is
"auto": the cost model leaves calls of these small test models unmerged where merging would not
pay, and the line says so; the merging checks run the same prompt with each ToMA Patch replaced by
ToMA Patch (Advanced) at min_tokens 0 (``forced``). Bad widget values come back as ComfyUI validation or
execution errors naming the value, and the server keeps serving afterwards. Templates of models this
ComfyUI lacks (Flux.2 and Z-Image on 0.3.64) skip by name with the reason.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import workflow_api as wa
from live_comfy import LiveServer, Run, get_json, media_frames, queue, run_prompt
from live_prompts import (
    EXAMPLES,
    LATENT_FRAMES,
    SIZE,
    TOMA_NODES,
    VIDEO_FRAMES,
    VIDEO_SIZE,
    expected_grids,
    family_of_workflow,
    missing_model_reason,
    run_records,
    shipped_prompts,
    toma_ids,
)
from workflow_check import FLUX_TEMPLATE

from harness.pack import pack_module

log = logging.getLogger(__name__)

AUTO_REASON = "min_tokens auto: merging"
LORA_NOT_LOADED = "lora key not loaded"
"""comfy/lora.py's warning for a LoRA key that patches no layer of the model."""


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer, live_models: dict[str, str]) -> dict[str, Any]:
    """/object_info read after the model files exist (the loaders' file lists include them)."""
    return get_json(f"{live_server.url}/object_info")


@pytest.fixture(scope="module")
def prompts(object_info: dict[str, Any], live_models: dict[str, str]) -> dict[str, wa.Prompt]:
    return shipped_prompts(object_info, live_models)


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], Run]:
    """Runs shared between the tests of this module (each prompt is sampled once)."""
    return {}


def forced(prompt: wa.Prompt, object_info: dict[str, Any]) -> wa.Prompt:
    """The prompt with every ToMA Patch replaced by ToMA Patch (Advanced) with the same inputs, and
    every ToMA Patch (Advanced) at min_tokens 0 (a number, as a workflow saved before min_tokens
    took "auto"): merging on these small models whatever the cost model predicts."""
    for node_id in wa.nodes_of(prompt, "ToMAPatch"):
        advanced = wa.api_node(object_info, "ToMAPatchAdvanced", **prompt[node_id]["inputs"], min_tokens=0)
        prompt = wa.replace_node(prompt, node_id, advanced)
    return wa.set_inputs(prompt, "ToMAPatchAdvanced", min_tokens=0)


def with_ratio(prompt: wa.Prompt, ratio: float) -> wa.Prompt:
    """The prompt with ``ratio`` on every ToMA node, basic or Advanced."""
    for kind in TOMA_NODES:
        prompt = wa.set_inputs(prompt, kind, ratio=ratio)
    return prompt


def prompt_of(prompts: dict[str, wa.Prompt], path: Path) -> wa.Prompt:
    """The template's CPU prompt; a skip with the reason where this ComfyUI lacks its model."""
    reason = missing_model_reason(path.stem)
    if reason:
        pytest.skip(reason)
    return prompts[path.stem]


def shared_run(server: LiveServer, runs: dict, key: tuple[str, str], prompt: wa.Prompt) -> Run:
    if key not in runs:
        runs[key] = run_prompt(server, prompt)
        log.info("%s: %s in %.1f s", key, runs[key].status, runs[key].seconds)
    return runs[key]


def kept_tokens(height: int, width: int, tile: int, ratio: float) -> int:
    """Tokens left by ToMA's tiling on a grid whose sides the tile divides."""
    tiling = pack_module("toma_core.tiling")
    return (height // tile) * (width // tile) * tiling.kept_per_tile(tile * tile, ratio)




def assert_success(run: Run) -> None:
    errors = run.messages("execution_error")
    assert run.status == "success", f"status {run.status}: {errors}\n{run.log[-3000:]}"
    assert run.images(), f"no image in {run.history.get('outputs')}"


def check_run_record(record: Any, family: str, toma: dict[str, Any]) -> None:
    """A forced run's record (live_prompts.run_records): the node's scope, every step merged, the
    token counts of ToMA's tiling on the expected grids, and a gain stated."""
    assert record.family == family, record
    scope = toma.get("scope", "auto")
    if scope == "auto":  # ToMA Patch has no scope input: its family's own (registry.py Family.scope)
        scope = next(f.scope for f in pack_module("nodes.families.registry").FAMILIES if f.name == family)
    assert (f"scope {scope}," in record.settings) == (scope != "block"), record  # ToMASettings.describe names a scope other than block
    assert record.steps_merged == record.total_steps > 0, record  # start_percent 0: every step merged
    assert record.tokens and set(record.tokens) <= expected_grids(family), record
    frames = LATENT_FRAMES if family == "wan" else 1  # video: the grid is per latent frame
    for (height, width), (before, after) in record.tokens.items():
        assert before == frames * height * width, record
        assert after == frames * kept_tokens(height, width, toma["tile_size"], toma["ratio"]) < before, record
    assert record.gain is not None, record


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_shipped_workflow_runs_and_merges(live_server: LiveServer, object_info, prompts, runs, path: Path):
    prompt = forced(prompt_of(prompts, path), object_info)
    run = shared_run(live_server, runs, (path.stem, "forced"), prompt)
    assert_success(run)
    frames = media_frames(live_server, run.images()[0])
    video = family_of_workflow(prompt) == "wan"
    assert frames.shape == ((VIDEO_FRAMES, VIDEO_SIZE, VIDEO_SIZE, 3) if video else (1, SIZE, SIZE, 3))
    assert frames.std() > 0, "a constant image cannot show whether ToMA changed it"

    ids = toma_ids(prompt)
    records = run_records(run.log)
    log.info("%s run lines:\n%s", path.stem, "\n".join(record.line() for record in records))
    assert len(records) == len(ids), f"expected {len(ids)} ToMA run lines (one per patched model), got {records}\n{run.log[-3000:]}"
    for record, node_id in zip(records, ids):
        check_run_record(record, family_of_workflow(prompt), prompt[node_id]["inputs"])
    assert LORA_NOT_LOADED not in run.log, run.log[-3000:]  # comfy/lora.py: a LoRA key matched no layer


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_shipped_workflow_at_min_tokens_auto_says_what_it_gained_or_why_not(live_server: LiveServer, prompts, runs, path: Path):
    prompt = prompt_of(prompts, path)
    run = shared_run(live_server, runs, (path.stem, "toma"), prompt)
    assert_success(run)
    records = run_records(run.log)
    assert len(records) == len(toma_ids(prompt)), f"{records}\n{run.log[-3000:]}"
    for record in records:
        if record.steps_merged == 0:  # unmerged, and the line says why
            assert any(AUTO_REASON in why and "predicted" in why for why in record.unmerged_calls), record
        else:
            assert record.gain is not None, record


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_ratio_zero_is_bit_identical_to_no_toma(live_server: LiveServer, object_info, prompts, runs, path: Path):
    prompt = prompt_of(prompts, path)
    without = prompt
    for node_id in toma_ids(prompt):
        without = wa.remove_node(without, node_id, "model")
    zero = shared_run(live_server, runs, (path.stem, "ratio0"), with_ratio(prompt, 0.0))
    plain = shared_run(live_server, runs, (path.stem, "plain"), without)
    merged = shared_run(live_server, runs, (path.stem, "forced"), forced(prompt, object_info))
    for run in (zero, plain, merged):
        assert_success(run)
    reference = media_frames(live_server, plain.images()[0])
    assert reference.std() > 0
    assert (media_frames(live_server, zero.images()[0]) == reference).all(), "ratio 0 changed the image"
    assert not run_records(plain.log) and "ToMA [" not in plain.log, "a prompt without the ToMA node printed a ToMA line"
    # Evidence that the comparison can fail: the merged run (ratio from the workflow) differs.
    assert (media_frames(live_server, merged.images()[0]) != reference).any(), "ToMA at its ratio left the image unchanged"


LORA_TEMPLATES = [path for path in EXAMPLES if '"LoraLoaderModelOnly"' in path.read_text(encoding="utf-8")]


@pytest.mark.parametrize("path", LORA_TEMPLATES, ids=lambda p: p.stem)
def test_lora_loaders_change_the_output(live_server: LiveServer, prompts, runs, path: Path):
    """The test-made LoRA files patch the test's model (else the template would run ToMA on the bare
    model): the prompt without ToMA differs from the same prompt without its LoRA loaders too."""
    plain = prompt_of(prompts, path)
    for node_id in toma_ids(plain):
        plain = wa.remove_node(plain, node_id, "model")
    bare = plain
    for node_id in wa.nodes_of(plain, "LoraLoaderModelOnly"):
        bare = wa.remove_node(bare, node_id, "model")
    with_lora = shared_run(live_server, runs, (path.stem, "plain"), plain)
    without = shared_run(live_server, runs, (path.stem, "no LoRA"), bare)
    for run in (with_lora, without):
        assert_success(run)
    assert LORA_NOT_LOADED not in with_lora.log, with_lora.log[-3000:]
    assert (media_frames(live_server, with_lora.images()[0]) != media_frames(live_server, without.images()[0])).any()


def node_error_details(answer: dict[str, Any]) -> str:
    return json.dumps(answer.get("node_errors", {}))


@pytest.mark.parametrize("name, value", [("ratio", 1.5), ("tile_size", 0)])
def test_out_of_range_widget_is_a_validation_error(live_server: LiveServer, prompts, name: str, value: Any):
    prompt = wa.set_inputs(prompts[FLUX_TEMPLATE], "ToMAPatch", **{name: value})
    status, answer = queue(live_server, prompt)
    assert status == 400, answer
    details = node_error_details(answer)
    toma_id = wa.only(prompt, "ToMAPatch")
    assert toma_id in answer["node_errors"], details
    assert f"Value {value} " in details and name in details, details  # ComfyUI's wording: "Value 1.5 bigger than max of 0.95: ratio"


def test_bad_block_list_is_an_execution_error_and_the_server_keeps_serving(live_server: LiveServer, object_info, prompts, runs):
    prompt = prompts[FLUX_TEMPLATE]
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
