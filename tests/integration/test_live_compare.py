"""The ToMA Compare template queued end to end on a live ComfyUI server (live_comfy.py), on the live
tests' model files (live_prompts.py: a full-width Flux-dev with 1 double + 1 single block, CLIP-L,
a TAESD-layout VAE; 256 x 256 px).

Forced merge: the template's ToMA Patch becomes ToMA Patch (Advanced) with the same inputs at
min_tokens 0, so these small calls merge whatever the cost model predicts, and the comparison runs
COMPARE_STEPS steps, REPEATS times each. Checked: status success; the saved picture holds the three
runs side by side above their captions; the report (from the Preview as Text node) has each run's
steps, median seconds within their spread and speed-up, ToMA's PSNR finite (it merged every step, so
its image differs), ToMA's run line and exactly one verdict line, its last, naming no merge failure;
the server log has one ToMA run line per timed run (twice as many where a fewer-steps run was timed:
the rounds are then run again with it) and none of a warm-up.

Nothing merged: the template's basic ToMA Patch with start_percent 1, a window that holds no step
(min_tokens auto merges these calls: the cost model predicts a gain here, so it cannot stand for the
auto case, which test_compare_report.py covers): the verdict says so first, with the run line's
reason, names the change on the node the queued prompt has (ToMA Patch, found through the prompt's
links), shows no ToMA PSNR, and labels the fewer-steps run as dropping no step; the picture puts it
above the images. Timings are read, never compared.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
import workflow_api as wa
from live_comfy import LiveServer, get_json, media_frames, run_prompt
from live_prompts import (
    COMPARISONS,
    SIZE,
    missing_model_reason,
    run_records,
    shipped_prompts,
)

log = logging.getLogger(__name__)

COMPARE_STEPS = 3
"""Enough for ToMA's merged calls (about 0.6x of an unmerged one's tokens here) to leave a fewer-steps
run shorter than the full one; few enough for a shared CPU."""
REPEATS = 2
"""Timed runs per contender: the fewest that show a spread."""
GAP = 8
"""White pixels between the pictures (nodes/node/compare_grid.py GAP)."""
ROW = re.compile(r"^(unpatched|ToMA|fewer steps): (\d+) steps, ([\d.]+) s \(repeats ([\d.]+)-([\d.]+) s\), ([\d.]+)x, (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer, live_models: dict[str, str]) -> dict[str, Any]:
    return get_json(f"{live_server.url}/object_info")


def merging(prompt: wa.Prompt, object_info: dict[str, Any]) -> wa.Prompt:
    """The comparison prompt at COMPARE_STEPS steps with each ToMA Patch as ToMA Patch (Advanced) at min_tokens 0."""
    for node_id in wa.nodes_of(prompt, "ToMAPatch"):
        advanced = wa.api_node(object_info, "ToMAPatchAdvanced", **prompt[node_id]["inputs"], min_tokens=0)
        prompt = wa.replace_node(prompt, node_id, advanced)
    return wa.set_inputs(prompt, "ToMACompare", steps=COMPARE_STEPS, repeats=REPEATS)


def report_of(run: Any, prompt: wa.Prompt) -> str:
    (preview,) = wa.nodes_of(prompt, "PreviewAny")
    return run.history["outputs"][preview]["text"][0]


def rows_of(report: str) -> dict[str, tuple[int, float, float, str]]:
    """label -> (steps, median seconds, speed-up, likeness); each median within its repeats' spread."""
    rows = {}
    for m in ROW.finditer(report):
        assert float(m[4]) <= float(m[3]) <= float(m[5]), m[0]
        rows[m[1]] = (int(m[2]), float(m[3]), float(m[6]), m[7])
    assert list(rows) == ["unpatched", "ToMA", "fewer steps"], report
    return rows


def toma_records(run: Any) -> list[Any]:
    """ToMA's run lines in the server log (the node logs its report too; its copy of a run line is not another run)."""
    return run_records("\n".join(line for line in run.log.splitlines() if "ToMA's run line: " not in line))


@pytest.mark.parametrize("path", COMPARISONS, ids=lambda p: p.stem)
def test_comparison_template_runs_and_reports(live_server: LiveServer, object_info, live_models, path: Path):
    reason = missing_model_reason(path.stem)
    if reason:
        pytest.skip(reason)
    prompt = merging(shipped_prompts(object_info, live_models, [path])[path.stem], object_info)
    run = run_prompt(live_server, prompt)
    assert run.status == "success", f"{run.messages('execution_error')}\n{run.log[-3000:]}"
    report = report_of(run, prompt)
    log.info("%s in %.1f s:\n%s", path.stem, run.seconds, report)

    (image,) = run.images()
    picture = media_frames(live_server, image)
    assert picture.shape[0] == 1 and picture.shape[2] == 3 * SIZE + 2 * GAP and picture.shape[1] > SIZE, picture.shape
    assert picture[0, :SIZE, :SIZE].std() > 0, "the unpatched image is constant"
    assert picture[0, SIZE:].std() > 0, "no captions under the images"

    rows = rows_of(report)
    assert rows["unpatched"][0] == rows["ToMA"][0] == COMPARE_STEPS and 1 <= rows["fewer steps"][0] <= COMPARE_STEPS
    assert all(seconds > 0 and speedup > 0 for _, seconds, speedup, _ in rows.values()), report
    toma_psnr = re.match(r"PSNR ([\d.]+) dB, SSIM ([\d.]+)$", rows["ToMA"][3])
    assert toma_psnr and math.isfinite(float(toma_psnr[1])), report
    lines = report.splitlines()
    assert [line for line in lines if line.startswith("Verdict:")] == [lines[-1]], report
    assert any(line.startswith("ToMA's run line: ToMA [flux]: ") for line in lines), report
    assert "warm-up" in report and "not counted" in report and "the median of a run's repeats" in report, report
    assert "merged nothing" not in report and "merged only" not in report, report

    records = toma_records(run)
    rounds = 2 * REPEATS if rows["fewer steps"][0] < COMPARE_STEPS else REPEATS  # then every run is timed again beside it
    assert [r.total_steps for r in records] == [COMPARE_STEPS] * rounds, f"the timed ToMA runs alone (a warm-up logs none): {records}"
    assert all(r.steps_merged == r.total_steps for r in records), records


@pytest.mark.parametrize("path", COMPARISONS, ids=lambda p: p.stem)
def test_comparison_says_first_that_toma_merged_nothing(live_server: LiveServer, object_info, live_models, path: Path):
    reason = missing_model_reason(path.stem)
    if reason:
        pytest.skip(reason)
    prompt = shipped_prompts(object_info, live_models, [path])[path.stem]
    assert wa.nodes_of(prompt, "ToMAPatch"), "the template ships the basic ToMA Patch"
    prompt = wa.set_inputs(wa.set_inputs(prompt, "ToMAPatch", start_percent=1.0), "ToMACompare", steps=COMPARE_STEPS, repeats=REPEATS)
    run = run_prompt(live_server, prompt)
    assert run.status == "success", f"{run.messages('execution_error')}\n{run.log[-3000:]}"
    report = report_of(run, prompt)
    log.info("%s, nothing merged, in %.1f s:\n%s", path.stem, run.seconds, report)

    records = toma_records(run)
    assert records and all(r.steps_merged == 0 for r in records), records
    verdict = report.splitlines()[-1]
    assert verdict.startswith(f"Verdict: ToMA merged nothing: 0 of {COMPARE_STEPS} steps (") and "outside the sigma window" in verdict, report
    assert "To make it merge: lower start_percent (or raise end_percent) on ToMA Patch." in verdict, verdict
    rows = rows_of(report)
    assert rows["ToMA"][3].startswith("not a contender: it merged nothing"), report
    assert rows["fewer steps"][0] == COMPARE_STEPS and rows["fewer steps"][3].startswith("not a contender: no step to drop"), report
    assert "inf dB" not in report and "wins" not in verdict, report

    (image,) = run.images()
    picture = media_frames(live_server, image)
    assert picture.shape[2] == 3 * SIZE + 2 * GAP and picture.shape[1] > SIZE, picture.shape
    assert picture[0, :GAP].min() == 255 and (picture[0, GAP:GAP * 4] < 128).any(), "no header above the images (uint8)"
