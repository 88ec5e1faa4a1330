"""The ToMA Compare node (nodes/node/compare.py) in real ComfyUI code on tiny models, on the CPU.

Its runs are the runs a KSampler would make: the unpatched and fewer-steps images equal those of
`comfy.sample.sample` at the same seed and steps (decoded by the same VAE), the ToMA images are the
patched model's. A Flux image goes through a real TAESD-layout VAE (comfy.sd.VAE); the Wan video
through a fixed linear decoder (latent channels -> RGB, 8x upsampled), since the node only calls
`vae.decode` and ComfyUI's video VAEs cannot be made small. Timings are read, never asserted.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import pytest
import torch
from compat_support import RUNTIME_LOGGER, patch, run_records

from harness.pack import pack_module

STEPS = 4
REPEATS = 2
ROW = re.compile(r"^(unpatched|ToMA|fewer steps|step cache): (\d+) steps, ([\d.]+) s \(repeats ([\d.]+)-([\d.]+) s\), ([\d.]+)x, (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def compare(comfy) -> Any:
    return pack_module("nodes.node.compare")


@pytest.fixture(scope="module")
def taesd(comfy) -> Any:
    import comfy.sd

    from harness import model_files

    return comfy.sd.VAE(sd=model_files.taesd_tensors(16))


class FrameDecoder:
    """Latent (B, C, F, H, W) -> frames (B, F, 8 H, 8 W, 3) in (0, 1): a fixed random channel mix."""

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        mix = torch.randn((3, latent.shape[1]), generator=torch.Generator().manual_seed(0))
        rgb = torch.sigmoid(torch.einsum("rc,bcfhw->bfhwr", mix, latent.float()))
        return rgb.repeat_interleave(8, 2).repeat_interleave(8, 3)


def run_node(compare, model, toma_model, positive, negative, latent, vae, **kw) -> tuple:
    kw.setdefault("repeats", REPEATS)
    output = compare.ToMACompare.execute(model, toma_model, positive, negative, {"samples": latent}, vae, 7, STEPS, 1.0, "euler", "simple", **kw)
    return output.args


def rows(report: str) -> dict[str, tuple[int, float, float, str]]:
    """label -> (steps, median seconds, speed-up, likeness); the spread must hold the median."""
    table = {}
    for m in ROW.finditer(report):
        assert float(m[4]) <= float(m[3]) <= float(m[5]), m[0]
        table[m[1]] = (int(m[2]), float(m[3]), float(m[6]), m[7])
    return table


def psnr_of(likeness: str) -> float:
    return float(re.match(r"PSNR (inf|[\d.]+) dB", likeness)[1])


def check_report(report: str, family: str, runs: tuple[str, ...] = ("unpatched", "ToMA", "fewer steps")) -> dict:
    table = rows(report)
    assert tuple(table) == runs, report
    assert all(seconds > 0 and speedup > 0 for _, seconds, speedup, _ in table.values()), report
    assert table["unpatched"][2] == 1.0 and table["unpatched"][3] == "reference"
    assert math.isfinite(psnr_of(table["ToMA"][3])), "ToMA merged every step at min_tokens 0: its image must differ"
    assert [line for line in report.splitlines() if line.startswith("Verdict:")] == [report.splitlines()[-1]], report
    assert f"ToMA's run line: ToMA [{family}]: " in report, report
    assert "warm-up" in report and "not counted" in report and "the median of a run's repeats" in report
    assert "merged nothing" not in report and "merged only" not in report, report
    return table


def lines_of(caplog) -> list[str]:
    """ToMA's info lines: its run lines alone, one per timed ToMA run (a warm-up logs none)."""
    return [r.getMessage() for r in caplog.records if r.name == RUNTIME_LOGGER and r.levelno == logging.INFO]


def plain(tiny, model, latent, steps, positive, negative) -> torch.Tensor:
    return tiny.sample(model, latent_image=latent.clone(), seed=7, steps=steps, cfg=1.0, positive=positive, negative=negative)


def test_flux_comparison_runs_what_a_ksampler_runs(compare, toma, tiny, tiny_flux, taesd, caplog):
    caplog.set_level(logging.INFO)
    merged = patch(toma, tiny_flux, blocks="all", min_tokens=0)
    positive, negative = tiny.make_conditioning(tiny_flux, 1), tiny.make_conditioning(tiny_flux, 2)
    latent = torch.zeros(tiny.FLUX_LATENT)
    picture, report, unpatched, toma_images, fewer = run_node(compare, tiny_flux, merged, positive, negative, latent, taesd)
    table = check_report(report, "flux")
    fewer_steps = table["fewer steps"][0]
    records, lines = run_records(caplog), lines_of(caplog)
    rounds = 2 * REPEATS if fewer_steps < STEPS else REPEATS  # the rounds run again beside the fewer steps
    assert len(records) == len(lines) == rounds, lines  # the timed ToMA runs' lines alone: warm-ups log none
    assert all(run.total_steps == run.steps_merged == STEPS for run in records)
    assert all(f"ToMA's run line: {line}" in report for line in lines[-REPEATS:]), report
    assert 1 <= fewer_steps <= STEPS
    assert torch.equal(unpatched, taesd.decode(plain(tiny, tiny_flux, latent, STEPS, positive, negative)))
    assert torch.equal(fewer, taesd.decode(plain(tiny, tiny_flux, latent, fewer_steps, positive, negative)))
    assert torch.equal(toma_images, taesd.decode(plain(tiny, merged, latent, STEPS, positive, negative)))
    assert not torch.equal(toma_images, unpatched)
    height, width = unpatched.shape[1:3]
    assert picture.shape[0] == 1 and picture.shape[2] == 3 * width + 2 * 8 and picture.shape[1] > height
    assert "ToMA Compare" in caplog.text, "the report is logged too"


def test_a_step_cache_is_a_fourth_run(compare, toma, tiny, tiny_flux, taesd):
    from comfy_extras.nodes_easycache import EasyCacheNode

    cached = EasyCacheNode.execute(tiny_flux, 0.2, 0.0, 1.0, False).result[0]
    merged = patch(toma, tiny_flux, blocks="all", min_tokens=0)
    positive, negative = tiny.make_conditioning(tiny_flux, 1), tiny.make_conditioning(tiny_flux, 2)
    picture, report, *_ = run_node(compare, tiny_flux, merged, positive, negative, torch.zeros(tiny.FLUX_LATENT), taesd, step_cache_model=cached)
    table = rows(report)
    assert tuple(table) == ("unpatched", "ToMA", "fewer steps", "step cache"), report
    assert table["step cache"][0] == STEPS
    assert picture.shape[2] == 4 * 128 + 3 * 8


def test_wan_video_compares_frames_and_shows_strips(compare, toma, comfy, caplog):
    from harness import tiny_wan

    caplog.set_level(logging.INFO)
    model = tiny_wan.build_wan(seed=0)
    merged = patch(toma, model, blocks="all", min_tokens=0, tile_size=4)
    positive, negative = tiny_wan.conditioning(model, 1), tiny_wan.conditioning(model, 2)
    latent = torch.zeros((1, 16, 5, 16, 16))
    picture, report, unpatched, toma_images, _ = run_node(compare, model, merged, positive, negative, latent, FrameDecoder())

    check_report(report, "wan")
    assert "5 frames" in report and "(mean over frames)" in report
    assert unpatched.shape == toma_images.shape == (5, 128, 128, 3)
    strip = pack_module("nodes.node.compare_grid").STRIP_FRAMES
    assert picture.shape[2] == strip * 128 + (strip - 1) * 8 and picture.shape[1] > 3 * 128


def test_models_in_the_wrong_sockets_are_refused(compare, toma, tiny, tiny_flux, taesd):
    merged = patch(toma, tiny_flux, blocks="all")
    other = patch(toma, tiny.build_flux(seed=1), blocks="all")
    cond = tiny.make_conditioning(tiny_flux, 1)
    latent = torch.zeros(tiny.FLUX_LATENT)
    with pytest.raises(ValueError, match="model carries a ToMA patch"):
        run_node(compare, merged, merged, cond, cond, latent, taesd)
    with pytest.raises(ValueError, match="toma_model carries no ToMA patch"):
        run_node(compare, tiny_flux, tiny_flux.clone(), cond, cond, latent, taesd)
    with pytest.raises(ValueError, match="toma_model is not a patched copy of model"):
        run_node(compare, tiny_flux, other, cond, cond, latent, taesd)
    with pytest.raises(ValueError, match="step_cache_model is not a patched copy of model"):
        run_node(compare, tiny_flux, merged, cond, cond, latent, taesd, step_cache_model=tiny.build_flux(seed=2))


def test_toma_that_merges_nothing_says_so_first_and_competes_not(compare, toma, tiny, tiny_flux, taesd):
    """A sigma window that holds none of the steps: ToMA's run is the unpatched model, and the
    picture's header, the ToMA and fewer-steps captions and the verdict say so, with the reason."""
    idle = patch(toma, tiny_flux, start=1.0, blocks="all", min_tokens=0)
    positive, negative = tiny.make_conditioning(tiny_flux, 1), tiny.make_conditioning(tiny_flux, 2)
    picture, report, unpatched, toma_images, fewer = run_node(compare, tiny_flux, idle, positive, negative, torch.zeros(tiny.FLUX_LATENT), taesd)
    assert torch.equal(toma_images, unpatched) and torch.equal(fewer, unpatched)
    verdict = report.splitlines()[-1]
    assert verdict.startswith(f"Verdict: ToMA merged nothing: 0 of {STEPS} steps ("), report
    assert "outside the sigma window" in verdict and "To make it merge: lower start_percent" in verdict, verdict
    table = rows(report)
    assert table["ToMA"][3] == "not a contender: it merged nothing, so it ran the unpatched model (its time differs by the clock's noise alone)", report
    assert table["fewer steps"][0] == STEPS and table["fewer steps"][3].startswith("not a contender: no step to drop"), report
    assert "inf dB" not in report
    first = (unpatched[0] * 255 + 0.5).to(torch.uint8).float() / 255
    assert not torch.equal(picture[0, :128, :128], first), "no header above the images"
    assert (picture[0, :40] < 0.5).any(), "no header text"


def test_repeats_out_of_range_are_refused(compare, toma, tiny, tiny_flux, taesd):
    merged = patch(toma, tiny_flux, blocks="all", min_tokens=0)
    cond = tiny.make_conditioning(tiny_flux, 1)
    with pytest.raises(ValueError, match="repeats=0 is outside the allowed range 1 - 20"):
        run_node(compare, tiny_flux, merged, cond, cond, torch.zeros(tiny.FLUX_LATENT), taesd, repeats=0)


class Recorder:
    """Sampling that records each timed run (model name, steps) and each warm-up (start_step given)."""

    def __init__(self) -> None:
        self.timed: list[tuple[str, int]] = []
        self.warmed: list[str] = []

    def run(self, model, steps, start_step=None, callback=None):
        if start_step is None:
            self.timed.append((model.name, steps))
        else:
            self.warmed.append(model.name)
        return torch.zeros(1)


def test_runs_are_timed_in_interleaved_rounds_each_after_its_warm_up(comfy):
    timing = pack_module("nodes.node.compare_timing")

    def model(name):
        return type("Model", (), {"name": name, "load_device": torch.device("cpu")})()

    unpatched, toma, cache = (timing.Contender(name, model(name), 4) for name in ("unpatched", "ToMA", "cache"))
    sampling = Recorder()
    runs = timing.interleaved(sampling, 3, [unpatched, toma, cache], lambda u, t: timing.Contender("fewer", model("fewer"), 3), lambda *_: None)
    first, then = [("unpatched", 4), ("ToMA", 4)], [("unpatched", 4), ("ToMA", 4), ("fewer", 3), ("cache", 4)]
    assert sampling.timed == first * 3 + then * 3
    assert sampling.warmed == [name for name, _ in sampling.timed], "a warm-up before every timed run"
    assert [run.label for run in runs] == ["unpatched", "ToMA", "fewer", "cache"]
    assert [len(run.times) for run in runs] == [6, 6, 3, 3]

    alone = Recorder()
    unpatched, toma = (timing.Contender(name, model(name), 4) for name in ("unpatched", "ToMA"))
    runs = timing.interleaved(alone, 2, [unpatched, toma], lambda u, t: u, lambda *_: None)
    assert alone.timed == first * 2 and runs[2] is unpatched, "no step to drop: no second rounds"
