"""bench/tokens/block_change.py measures what it says: its recorded block replays reproduce the
sampling run they were recorded from, and at ratio 0 every error it reports is exactly zero (the
no-op plan, and the pack's identity through a recorded model call). Two-step runs of the trained
Wan and Flux fixtures through ComfyUI's sampler."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture(scope="module")
def bc(comfy: Path) -> Any:
    from bench.tokens import block_change

    return block_change


@pytest.fixture(scope="module", params=["wan", "flux"])
def recorded(request: pytest.FixtureRequest, bc: Any) -> tuple[Any, Any, list, list]:
    args = bc.parse_args([])
    fixture = {"wan": bc.wan_fixture, "flux": bc.flux_fixture}[request.param](args)
    fixture = dataclasses.replace(fixture, sampler=fixture.sampler | {"steps": 2})
    block_calls, model_calls, _ = bc.record_run(fixture, seed=0)
    return args, fixture, block_calls, model_calls


def test_a_replay_gives_the_next_blocks_recorded_input(recorded: tuple) -> None:
    """Within a model call the image tokens flow from block to block (Flux: the last double block's
    image tokens are the first single block's image part), so each replay must give the next input."""
    _, _, block_calls, model_calls = recorded
    assert len(model_calls) == 2 and {c.step for c in block_calls} == {0, 1}
    checked = 0
    for call, after in itertools.pairwise(block_calls):
        if call.step != after.step:
            continue
        with torch.no_grad():
            torch.testing.assert_close(call.replay(call.x, None), after.x, rtol=1e-5, atol=1e-5)
        checked += 1
    assert checked >= 2 * 3


def test_ratio_zero_reports_no_error(recorded: tuple, bc: Any) -> None:
    args, fixture, block_calls, model_calls = recorded
    for call in block_calls[:3]:
        plan = fixture.plan(bc.plan_features(call.x), 0.0)
        assert bc.errors(call, plan, bc.exact_output(call)) == {"input": 0.0, "carry": 0.0, "run": 0.0}
    identity = bc.patched(fixture, 0.0, args)
    assert bc.call_error(identity, model_calls[-1]) == 0.0
    assert bc.call_error(bc.patched(fixture, 0.5, args), model_calls[-1]) > 0.0


def test_neighbours_sees_a_repeated_frame_and_independent_tokens(bc: Any) -> None:
    """Frames that repeat frame 1 are alike at the same place one frame later and nowhere else."""
    gen = torch.Generator().manual_seed(0)
    frames, h, w, c = 4, 6, 6, 256
    first = torch.randn(1, 1, h * w, c, generator=gen)
    video = torch.cat([torch.randn(1, 1, h * w, c, generator=gen), first.expand(1, frames - 1, -1, -1)], dim=1)
    alike = bc.neighbours(video.flatten(1, 2), (frames, h, w))
    assert alike["next frame"] == pytest.approx(1.0)
    for key in ("right", "down", "random"):
        assert abs(alike[key]) < 0.1, (key, alike)
