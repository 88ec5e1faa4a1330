"""The sigma-based schedule: window, step index, re-selection epochs, multi-evaluation samplers."""

from __future__ import annotations

import pytest

from toma_core import MergeSchedule, step_index

SIGMAS = [14.6, 8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.0]


def percent_to_sigma(percent: float) -> float:
    """Like ComfyUI's: 0 -> a huge sentinel, 1 -> 0, monotone in between."""
    if percent <= 0.0:
        return 999999999.9
    if percent >= 1.0:
        return 0.0
    return 15.0 * (1.0 - percent) ** 2


def decisions(schedule: MergeSchedule, sigmas: list[float]) -> list[tuple[bool, bool, int | None]]:
    window = schedule.window(percent_to_sigma)
    return [(d.merge, d.reselect, d.epoch) for d in (schedule.decide(s, SIGMAS, window) for s in sigmas)]


def test_default_merges_every_step_and_reselects_every_step() -> None:
    got = decisions(MergeSchedule(), SIGMAS[:-1])
    assert got == [(True, True, i) for i in range(7)]


def test_recompute_every_groups_steps_into_epochs() -> None:
    got = decisions(MergeSchedule(recompute_every=3), SIGMAS[:-1])
    assert [g[1] for g in got] == [True, False, False, True, False, False, True]
    assert [g[2] for g in got] == [0, 0, 0, 1, 1, 1, 2]


def test_window_limits_merging() -> None:
    schedule = MergeSchedule(start_percent=0.3, end_percent=0.8)
    window = schedule.window(percent_to_sigma)
    got = decisions(schedule, SIGMAS[:-1])
    assert [g[0] for g in got] == [window.contains(s) for s in SIGMAS[:-1]]
    assert [g[0] for g in got] == [False, False, True, True, True, False, False]
    assert got[2] == (True, True, 0)


@pytest.mark.parametrize("start,end", [(0.0, 0.0), (0.5, 0.5), (0.7, 0.2)])
def test_empty_window_never_merges(start: float, end: float) -> None:
    got = decisions(MergeSchedule(start_percent=start, end_percent=end), SIGMAS[:-1])
    assert not any(g[0] for g in got)


def test_intermediate_sigmas_share_their_step() -> None:
    # Heun / DPM2 evaluate between schedule sigmas; those calls belong to the step they refine.
    schedule = MergeSchedule(recompute_every=2)
    window = schedule.window(percent_to_sigma)
    first, mid = schedule.decide(8.0, SIGMAS, window), schedule.decide(6.0, SIGMAS, window)
    assert first.step == mid.step == 1
    assert first.epoch == mid.epoch == 0
    assert step_index(0.3, SIGMAS) == 5


def test_img2img_schedule_starts_at_its_own_first_sigma() -> None:
    schedule = MergeSchedule(recompute_every=2)
    partial = SIGMAS[3:]
    window = schedule.window(percent_to_sigma)
    got = [schedule.decide(s, partial, window) for s in partial[:-1]]
    assert [d.step for d in got] == [0, 1, 2, 3]
    assert [d.epoch for d in got] == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"start_percent": -0.1}, r"start_percent=-0.1 is outside \[0, 1\]"),
        ({"end_percent": 1.5}, r"end_percent=1.5 is outside \[0, 1\]"),
        ({"recompute_every": 0}, r"recompute_every=0 must be an integer >= 1"),
    ],
)
def test_illegal_schedule_raises(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MergeSchedule(**kwargs)
