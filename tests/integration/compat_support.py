"""Helpers shared by the integration tests that patch tiny random-weight models on CPU: the Flux and
UNet tests and the compatibility tests (ToMA with ComfyUI's built-in nodes and with
stand-ins for third-party packs' calling conventions).

Import only once ComfyUI is importable (the ``toma`` fixture in conftest.py makes sure).
Token counts are measured with an ``optimized_attention_override`` (``record_attention``), the
per-run result is read from the record of ToMA's one-line run summary (``run_records``:
nodes/run/report.py RunRecord, its fields rather than the line's wording).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.pack import pack_module

RUNTIME_LOGGER = "comfyui_toma_pack.nodes.run.wrappers"
"""Logger of the per-run summary line and of the bypass warning."""

FLUX_TEXT = 256
"""Text tokens of tiny_models.make_conditioning's Flux conditioning."""

CLIP_TEXT = 77
"""Text tokens of its UNet conditioning."""


class Toma:
    """The pack's modules, loaded the way ComfyUI loads them (relative imports inside the pack)."""

    def __init__(self) -> None:
        self.patching = pack_module("nodes.node.patching")
        self.settings = pack_module("nodes.settings")
        self.runtime = pack_module("nodes.run.runtime")
        self.current = pack_module("nodes.run.current")
        self.core = pack_module("toma_core")
        self.unet = pack_module("nodes.families.unet")
        self.nodes = pack_module("nodes.node.toma_nodes")

    def patch(self, model: Any, ratio: float = 0.5, start: float = 0.0, end: float = 1.0, every: int = 1, **kwargs: Any) -> Any:
        """ToMA on a clone of `model` (blocks="all" unless given: every block of the tiny models)."""
        kwargs.setdefault("blocks", "all")
        return patch(self, model, ratio, start, end, every, **kwargs)


def patch(toma: Toma, model: Any, ratio: float = 0.5, start: float = 0.0, end: float = 1.0, every: int = 1, **kwargs: Any) -> Any:
    """ToMA on a clone of `model` with these settings (the settings' own defaults otherwise, but blocks
    "all": every block of the tiny models, whose mechanics these tests check; "auto" has its own tests)."""
    kwargs.setdefault("blocks", "all")
    schedule = toma.core.MergeSchedule(start, end, every)
    return toma.patching.patch_model(model, toma.settings.ToMASettings(ratio=ratio, schedule=schedule, **kwargs))


def record_attention(
    model: Any, entry: Callable[[int, int, int, Any], Any] = lambda batch, q, k, mask: (batch, q, k),
) -> tuple[Any, list]:
    """A clone of `model` whose attention calls append ``entry(batch, query length, key length,
    mask or None)`` (by default the first three) to the returned list."""
    calls: list = []

    def override(func, q, k, v, heads, *args, **kwargs):
        dim = 2 if kwargs.get("skip_reshape") else 1
        calls.append(entry(int(q.shape[0]), int(q.shape[dim]), int(k.shape[dim]), kwargs.get("mask")))
        return func(q, k, v, heads, *args, **kwargs)

    override.hands_on = True  # ComfyUI's own function runs: the kernel ToMA reads (nodes/machinery/kernel_choice.py)
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    return clone, calls


def sample_with_noise(tiny: Any, model: Any, noise: torch.Tensor, steps: int = 4, cfg: float = 2.0, **kw: Any) -> torch.Tensor:
    """``comfy.sample.sample`` from this noise on an empty latent (euler, simple, seed 0), with random
    conditioning unless ``positive`` / ``negative`` are given; other ``kw`` go to the sampler."""
    import comfy.sample

    latent = torch.zeros_like(noise)
    pos = kw.pop("positive", None) or tiny.make_conditioning(model, 1234)
    neg = kw.pop("negative", None) or tiny.make_conditioning(model, 1235)
    return comfy.sample.sample(model, noise, steps, cfg, "euler", "simple", pos, neg, latent, seed=0, disable_pbar=True, **kw)


def run_records(caplog: pytest.LogCaptureFixture) -> list[Any]:
    """The RunRecords (nodes/run/report.py) of ToMA's per-run summary lines captured so far, as logged
    with each line; each is also checked to be what its line reads back as (report.parse_run_line)."""
    report = pack_module("nodes.run.report")
    records = []
    for r in caplog.records:
        if r.name == RUNTIME_LOGGER and hasattr(r, report.TOMA_RUN):
            record = getattr(r, report.TOMA_RUN)
            assert report.parse_run_line(r.getMessage()) == record, r.getMessage()
            records.append(record)
    return records


def without_gain(run: Any) -> Any:
    """A RunRecord without its gain, measured or predicted (call times differ between runs)."""
    return dataclasses.replace(run, gain=None)


def runs_for(reasons: dict[str, int], part: str) -> int:
    """Calls or block runs (a RunRecord's unmerged_calls / unmerged_blocks) unmerged for a reason
    whose text contains `part`."""
    return sum(n for why, n in reasons.items() if part in why)


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str = RUNTIME_LOGGER) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


class CountingBackend:
    """A Dynamo backend that counts the graphs it is handed and runs them eagerly."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward
