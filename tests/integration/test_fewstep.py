"""The basic node's merge window on few-step runs (bench/speed/fewstep.py): Flux.2 Klein at 4 steps
(ComfyUI 0.33's Flux2Scheduler) and Z-Image Turbo at 8 (res_multistep, ModelSamplingAuraFlow 3),
with the sigmas of ComfyUI's own code. Either the window merges a fair share of the run or the
node's run line warns (nodes/run/stats.py schedule_warning). No timing.

Flux2Scheduler, Flux2 and ZImage are new in ComfyUI 0.33: on 0.3.64 these tests skip saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.speed import fewstep
from bench.speed import realsize_setup as rs

FEW_STEP = [("flux2_klein4b", 4), ("flux2_klein9b", 4), ("zimage", 8)]


def require_033(name: str) -> None:
    import comfy.supported_models
    import comfy_extras.nodes_flux

    config_class = rs.family(name).config_class
    if not hasattr(comfy.supported_models, config_class):
        pytest.skip(f"this ComfyUI has no comfy.supported_models.{config_class} (it came after ComfyUI 0.3.64)")
    if rs.family(name).scheduler == "flux2" and not hasattr(comfy_extras.nodes_flux, "Flux2Scheduler"):
        pytest.skip("this ComfyUI has no Flux2Scheduler node (it came after ComfyUI 0.3.64)")


@pytest.mark.parametrize("name, steps", FEW_STEP)
def test_the_window_merges_exactly_the_steps_whose_sigma_it_holds(comfy: Path, name: str, steps: int) -> None:
    require_033(name)
    settings = rs.pack_module("nodes.settings")
    run = fewstep.window_run(name, "1024", settings.NODE_START_PERCENT)
    assert run.steps == steps == rs.family(name).steps
    assert run.sigmas[0] == pytest.approx(1.0) and run.sigmas[-1] == 0.0
    assert run.sigmas == sorted(run.sigmas, reverse=True)
    ms = rs.model_sampling(name, "1024")
    top, bottom = float(ms.percent_to_sigma(settings.NODE_START_PERCENT)), float(ms.percent_to_sigma(1.0))
    assert run.start_sigma == pytest.approx(top)
    assert run.merged_steps == [i for i, s in enumerate(run.sigmas[:-1]) if bottom < s <= top]


@pytest.mark.parametrize("name, steps", FEW_STEP)
def test_a_few_step_run_at_the_node_defaults_merges_its_share_or_warns(comfy: Path, name: str, steps: int) -> None:
    require_033(name)
    settings = rs.pack_module("nodes.settings")
    stats_mod = rs.pack_module("nodes.run.stats")
    start = settings.NODE_START_PERCENT
    run = fewstep.window_run(name, "1024", start)
    fair = len(run.merged_steps) >= stats_mod.FEW_STEPS_SHARE * run.steps * (1.0 - start)
    assert fair or (run.warning is not None and "lower start_percent" in run.warning)
    assert fair is (run.warning is None)


@pytest.mark.parametrize("name, steps", FEW_STEP)
def test_a_lower_start_percent_never_merges_fewer_steps(comfy: Path, name: str, steps: int) -> None:
    require_033(name)
    counts = [len(fewstep.window_run(name, "1024", start).merged_steps) for start in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)]
    assert counts[0] == steps and counts[-1] == 0
    assert counts == sorted(counts, reverse=True)


def test_steps_text_counts_from_one_as_the_progress_bar() -> None:
    assert fewstep.steps_text([2, 3], 4) == "2/4 (steps 3-4)"
    assert fewstep.steps_text([3], 4) == "1/4 (step 4)"
    assert fewstep.steps_text([], 4) == "0/4"
