"""The defaults' image quality on the trained fixtures does not regress.

fixtures/quality_baseline.json records, per trained fixture, the PSNR of the ToMA Patch node at its
defaults against the unpatched model (seeded, CPU), as ``bench/quality/quality_baseline.py --write``
measured it. A change that lowers the mean by more than MARGIN_DB fails here; so does a change of
the node's defaults that was not measured and recorded again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

MARGIN_DB = 1.0
"""Allowed drop of the mean PSNR: float differences between CPUs may flip a rare near-tie."""


@pytest.fixture(scope="module")
def record(comfy: Path) -> dict[str, Any]:
    from bench.quality import quality_baseline

    path = quality_baseline.baseline_path()
    assert path.is_file(), f"{path} missing: run python -m bench.quality.quality_baseline --write"
    return json.loads(path.read_text())


def test_record_is_for_the_current_defaults(record: dict[str, Any]) -> None:
    from bench.quality import quality_baseline
    from harness import trained

    assert record["defaults"] == quality_baseline.node_defaults(), "defaults changed: measure and re-record"
    assert sorted(record["families"]) == sorted(trained.available())


@pytest.mark.parametrize("family", ["flux", "sdxl", "sd15"])
def test_default_psnr_does_not_drop(record: dict[str, Any], family: str) -> None:
    from bench.quality import quality_baseline

    recorded = record["families"][family]
    scores = quality_baseline.default_psnr(family, tuple(recorded["seeds"]))
    mean = sum(scores) / len(scores)
    assert mean >= recorded["mean"] - MARGIN_DB, f"{family}: PSNR {scores} (mean {mean:.2f}) < recorded {recorded['mean']:.2f} - {MARGIN_DB}"
    assert mean < float("inf"), "ToMA at its defaults left the image bit-identical: it did not merge"
