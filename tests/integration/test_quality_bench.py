"""Smoke test of bench/quality/quality.py on one trained fixture: --quick with one seed
and a short run. The JSON holds the quick rows; the unpatched reference repeats bit for bit (PSNR
inf against its own re-run) and ToMA at ratio 0 gives the reference image bit for bit; the node
defaults change the image and have a measured speed-up; the table and figures are written.

Skips when no fixture is present (fixtures/<family>.safetensors, made by bench/quality/train_fixtures.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("skimage")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


def fixture_family() -> str:
    """The first family with a trained fixture (Flux preferred: the faster one), or skip."""
    for family in ("flux", "sdxl", "sd15"):
        if (ROOT / "fixtures" / f"{family}.safetensors").is_file():
            return family
    pytest.skip("no trained fixture in fixtures/ (bench/quality/train_fixtures.py makes them)")


def test_quality_quick(comfy: Path, tmp_path: Path) -> None:
    family = fixture_family()
    env = dict(os.environ, COMFYUI_PATH=str(comfy))
    command = [sys.executable, "-m", "bench.quality.quality", "--quick", "--families", family, "--seeds", "1",
               "--steps", str(STEPS), "--threads", "1", "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    data = json.loads((tmp_path / "quality.json").read_text())
    rows = {r["label"]: r for r in data["rows"]}
    assert {"unpatched", "ToMA 0 (identity)", "ToMA node defaults", "EasyCache 0.1"} <= set(rows)
    assert all(r["family"] == family and r["skipped"] is None for r in rows.values())
    fewer = [r for r in rows.values() if r["group"] == "fewer steps"]
    assert fewer and all(r["params"]["steps"] < STEPS for r in fewer)

    reference, identity, default = rows["unpatched"], rows["ToMA 0 (identity)"], rows["ToMA node defaults"]
    assert math.isinf(reference["psnr_min"]) and reference["deterministic"]
    assert math.isinf(identity["psnr_min"]) and identity["ssim_mean"] == 1.0
    assert math.isfinite(default["psnr_mean"]) and default["ssim_mean"] < 1.0
    for row in rows.values():
        assert row["speedup"] > 0 and row["seconds"] > 0, row["label"]
    assert "merged" in default["log"], default["log"]  # ToMA's own run summary: it merged

    assert f"## {family}" in (tmp_path / "quality.md").read_text()
    for name in (f"pareto_{family}.png", f"grid_{family}.png"):
        assert (tmp_path / name).stat().st_size > 1000, name

    combined = tmp_path / "combined"
    command = [sys.executable, "-m", "bench.quality.quality", "--combine", str(tmp_path), "--out", str(combined)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (combined / "quality.md").read_text() == (tmp_path / "quality.md").read_text()
    assert json.loads((combined / "quality.json").read_text())["rows"] == data["rows"]
    assert (combined / f"grid_{family}.png").is_file()
