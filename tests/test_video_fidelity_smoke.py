"""Smoke test of bench/tokens/video_fidelity.py (how many frames a tile spans) on a tiny video.

On a still shot every frame repeats the first, so tiles spanning two frames can merge each token
with its copy in the next frame: their roundtrip error must be lower than with one frame per tile.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("skimage") is None, reason="scikit-image not installed (sample images)")
def test_video_fidelity_tiny_still_shot():
    result = subprocess.run(
        [sys.executable, "-m", "bench.tokens.video_fidelity", "--images", "astronaut", "--frames", "5",
         "--grid", "8", "--pans", "0", "--ratios", "0.5", "--tile-frames", "1", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.strip("|").split("|") for line in result.stdout.splitlines() if line.startswith("| 0 ")]
    roundtrip = {int(cells[2]): float(cells[4]) for cells in rows}
    kept = {int(cells[2]): int(cells[3]) for cells in rows}
    assert set(roundtrip) == {1, 2} and kept[1] == kept[2]
    assert roundtrip[2] < roundtrip[1]
