"""Smoke test of bench/speed/bench_families.py: every family-shaped model builds from
ComfyUI's classes, runs unpatched, with ToMA and as the ideal, and prints its row. Tiny grid, one
timed round: the numbers are meaningless here, the bench's real run is in docs/."""

from __future__ import annotations

import math
from typing import Any

import pytest


def test_every_family_prints_a_row(comfy: Any, capsys: pytest.CaptureFixture) -> None:
    from bench.speed import bench_families

    bench_families.main(["--grid", "4", "--repeats", "1", "--warmup", "0", "--threads", "1", "--clock", "cpu"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert sorted(row[0] for row in rows) == sorted(bench_families.SHAPES)
    for row in rows:
        n, d, speedup = int(row[2]), int(row[3]), float(row[6])
        assert d < n and math.isfinite(speedup) and speedup > 0
