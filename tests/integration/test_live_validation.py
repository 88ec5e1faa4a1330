"""A bad `blocks` or `min_tokens` on ToMA Patch (Advanced) is refused when the prompt is queued:
a real ComfyUI server (the shared ``live_server``, live_comfy.py) answers ``/prompt`` with HTTP 400
and our node's message, before any model loads (the node's ``validate_inputs``,
nodes/node/input_checks.py). The loader names an empty file: a prompt that got past validation
would fail loading it, which the accepted prompt here shows (so the refused ones never reached it).
Which inputs the answer marks: every one validate_inputs takes (ONE_CHECK_PER_NODE), each with the
messages of the bad ones only; the per-input marking the node cannot get from ComfyUI is a strict xfail.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from live_comfy import LiveServer, get_json, queue, wait_for_run

from harness.pack import pack_module

checks = pack_module("nodes.node.input_checks")
settings = pack_module("nodes.settings")
dit_blocks = pack_module("nodes.machinery.dit_blocks")

NEVER_LOADED = "toma_test_never_loaded.safetensors"
"""An empty file in models/diffusion_models: in UNETLoader's list, so its input validates; loading it fails."""
LOADER, TOMA, SAVE = "1", "2", "3"


@pytest.fixture(scope="module")
def advanced_defaults(live_server: LiveServer) -> dict[str, Any]:
    """The Advanced node's widget inputs at their defaults, as the server describes them."""
    entry = get_json(f"{live_server.url}/object_info/ToMAPatchAdvanced")["ToMAPatchAdvanced"]
    inputs = {**entry["input"].get("required", {}), **entry["input"].get("optional", {})}
    return {name: spec[1]["default"] for name, spec in inputs.items() if len(spec) > 1 and "default" in spec[1]}


@pytest.fixture(scope="module")
def never_loaded(live_server: LiveServer):
    path = live_server.models / "diffusion_models" / NEVER_LOADED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    yield NEVER_LOADED
    path.unlink(missing_ok=True)


def prompt(advanced_defaults: dict[str, Any], unet_name: str, **values: Any) -> dict[str, Any]:
    """Loader -> ToMA Patch (Advanced) with `values` -> ModelSave (an output node, so the chain is validated)."""
    return {
        LOADER: {"class_type": "UNETLoader", "inputs": {"unet_name": unet_name, "weight_dtype": "default"}},
        TOMA: {"class_type": "ToMAPatchAdvanced", "inputs": {**advanced_defaults, **values, "model": [LOADER, 0]}},
        SAVE: {"class_type": "ModelSave", "inputs": {"model": [TOMA, 0], "filename_prefix": "toma_never_saved"}},
    }


def flux_error(spec: str) -> str:
    """The message the node raises for `spec` on a Flux.1 model, when it runs."""
    try:
        settings.ToMASettings(blocks=spec)
        dit_blocks.parse_flux_blocks(spec, 19, 38)
    except ValueError as error:
        return str(error)
    raise AssertionError(f"{spec!r} is a valid Flux block list")


REFUSED = [
    {"min_tokens": "many"},
    {"min_tokens": "-5"},
    {"min_tokens": str(settings.MIN_TOKENS_RANGE[1] + 1)},
    {"blocks": "triple:1"},
    {"blocks": "double:3-1"},
    {"blocks": "5,double"},
    {"blocks": " "},
    {"blocks": "double:a", "min_tokens": "lots"},
]


@pytest.mark.parametrize("values", REFUSED, ids=lambda v: ",".join(f"{k}={val!r}" for k, val in v.items()))
def test_a_bad_value_is_refused_when_queued_with_the_nodes_message(live_server, advanced_defaults, never_loaded, values):
    status, answer = queue(live_server, prompt(advanced_defaults, never_loaded, **values))
    assert status == 400, f"/prompt accepted {values}: {answer}"
    assert list(answer["node_errors"]) == [TOMA], answer["node_errors"]
    errors = answer["node_errors"][TOMA]["errors"]
    assert {e["type"] for e in errors} == {"custom_validation_failed"}, errors
    told = "\n".join(e["details"] for e in errors)
    expected = checks.queued_input_errors(values.get("blocks", "auto"), values.get("min_tokens", "auto"))
    assert len(expected) == len(values)
    for message in expected:
        assert message in told, f"{message!r} not in the server's answer:\n{told}"
    if "min_tokens" in values:  # the run-time message itself
        with pytest.raises(ValueError) as error:
            settings.ToMASettings(min_tokens=values["min_tokens"])
        assert str(error.value) in told
    if "blocks" in values:  # the run-time message on Flux, up to the groups it names
        assert flux_error(values["blocks"]).split("; ")[0] in told


PER_WIDGET = [{"blocks": "triple:1"}, {"min_tokens": "many"}, {"blocks": "double:a", "min_tokens": "lots"}]
"""A bad `blocks` alone, a bad `min_tokens` alone, both bad."""

CHECKED = ("blocks", "min_tokens")
"""The inputs the Advanced node's validate_inputs takes (toma_nodes.py)."""

ONE_CHECK_PER_NODE = (
    "ComfyUI's execution.validate_inputs (0.3.64 and 0.33) reports what a node's validate_inputs returns under "
    "every input that function takes, and a node has one validate_inputs: a bad min_tokens marks blocks too"
)


def flagged(answer: dict[str, Any]) -> dict[str, str]:
    """Input name -> what /prompt's answer says under it for the ToMA node (its details after "<input> - ")."""
    told = {}
    for error in answer["node_errors"][TOMA]["errors"]:
        name = error["extra_info"]["input_name"]
        assert error["type"] == "custom_validation_failed" and error["details"].startswith(f"{name} - "), error
        assert name not in told, answer
        told[name] = error["details"].removeprefix(f"{name} - ")
    return told


def messages_of(values: dict[str, str]) -> dict[str, str]:
    """Each bad input's own message (input_checks.queued_input_errors of that input alone)."""
    alone = dict.fromkeys(CHECKED)
    return {name: checks.queued_input_errors(**(alone | {name: value}))[0] for name, value in values.items()}


def refused(live_server, advanced_defaults, never_loaded, values) -> dict[str, str]:
    status, answer = queue(live_server, prompt(advanced_defaults, never_loaded, **values))
    assert status == 400 and list(answer["node_errors"]) == [TOMA], answer
    return flagged(answer)


@pytest.mark.parametrize("values", PER_WIDGET, ids=lambda v: ",".join(v))
def test_the_answer_holds_the_bad_inputs_messages_alone_each_naming_its_input(live_server, advanced_defaults, never_loaded, values):
    """What /prompt answers on both trees: the messages of the bad inputs only, each starting with
    its input's name and value, under each input validate_inputs takes (ONE_CHECK_PER_NODE)."""
    told = refused(live_server, advanced_defaults, never_loaded, values)
    messages = messages_of(values)
    assert all(message.startswith(f"{name}=") for name, message in messages.items()), messages
    assert told == dict.fromkeys(CHECKED, "; ".join(messages[name] for name in CHECKED if name in messages))


@pytest.mark.xfail(strict=True, reason=ONE_CHECK_PER_NODE)
@pytest.mark.parametrize("values", PER_WIDGET, ids=lambda v: ",".join(v))
def test_each_bad_input_is_flagged_under_its_own_name_only(live_server, advanced_defaults, never_loaded, values):
    assert refused(live_server, advanced_defaults, never_loaded, values) == messages_of(values)


def test_good_values_pass_and_the_run_fails_only_at_loading(live_server, advanced_defaults, never_loaded):
    """The control: the same prompt with valid values is queued, and its run stops at the loader
    (the empty file), so a refused prompt was stopped before any model loaded."""
    log_start, start = len(live_server.log_text()), time.monotonic()
    status, answer = queue(live_server, prompt(advanced_defaults, never_loaded, blocks="double:5, 7-9", min_tokens="0"))
    assert status == 200, answer
    run = wait_for_run(live_server, answer["prompt_id"], log_start, start)
    assert run.status == "error", run.history
    (failure,) = run.messages("execution_error")
    assert failure["node_id"] == LOADER, failure
