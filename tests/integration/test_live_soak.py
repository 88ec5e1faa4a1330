"""A soak on a live ComfyUI server, as users run one for days.

One server (``main.py --cpu``, started as the other live tests start theirs: live_comfy.py, with
one torch thread) gets ``PROMPTS`` prompts through ``/prompt`` on the tiny Flux, SD1.5-class and
Wan model files of the live tests (live_prompts.py: the shipped workflows, here at 64x64 pixels,
the Wan one ending in SaveLatent), in an order and with values drawn by ``random.Random(SEED)``:

- every ToMA widget drawn inside the range the server registered for it (``/object_info``, from
  nodes/node/toma_nodes.py and nodes/settings.py): half at its default, half at random; where a family
  refuses a value (scope "attention" or proportional attention on Wan, proportional attention on
  the UNet) the draw keeps the default, so that only the planned errors are errors;
- ``CANCELS`` runs cancelled through ``/interrupt`` while their sampler runs (the Advanced node with
  verbose on: its first per-call line says sampling has begun);
- ``REJECTS`` prompts with a widget out of its range (``/prompt`` answers 400 naming it) and ``ERRORS`` with a block list the model does not have (an execution error of the
  ToMA node naming it);
- ``FREES`` runs followed by ``/free`` (unload models, free memory) and ``SWITCHES`` by a switch to
  the next model family.

After every prompt: ToMA's run lines say what the run did (family, settings, steps merged of the
steps run, token counts; a cancelled sampler says "cancelled", never "bypassed" nor an error), the
log since the prompt has no traceback but a planned execution error's own, and ToMA's runtime has
no open run or call. After the soak, on the idle server after ``/free``: still no open run or call,
no ToMA per-call or per-run holder alive, no model loaded (soak_probe.py, a test-only custom node
installed only into this server, reads the process's state over HTTP); resident memory (VmRSS,
/proc/<pid>/status) grew by less than ``RSS_GROWTH_BOUND`` from the same point after the warm-up;
the log since the start has exactly the planned tracebacks; and a plain ToMA prompt gives a
bit-identical image to the same prompt on a freshly started server.

Cost: about 120 CPU-seconds of the server for the 60 prompts (Flux's full-width blocks take most:
~2 CPU-seconds a step), plus two server start-ups; the figures are logged at the end.
``TOMA_SOAK_PROMPTS`` sets another number of prompts (a longer soak by hand).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import workflow_api as wa
from live_comfy import (
    LiveServer,
    Run,
    get_json,
    media_frames,
    post_json,
    prepare_base_directory,
    queue,
    run_prompt,
    start_server,
    stop_server,
    wait_for_run,
    wait_until_ready,
)
from live_prompts import (
    FILES,
    LATENT_FRAMES,
    expected_grids,
    run_records,
    shipped_prompts,
    toma_ids,
    with_steps,
)
from workflow_check import FLUX_TEMPLATE, SDXL_TEMPLATE, WAN_TEMPLATE

from harness.pack import pack_module

log = logging.getLogger(__name__)

SEED = 21
PROMPTS = int(os.environ.get("TOMA_SOAK_PROMPTS", "60"))
"""Prompts of the soak after the warm-up (one per family); more for a longer soak by hand."""
CANCELS = PROMPTS // 5
REJECTS = PROMPTS // 20
ERRORS = PROMPTS // 20
FREES = PROMPTS // 20
SWITCHES = PROMPTS // 20
CANCEL_STEPS = 6
"""Steps of a cancelled run: the interrupt (checked after each step) lands while it samples."""
FAMILIES = ("unet", "wan", "flux")
"""The soak starts on the UNet; each switch moves to the next. Switches come about every
PROMPTS / (SWITCHES + 1) prompts (give or take 2), so that each family gets its share."""
SIZE = 64
"""Images and video frames of 64x64 pixels: token grids of 4x4 (Flux, Wan) and 8x8 / 4x4 (UNet),
most of them smaller than the drawn tile; a Flux step still costs ~4 CPU-seconds (its full width)."""
WORKFLOWS = {"flux": FLUX_TEMPLATE, "unet": SDXL_TEMPLATE, "wan": WAN_TEMPLATE}
SAMPLERS = ("KSampler", "KSamplerAdvanced")
VALID_BLOCKS = {
    "flux": ("auto", "all", "double:0", "single:0", "double:0,single:0"),
    "unet": ("auto", "all", "middle", "input:1", "input:0-8,middle", "output:0-1", "output:2-3"),
    "wan": ("auto", "all", "blocks:0"),
}
"""Block lists the tiny models have (Flux: 1 double + 1 single block; the 2-level UNet: transformers
at input 1 and 3, middle, output 0-3; Wan: 1 block)."""
BAD_BLOCKS = {"flux": "double:99", "unet": "input:99", "wan": "blocks:99"}
REFUSED = {"wan": {"scope": "attention", "proportional_attention": True}, "unet": {"proportional_attention": True}}
"""Values a family refuses at node time (nodes/families/common.py, unet.py): not drawn."""
RSS_GROWTH_BOUND = 128 * 2**20
"""Bytes VmRSS may grow over the soak, read at the same point before and after it: idle, models
unloaded by /free, garbage collected and the heap trimmed (soak_probe.py). Measured: 1 MiB over 20
prompts, 33 MiB over 60 (without the trim, glibc kept 300-500 MiB of freed model weights for reuse
after 10-20). Any model kept alive past /free exceeds it (the smallest, CLIP-L, is 236 MiB), and so
does a leak of 2 MiB per run (ToMA's plans, holders or a patched clone with its hooks)."""
TRACEBACK = "Traceback (most recent call last)"
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
"""One torch thread: on the shared 2-core machine a second thread's synchronisation cost the UNet
prompts 5x their CPU time (measured: 5.6 vs 1.1 CPU-seconds per prompt)."""


# ------------------------------------------------------------------------------------------------
# The soak's plan (drawn once from SEED)


@dataclass
class Step:
    """One prompt of the soak and what follows it."""

    index: int
    family: str
    kind: str
    """"run", "cancel", "reject" (a value /prompt must refuse), "error" (a bad block list) or "warm-up"."""
    after: str | None = None
    """"free", "switch" or None."""


def soak_plan(rng: random.Random) -> list[Step]:
    kinds = ["cancel"] * CANCELS + ["reject"] * REJECTS + ["error"] * ERRORS
    kinds += ["run"] * (PROMPTS - len(kinds))
    rng.shuffle(kinds)
    switches = [round(PROMPTS * k / (SWITCHES + 1)) + rng.randint(-2, 2) for k in range(1, SWITCHES + 1)]
    frees = rng.sample([i for i in range(1, PROMPTS - 1) if i not in switches], FREES)
    afters = {i: "switch" for i in switches} | {i: "free" for i in frees}
    steps, family = [], 0
    for index, kind in enumerate(kinds):
        steps.append(Step(index, FAMILIES[family % len(FAMILIES)], kind, afters.get(index)))
        family += afters.get(index) == "switch"
    return steps


def widget_specs(object_info: dict[str, Any], node: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Widget name -> (type or combo choices, options) of a ToMA node as the server registered it."""
    entry = object_info[node]
    specs = wa.input_specs(entry)
    out = {}
    for name in wa.widget_names(entry):
        kind, options = specs[name][0], (specs[name][1] if len(specs[name]) > 1 else {})
        out[name] = (options.get("options", kind) if kind == "COMBO" else kind, options)
    return out


def draw_value(rng: random.Random, name: str, kind: Any, options: dict[str, Any], family: str) -> Any:
    """A value inside the registered range: integers log-uniform (the ranges span 1-1000 and more)."""
    if name == "blocks":
        return rng.choice(VALID_BLOCKS[family])
    if name == "min_tokens":  # text: "auto" or a whole number of image tokens (nodes/settings.py)
        settings = pack_module("nodes.settings")
        low, high = settings.MIN_TOKENS_RANGE
        return rng.choice((settings.AUTO, "0", str(draw_value(rng, "min_tokens count", "INT", {"min": low, "max": high}, family))))
    if isinstance(kind, list):
        return rng.choice(kind)
    if kind == "BOOLEAN":
        return rng.random() < 0.5
    if kind == "INT":
        low, high = options["min"], options["max"]
        value = round(math.exp(rng.uniform(math.log(low + 1), math.log(high + 1)))) - 1
        return min(high, max(low, value))
    if kind == "FLOAT":
        return round(rng.uniform(options["min"], options["max"]), 3)
    raise AssertionError(f"{name}: no draw for widget type {kind}")


def draw_widgets(rng: random.Random, specs: dict[str, tuple[Any, dict[str, Any]]], family: str) -> dict[str, Any]:
    """Every widget: its default or (half the time) a random value in range; refused combinations
    of the family stay at the default."""
    values = {}
    for name, (kind, options) in specs.items():
        drawn = draw_value(rng, name, kind, options, family)
        if rng.random() < 0.5 or REFUSED.get(family, {}).get(name) == drawn:
            drawn = options["default"]
        values[name] = drawn
    return values


def out_of_range(rng: random.Random, specs: dict[str, tuple[Any, dict[str, Any]]]) -> tuple[str, Any]:
    """(widget, value) that /prompt must refuse: past a numeric bound. (A value not among a V3
    combo's options passes ComfyUI 0.3.64's validation: the node's settings refuse it when it runs.)"""
    name = rng.choice([n for n, (kind, options) in specs.items() if "min" in options])
    kind, options = specs[name]
    if "max" in options and rng.random() < 0.5:
        return name, options["max"] + (1 if kind == "INT" else 0.5)
    return name, options["min"] - (1 if kind == "INT" else 0.5)


# ------------------------------------------------------------------------------------------------
# Prompts


def sampler_order(prompt: wa.Prompt) -> list[str]:
    """Sampler node ids in the order they run (a sampler after the one its latent comes from)."""
    ids = [i for kind in SAMPLERS for i in wa.nodes_of(prompt, kind)]

    def depth(node_id: str) -> int:
        source = prompt[node_id]["inputs"]["latent_image"][0]
        return 1 + depth(source) if source in ids else 0

    return sorted(ids, key=depth)


def sampler_steps(node: dict[str, Any]) -> int:
    """Steps a sampler node runs (KSamplerAdvanced: its start/end slice of the schedule)."""
    inputs = node["inputs"]
    if node["class_type"] == "KSampler":
        return inputs["steps"]
    return min(inputs["end_at_step"], inputs["steps"]) - inputs["start_at_step"]


def with_toma(prompt: wa.Prompt, object_info: dict[str, Any], node: str, widgets: dict[str, Any], steps: int, seed: int) -> wa.Prompt:
    """The family's prompt with every ToMA node replaced by ``node`` with ``widgets``, its samplers
    at ``steps`` steps and noise ``seed``."""
    out = copy.deepcopy(prompt)
    for node_id in toma_ids(out):
        out[node_id] = wa.api_node(object_info, node, model=out[node_id]["inputs"]["model"], **widgets)
    for node_id in [i for kind in SAMPLERS for i in wa.nodes_of(out, kind)]:
        inputs = out[node_id]["inputs"]
        if out[node_id]["class_type"] == "KSampler":
            inputs.update(steps=steps, seed=seed)
        else:
            with_steps(out[node_id], steps)
            inputs["noise_seed"] = seed
    out = wa.set_inputs(out, "EmptyLatentImage", width=SIZE, height=SIZE)
    out = wa.set_inputs(out, "EmptyHunyuanLatentVideo", width=SIZE, height=SIZE)
    if wa.nodes_of(out, "SaveVideo"):
        out = latent_output(out)
    return wa.set_inputs(out, "SaveImage", filename_prefix="toma_soak")


def latent_output(prompt: wa.Prompt) -> wa.Prompt:
    """The video prompt ending in SaveLatent after its last sampler: the Wan VAE's decode (127M
    parameters, ~30 CPU-seconds per video here) is no part of what ToMA does."""
    out = copy.deepcopy(prompt)
    for node_id in [i for kind in ("VAEDecode", "CreateVideo", "SaveVideo") for i in wa.nodes_of(out, kind)]:
        del out[node_id]
    last = sampler_order(out)[-1]
    out["soak_latent"] = {"class_type": "SaveLatent", "inputs": {"samples": [last, 0], "filename_prefix": "toma_soak"}}
    return out


def settings_of(widgets: dict[str, Any]) -> Any:
    """ToMASettings as the node builds them from its widgets (toma_nodes.build_settings, scope auto unless set)."""
    settings = pack_module("nodes.settings")
    core = pack_module("toma_core")
    basic = ("ratio", "tile_size", "start_percent", "end_percent", "recompute_every", "merge_every")
    schedule = core.MergeSchedule(
        float(widgets["start_percent"]), float(widgets["end_percent"]), widgets["recompute_every"], widgets["merge_every"],
    )
    advanced = {"min_tokens": settings.NODE_MIN_TOKENS, "scope": settings.NODE_SCOPE} | {k: v for k, v in widgets.items() if k not in basic}
    return settings.ToMASettings(ratio=float(widgets["ratio"]), tile_size=int(widgets["tile_size"]), schedule=schedule, **advanced)


# ------------------------------------------------------------------------------------------------
# Checks of one run


def check_record(record: Any, family: str, widgets: dict[str, Any], steps: int, cancelled: bool) -> None:
    """The run record (live_prompts.run_records) of one sampler: family, settings, steps merged of the
    steps run, token counts; "cancelled" exactly when the user cancelled it; never an error or a bypass."""
    (family_entry,) = [f for f in pack_module("nodes.families.registry").FAMILIES if f.name == family]
    asked = settings_of(widgets)
    settings = family_entry.resolve(asked)  # the run line reports scope auto as the family's choice
    # ... or as the block merge, where the family's keys_values is predicted not to pay on this kernel
    # (patching.py patch_model, prediction.CostProfile.keys_values_pays: here a CPU, few merged blocks)
    allowed = {settings.describe()}
    if asked.scope == "auto" and settings.scope == "keys_values":
        allowed.add(dataclasses.replace(settings, scope="block").describe())
    assert record.family == family, record
    assert record.settings in allowed, f"settings {allowed!r}: {record}"
    assert record.status == ("cancelled" if cancelled else None), record  # never "failed" or "bypassed"
    assert record.total_steps == steps and record.steps_merged <= steps, f"{steps} steps run: {record}"
    schedule = settings.schedule
    if schedule.end_percent <= schedule.start_percent:
        assert record.steps_merged == 0, record
    elif not cancelled and (schedule.start_percent, schedule.end_percent, settings.min_tokens) == (0.0, 1.0, 0) and settings.effective_ratio > 0:
        assert record.steps_merged == -(-steps // schedule.merge_every), record  # the first step and every merge_every-th
    if record.steps_merged == 0:
        assert not record.tokens, record
        return
    frames = LATENT_FRAMES if family == "wan" else 1
    assert record.tokens and set(record.tokens) <= expected_grids(family, SIZE, SIZE), record
    for (height, width), (before, after) in record.tokens.items():
        assert before == frames * height * width and 0 < after <= before, record


def check_no_traceback(text: str, expected: int) -> None:
    assert text.count(TRACEBACK) == expected, f"expected {expected} tracebacks in the server log:\n{text[-4000:]}"


@dataclass
class Figures:
    """What the soak did, for its log line and the report."""

    prompts: int = 0
    outcomes: Counter = field(default_factory=Counter)
    afters: Counter = field(default_factory=Counter)
    rss: dict[str, dict[str, int]] = field(default_factory=dict)
    """VmRSS and RssAnon in bytes: "before" (after the warm-up and /free), "after" (after the soak
    and /free)."""
    seconds: float = 0.0
    server_cpu_seconds: float = 0.0


# ------------------------------------------------------------------------------------------------
# Servers


def rss_bytes(server: LiveServer) -> dict[str, int]:
    """VmRSS and RssAnon of the server process, in bytes (/proc/<pid>/status)."""
    fields = {}
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def probe(server: LiveServer, holders: bool = False) -> dict[str, Any]:
    """The server process's state (soak_probe.py); ToMA holders counted too when asked."""
    return get_json(f"{server.url}/toma_soak/state{'?holders=1' if holders else ''}")


def cpu_seconds(server: LiveServer) -> float:
    """User + system CPU time of the server process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_and_wait(server: LiveServer, timeout_s: float = 60.0) -> dict[str, Any]:
    """POST /free (unload models, free memory) until no model is loaded; the probe's state then.

    Posted again while models stay loaded: the prompt worker (ComfyUI main.py prompt_worker) acts
    on the flag when its queue wakes it, and a wake-up that comes while it collects garbage is lost
    until the next prompt."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, _ = post_json(f"{server.url}/free", {"unload_models": True, "free_memory": True})
        assert status == 200
        time.sleep(0.5)
        state = probe(server, holders=True)
        if not state["loaded_models"] or time.monotonic() > deadline:
            break
    assert not state["loaded_models"], f"/free left models loaded: {state}\n{server.log_tail()}"
    return state


def server_with_models(comfy: Path, base: Path, models: Path, with_probe: bool) -> LiveServer:
    """A started server whose models folder links the live tests' model files; with the probe
    custom node when asked."""
    prepare_base_directory(base)
    if with_probe:
        (base / "custom_nodes" / "toma_soak_probe.py").symlink_to(Path(__file__).with_name("soak_probe.py"))
    for relative in FILES.values():
        link = base / "models" / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(models / relative)
    server = start_server(comfy, base, env=SERVER_ENV)
    try:
        wait_until_ready(server)
    except BaseException:
        stop_server(server)
        raise
    return server


@pytest.fixture(scope="module")
def soak_server(comfy: Path, live_server: LiveServer, live_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The soak's own server (with the probe), on the live tests' model files. The shared live
    server is asked to unload its models first (the machine holds both)."""
    post_json(f"{live_server.url}/free", {"unload_models": True, "free_memory": True})
    server = server_with_models(comfy, tmp_path_factory.mktemp("soak_base"), live_server.models, with_probe=True)
    try:
        yield server
    finally:
        stop_server(server)


# ------------------------------------------------------------------------------------------------
# The soak


class Soak:
    """Runs the plan's prompts on one server and checks each; keeps the figures."""

    def __init__(self, server: LiveServer, object_info: dict[str, Any], prompts: dict[str, wa.Prompt], rng: random.Random) -> None:
        self.server, self.object_info, self.prompts, self.rng = server, object_info, prompts, rng
        self.specs = {node: widget_specs(object_info, node) for node in ("ToMAPatch", "ToMAPatchAdvanced")}
        self.figures = Figures()
        self.tracebacks = 0

    def prompt_for(self, step: Step) -> tuple[wa.Prompt, str]:
        node = "ToMAPatchAdvanced" if step.kind in ("cancel", "error") or self.rng.random() < 0.5 else "ToMAPatch"
        widgets = draw_widgets(self.rng, self.specs[node], step.family)
        steps = CANCEL_STEPS if step.kind == "cancel" else 2
        if step.kind == "cancel":
            widgets["verbose"] = True
        if step.kind == "error":
            widgets["blocks"] = BAD_BLOCKS[step.family]
        base = self.prompts[WORKFLOWS[step.family]]
        return with_toma(base, self.object_info, node, widgets, steps, self.rng.randrange(2**32)), node

    def run(self, step: Step, prompt: wa.Prompt | None = None) -> None:
        """Queue the step's prompt (drawn, or ``prompt`` as given), check it, then /free or switch."""
        if prompt is None:
            prompt, node = self.prompt_for(step)
        else:
            node = prompt[toma_ids(prompt)[0]]["class_type"]
        widgets = {k: v for k, v in prompt[toma_ids(prompt)[0]]["inputs"].items() if k != "model"}
        what = f"prompt {step.index} ({step.family}, {step.kind}, {node} {widgets})"
        if step.kind == "reject":
            self.reject(prompt, node, what)
        else:
            run = self.sample(prompt, step.kind == "cancel", what)
            self.check_run(run, prompt, step, widgets, what)
        self.figures.prompts += 1
        state = free_and_wait(self.server) if step.after == "free" else probe(self.server)
        assert not any(state["runtime"].values()), f"ToMA's runtime after {what}: {state}"
        if step.after:
            self.figures.afters[step.after] += 1

    def reject(self, prompt: wa.Prompt, node: str, what: str) -> None:
        name, value = out_of_range(self.rng, self.specs[node])
        prompt = wa.set_inputs(prompt, node, **{name: value})
        log_start = len(self.server.log_text())
        status, answer = queue(self.server, prompt)
        assert status == 400, f"{what}: {name}={value!r} was accepted: {answer}"
        details = str(answer.get("node_errors", {}))
        assert set(toma_ids(prompt)) & set(answer["node_errors"]) and name in details and str(value) in details, f"{what}: {details}"
        check_no_traceback(self.server.log_text()[log_start:], 0)
        self.figures.outcomes["rejected"] += 1

    def sample(self, prompt: wa.Prompt, cancel: bool, what: str) -> Run:
        log_start = len(self.server.log_text())
        start = time.monotonic()
        status, answer = queue(self.server, prompt)
        assert status == 200, f"{what}: /prompt refused it: {answer}"
        prompt_id = answer["prompt_id"]
        if cancel:
            while "ToMA call:" not in self.server.log_text()[log_start:]:
                assert time.monotonic() - start < 120, f"{what}: sampling did not start:\n{self.server.log_tail()}"
                time.sleep(0.05)
            assert post_json(f"{self.server.url}/interrupt", {"prompt_id": prompt_id})[0] == 200
        return wait_for_run(self.server, prompt_id, log_start, start)

    def check_run(self, run: Run, prompt: wa.Prompt, step: Step, widgets: dict[str, Any], what: str) -> None:
        records = run_records(run.log)
        samplers = sampler_order(prompt)
        interrupted = run.messages("execution_interrupted")
        if step.kind == "error":
            errors = run.messages("execution_error")
            assert run.status == "error" and errors, f"{what}: {run.history.get('status')}"
            assert errors[0]["node_id"] in toma_ids(prompt) and widgets["blocks"] in errors[0]["exception_message"], f"{what}: {errors}"
            assert not records, f"{what}: a ToMA run line for a run that never sampled: {records}"
            check_no_traceback(run.log, 1)  # ComfyUI logs the node's exception with its traceback
            self.tracebacks += 1
            self.figures.outcomes["execution error"] += 1
            return
        check_no_traceback(run.log, 0)
        assert "none of ToMA's block hooks ran" not in run.log, f"{what}: a bypass warning:\n{run.log[-3000:]}"
        ran = samplers
        cancelled_at = None
        if interrupted:
            assert step.kind == "cancel" and run.status == "error", f"{what}: {run.history.get('status')}"
            stopped = interrupted[0]["node_id"]
            if stopped in samplers:
                cancelled_at = stopped
                ran = samplers[: samplers.index(stopped) + 1]
            self.figures.outcomes["cancelled while sampling" if cancelled_at else "cancelled after sampling"] += 1
        else:
            assert run.status == "success" and run.history.get("outputs"), f"{what}: {run.history.get('status')}\n{run.log[-3000:]}"
            self.figures.outcomes["finished before the cancel" if step.kind == "cancel" else step.kind] += 1
        if cancelled_at is not None and len(records) == len(ran) - 1 and len(ran) > 1:
            # The interrupt reached ComfyUI after the sampler before finished and stopped the next one
            # while it loaded its model, before its sampling run began: no run, so no run line.
            ran, cancelled_at = ran[:-1], None
        assert len(records) == len(ran), f"{what}: expected {len(ran)} ToMA run lines, got {records}\n{run.log[-3000:]}"
        for record, sampler in zip(records, ran):
            check_record(record, step.family, widgets, sampler_steps(prompt[sampler]), cancelled=sampler == cancelled_at)


def default_widgets(specs: dict[str, tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
    return {name: options["default"] for name, (_, options) in specs.items()}


def plain_prompt(soak: Soak, family: str) -> wa.Prompt:
    """The family's workflow with the Advanced node at its defaults but merging from the first step
    on every call (min_tokens 0: "auto" leaves these small models unmerged), seed 0."""
    widgets = default_widgets(soak.specs["ToMAPatchAdvanced"]) | {"start_percent": 0.0, "min_tokens": "0"}
    return with_toma(soak.prompts[WORKFLOWS[family]], soak.object_info, "ToMAPatchAdvanced", widgets, 2, 0)


def image_of(server: LiveServer, prompt: wa.Prompt) -> Any:
    run = run_prompt(server, prompt)
    assert run.status == "success" and run.images(), f"{run.history.get('status')}\n{run.log[-3000:]}"
    return media_frames(server, run.images()[0])


def test_soak_leaves_nothing_behind(comfy: Path, soak_server: LiveServer, live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory):
    server = soak_server
    start, cpu_start, log_start = time.monotonic(), cpu_seconds(server), len(server.log_text())
    object_info = get_json(f"{server.url}/object_info")
    files = {key: Path(relative).name for key, relative in FILES.items()}
    rng = random.Random(SEED)
    soak = Soak(server, object_info, shipped_prompts(object_info, files), rng)
    plan = soak_plan(rng)

    for family in FAMILIES:  # warm-up: each family's models loaded once before the baseline
        soak.run(Step(-1, family, "warm-up"), plain_prompt(soak, family))
    free_and_wait(server)
    soak.figures.rss["before"] = rss_bytes(server)

    for step in plan:
        soak.run(step)
        log.info("soak prompt %d/%d (%s, %s, then %s) done at %.0f s", step.index + 1, PROMPTS, step.family, step.kind, step.after, time.monotonic() - start)

    state = free_and_wait(server)
    soak.figures.rss["after"] = rss_bytes(server)
    soak.figures.seconds = time.monotonic() - start
    soak.figures.server_cpu_seconds = cpu_seconds(server) - cpu_start
    log.info("soak figures: %s", soak.figures)
    assert not any(state["runtime"].values()), f"ToMA's runtime holds state on the idle server: {state}"
    assert state["call_contexts"] == 0 and state["run_states"] == 0, f"ToMA holders alive after /free: {state}"
    growth = soak.figures.rss["after"]["VmRSS"] - soak.figures.rss["before"]["VmRSS"]
    assert growth < RSS_GROWTH_BOUND, f"VmRSS grew by {growth >> 20} MiB (bound {RSS_GROWTH_BOUND >> 20} MiB): {soak.figures.rss}"
    check_no_traceback(server.log_text()[log_start:], soak.tracebacks)  # ComfyUI's own start-up may log some

    plain = plain_prompt(soak, "flux")
    soaked = image_of(server, plain)
    stop_server(server)
    fresh = server_with_models(comfy, tmp_path_factory.mktemp("fresh_base"), live_server.models, with_probe=False)
    try:
        assert (image_of(fresh, plain) == soaked).all(), "the soaked server's image differs from a fresh server's"
    finally:
        stop_server(fresh)
