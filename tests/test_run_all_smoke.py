"""Smoke test of the benchmark entry point bench/publish/run_all.py (and through it bench/tokens/model_fidelity.py)
on tiny sizes: every section runs, results.md / results.json are written, speed-ups are against the
unpatched model of the same run and ToMA's denoiser output differs from the unpatched one.

Skips with the reason when ComfyUI (needed by the model sections) or scikit-image (the token
section's sample images) is not available. A few seconds; the benchmarks themselves are not run in CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import comfy_env

ROOT = Path(__file__).resolve().parents[1]


def _comfy_or_skip() -> Path:
    root = comfy_env.find_comfy_root()
    if root is None:
        tried = ", ".join(str(p) for p in comfy_env.candidate_paths())
        comfy_env.missing(f"ComfyUI not found (set COMFYUI_PATH; tried {tried}); bench/publish/run_all.py's model sections need it")
    return root


@pytest.mark.skipif(importlib.util.find_spec("skimage") is None, reason="scikit-image not installed (sample images)")
def test_run_all_smoke(tmp_path):
    root = _comfy_or_skip()
    env = dict(os.environ, COMFYUI_PATH=str(root))
    result = subprocess.run([sys.executable, "-m", "bench.publish.run_all", "--smoke", "--threads", "1",
                             "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    sections = results["sections"]
    skipped = sections["flux"].get("skipped")
    if skipped and "ComfyUI unavailable" in skipped:
        comfy_env.missing(skipped)
    assert set(sections) == {"core", "flux", "sdxl", "wan", "families", "tokens"}
    assert not any("skipped" in s for s in sections.values()), sections
    for family in ("flux", "sdxl"):
        rows = {r["config"]: r for r in sections[family]["rows"]}
        assert rows["unpatched"]["speedup"] == pytest.approx(1.0) and rows["unpatched"]["rel_error"] == 0.0
        for ratio in ("0.25", "0.5", "0.75"):
            toma = rows[f"ToMA {ratio}"]
            assert 0 < toma["rel_error"] < 10 and toma["ms"] > 0, toma
        assert sections[family]["reference_repeat_error"] == 0.0
        assert sections[family]["weight_seeds"] == [0, 1]
        low, high = rows["ToMA 0.5"]["rel_error_range"]
        assert low <= rows["ToMA 0.5"]["rel_error"] <= high
        assert rows["input +1% noise"]["ms"] is None and rows["input +1% noise"]["rel_error"] > 0
    assert {r["config"] for r in sections["sdxl"]["rows"]} >= {"ToMe 0.5", "ToMA-attn 0.5"}
    assert {r["config"] for r in sections["flux"]["rows"]} >= {"ideal 0.5"}
    wan = {r["config"]: r for r in sections["wan"]["rows"]}
    assert wan["unpatched"]["speedup"] == pytest.approx(1.0)
    assert wan["ToMA 0.5"]["tokens"] < wan["unpatched"]["tokens"] and wan["ToMA 0.5"]["ms"] > 0
    families = sections["families"]["rows"]
    assert {r["family"] for r in families} == {"sd3", "qwen_image", "lumina2", "hunyuan_video", "hidream"}
    assert all(r["kept"] < r["tokens"] and r["speedup"] > 0 for r in families)
    assert any(r["piece"] == "make_plan" for r in sections["core"]["rows"])
    assert {r["method"] for r in sections["tokens"]["records"]} >= {"toma", "tome", "pool2x2"}
    md = (tmp_path / "results.md").read_text()
    assert "| ToMA 0.5 |" in md and "Machine:" in md and "torch" in md
    assert "nodes' default" in md
    if importlib.util.find_spec("matplotlib") is not None:
        for png in ("flux_speedup_vs_error.png", "sdxl_speedup_vs_error.png", "token_fidelity.png"):
            assert (tmp_path / png).stat().st_size > 1000
