"""The ToMA Compare template queued end to end on a live ComfyUI server (live_comfy.py), on the live
tests' model files (live_prompts.py: a full-width Flux-dev with 1 double + 1 single block, CLIP-L,
a TAESD-layout VAE; 256 x 256 px).

The template's ToMA Patch becomes ToMA Patch (Advanced) with the same inputs at min_tokens 0, so
these small calls merge whatever the cost model predicts, and the comparison runs COMPARE_STEPS steps.
Checked: status success; the saved picture holds the three runs side by side above their captions;
the report (from the Preview as Text node) has each run's steps, seconds and speed-up, ToMA's PSNR
finite (it merged every step, so its image differs), ToMA's run line and exactly one verdict line,
its last; the server log has one ToMA run line, the timed run's (the warm-up logs none, so no
line of a one-step run stands beside the measured one). Timings are read, never compared.
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
GAP = 8
"""White pixels between the pictures (nodes/node/compare_grid.py GAP)."""
ROW = re.compile(r"^(unpatched|ToMA|fewer steps): (\d+) steps, ([\d.]+) s, ([\d.]+)x, (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer, live_models: dict[str, str]) -> dict[str, Any]:
    return get_json(f"{live_server.url}/object_info")


def merging(prompt: wa.Prompt, object_info: dict[str, Any]) -> wa.Prompt:
    """The comparison prompt at COMPARE_STEPS steps with each ToMA Patch as ToMA Patch (Advanced) at min_tokens 0."""
    for node_id in wa.nodes_of(prompt, "ToMAPatch"):
        advanced = wa.api_node(object_info, "ToMAPatchAdvanced", **prompt[node_id]["inputs"], min_tokens=0)
        prompt = wa.replace_node(prompt, node_id, advanced)
    return wa.set_inputs(prompt, "ToMACompare", steps=COMPARE_STEPS)


def report_of(run: Any, prompt: wa.Prompt) -> str:
    (preview,) = wa.nodes_of(prompt, "PreviewAny")
    return run.history["outputs"][preview]["text"][0]


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

    rows = {m[1]: (int(m[2]), float(m[3]), float(m[4]), m[5]) for m in ROW.finditer(report)}
    assert list(rows) == ["unpatched", "ToMA", "fewer steps"], report
    assert rows["unpatched"][0] == rows["ToMA"][0] == COMPARE_STEPS and 1 <= rows["fewer steps"][0] <= COMPARE_STEPS
    assert all(seconds > 0 and speedup > 0 for _, seconds, speedup, _ in rows.values()), report
    toma_psnr = re.match(r"PSNR ([\d.]+) dB, SSIM ([\d.]+)$", rows["ToMA"][3])
    assert toma_psnr and math.isfinite(float(toma_psnr[1])), report
    lines = report.splitlines()
    assert [line for line in lines if line.startswith("Verdict:")] == [lines[-1]], report
    assert any(line.startswith("ToMA's run line: ToMA [flux]: ") for line in lines), report
    assert "warm-up" in report and "not counted" in report, report

    # The node logs its report too; its copy of ToMA's run line is not another run.
    records = run_records("\n".join(line for line in run.log.splitlines() if "ToMA's run line: " not in line))
    assert [r.total_steps for r in records] == [COMPARE_STEPS], f"the timed ToMA run alone: {records}"
    assert records[0].steps_merged == COMPARE_STEPS, records
