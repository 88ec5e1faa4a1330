"""The one-shot GPU check (bench/speed/gpu_check.py) runs end to end at toy sizes on the CPU, so its
first run on a lent GPU cannot stop on a code error: every family this ComfyUI has gets its timing
and `min_tokens auto` rows, a family whose class it lacks is skipped by name, and the fixtures
sampled get their quality row. Its MultiGPU CFG Split section says why it skipped on a machine
without two GPUs, and its row is made here on two CPU devices (ComfyUI's device list is replaced in
this test only)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.speed import gpu_check, multigpu_check
from bench.speed import realsize_setup as rs

ROOT = Path(__file__).resolve().parents[2]

FIXTURES = ("sd15", "wan")
"""The two smallest fixtures: one image (trained.py) and the video one (trained_video.py)."""


@pytest.fixture(scope="module")
def report(comfy: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.md"
    result = subprocess.run(
        [sys.executable, "-m", "bench.speed.gpu_check", "--tiny", "--device", "cpu", "--out", str(out), "--fixtures", *FIXTURES],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out.read_text()


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def rows(text: str, first: str) -> list[list[str]]:
    """Table rows of `text` whose first cell is `first`, as lists of cells."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [c for c in cells if c[0] == first]


def ratio(cell: str) -> float:
    return float(cell.removesuffix("x"))


def present(name: str) -> bool:
    import comfy.supported_models

    return hasattr(comfy.supported_models, rs.family(name).config_class)


def test_every_family_is_timed_or_skipped_by_name(report: str) -> None:
    timings = section(report, "Block timings")
    for name in gpu_check.FAMILIES:
        found = rows(timings, name)
        if present(name):
            assert len(found) == 1, f"{name}: no timing row"
            unmerged, merged, measured, predicted = float(found[0][3]), float(found[0][4]), ratio(found[0][6]), ratio(found[0][7])
            assert unmerged > 0 and merged > 0
            # every figure is printed to 2 decimals: the ratio of the printed times brackets the printed ratio
            low, high = (unmerged - 0.005) / (merged + 0.005), (unmerged + 0.005) / max(merged - 0.005, 1e-9)
            assert low - 0.005 <= measured <= high + 0.005, found[0]
            assert math.isfinite(predicted) and predicted > 0
        else:
            assert not found
            assert f"has no comfy.supported_models.{rs.family(name).config_class}" in timings


def test_auto_decides_every_real_size(report: str) -> None:
    auto = section(report, "min_tokens auto")
    for name in gpu_check.FAMILIES:
        found = rows(auto, name)
        if not present(name):
            assert not found and f"has no comfy.supported_models.{rs.family(name).config_class}" in auto
            continue
        assert [r[1] for r in found] == [s.label for s in gpu_check.sizes(name, tiny=False)]
        floor = rs.pack_module("nodes.run.prediction").AUTO_MIN_SPEEDUP
        for r in found:
            for predicted, decision in ((ratio(r[4]), r[5]), (ratio(r[6]), r[7])):
                assert decision in ("merge", "unmerged", "measured") and predicted > 0, r
                if decision != "measured" and abs(predicted - floor) > 0.01:  # the table rounds to 0.01
                    assert decision == ("merge" if predicted > floor else "unmerged"), r


def test_fixture_quality_rows(report: str) -> None:
    quality = section(report, "Fixture quality")
    for fixture in FIXTURES:
        found = rows(quality, fixture)
        assert len(found) == 1, f"{fixture}: no quality row"
        values = [float(c.removesuffix(" dB")) for c in found[0][2:]]
        assert all(math.isfinite(v) and v > 10 for v in values), found
    assert report.rstrip().endswith("s.") and "Total" in report


def test_multigpu_section_says_why_it_skipped(report: str) -> None:
    multigpu = section(report, "MultiGPU CFG Split")
    if importlib.util.find_spec("comfy.multigpu") is None:
        assert "MultiGPU CFG Split skipped: ComfyUI" in multigpu and "has no comfy/multigpu.py" in multigpu
    else:
        assert "MultiGPU CFG Split skipped: it needs two GPUs; this machine has 0 (device cpu)" in multigpu
    assert not rows(multigpu, "flux") and not rows(multigpu, "sdxl")


@pytest.mark.parametrize("name", multigpu_check.FAMILIES)
def test_multigpu_row_on_two_cpu_devices(name: str, comfy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The section's row where ComfyUI lists two devices: each copy of the model ran one call per
    step, the two-device run line counts both devices' block runs, the latent is the one-device one."""
    if importlib.util.find_spec("comfy.multigpu") is None:
        pytest.skip("this ComfyUI has no MultiGPU CFG Split (comfy/multigpu.py, ComfyUI 0.33 and later)")
    import comfy.model_management as mm
    import torch

    devices = [mm.get_torch_device(), torch.device("cpu", 0)]
    monkeypatch.setattr(mm, "get_all_torch_devices", lambda exclude_current=False: list(devices))
    size = gpu_check.sizes(name, tiny=True)[0]
    steps = multigpu_check.TINY_STEPS
    row = multigpu_check.family_row(name, size.grid, size.label, steps, "cpu", torch.float32, gpu_check.TINY_OVERRIDES[name])
    assert row["calls"] == {"cpu": steps, "cpu:0": steps}
    one, two = row["blocks"]
    assert one > 0 and two == 2 * one
    assert row["drift"] <= 0.02, row
    found = rows(multigpu_check.table([row], []), name)
    assert len(found) == 1 and found[0][7] == f"cpu: {steps}, cpu:0: {steps}" and found[0][8] == f"{one} / {two}"


def test_each_kernel_present_is_timed_and_its_merged_attention_checked(report: str) -> None:
    """Section 5 on a CPU: the SDPA kernel (ComfyUI's pytorch attention) times Wan 14B's and Flux's
    few-block models at scope block and keys_values, and the merged attention of the form the pack
    runs there meets the proportional-attention formula to bf16's precision."""
    kernels = section(report, "Attention kernels")
    for name in gpu_check.KERNEL_SIZES:
        found = rows(kernels, name)
        if not present(name):
            assert not found
            continue
        assert [(r[2], r[3]) for r in found] == [("sdpa", "block"), ("sdpa", "keys_values")]
        assert all(float(r[4]) > 0 and float(r[5]) > 0 for r in found)
    (check,) = rows(kernels, "sdpa")
    assert check[1] in ("channel", "plain") and float(check[2]) < 0.02
