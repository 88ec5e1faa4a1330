"""The sigma-based schedule: window, step index, re-selection epochs, multi-evaluation samplers."""

from __future__ import annotations

import pytest
import torch

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
        ({"recompute_every": 2.5}, r"recompute_every=2.5 must be an integer >= 1"),
        ({"merge_every": 0}, r"merge_every=0 must be an integer >= 1 \(sampling steps; 1 = every step\)"),
        ({"merge_every": -3}, r"merge_every=-3 must be an integer >= 1"),
        ({"merge_every": 1.5}, r"merge_every=1.5 must be an integer >= 1"),
        ({"merge_every": float("nan")}, r"merge_every=nan must be an integer >= 1"),
        ({"merge_every": "3"}, r"merge_every='3' must be an integer >= 1"),
        ({"merge_every": True}, r"merge_every=True must be an integer >= 1"),
        ({"merge_every": None}, r"merge_every=None must be an integer >= 1"),
    ],
)
def test_illegal_schedule_raises(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MergeSchedule(**kwargs)


# --- merge_every -----------------------------------------------------------

LONG = [14.6 * 0.8**i for i in range(24)] + [0.0]
"""A 24-step schedule, long enough for several plan epochs at every merge_every tried."""


def step_decisions(schedule: MergeSchedule, sigmas: list[float]) -> list:
    """The decision of each step's first evaluation (at its own schedule sigma)."""
    window = schedule.window(percent_to_sigma)
    return [schedule.decide(s, sigmas, window) for s in sigmas[:-1]]


@pytest.mark.parametrize("every", [1, 2, 3, 4, 7])
def test_merge_every_merges_the_first_step_then_every_nth(every: int) -> None:
    got = step_decisions(MergeSchedule(merge_every=every), SIGMAS)
    assert [d.step for d in got] == list(range(len(SIGMAS) - 1))
    assert [d.merge for d in got] == [i % every == 0 for i in range(len(got))]
    assert all(d.skipped == (not d.merge) for d in got)  # the window is the whole run
    assert all(d.epoch is None and not d.reselect for d in got if not d.merge)


def test_merge_every_three_is_the_papers_schedule() -> None:
    got = step_decisions(MergeSchedule(merge_every=3), SIGMAS)
    assert [d.step for d in got if d.merge] == [0, 3, 6]
    assert [d.epoch for d in got if d.merge] == [0, 1, 2]  # recompute_every=1: a new plan each time


def test_merge_every_counts_from_the_first_step_in_the_window() -> None:
    schedule = MergeSchedule(start_percent=0.3, merge_every=2)
    window = schedule.window(percent_to_sigma)
    inside = [window.contains(s) for s in SIGMAS[:-1]]
    first = inside.index(True)
    assert first > 0  # the window really starts later than step 0
    got = step_decisions(schedule, SIGMAS)
    assert [d.merge for d in got] == [inside[i] and (i - first) % 2 == 0 for i in range(len(got))]
    assert got[first].merge and got[first].epoch == 0 and got[first].reselect
    assert [d.skipped for d in got] == [inside[i] and (i - first) % 2 == 1 for i in range(len(got))]


def test_merge_every_outside_the_window_is_not_skipped_but_outside() -> None:
    got = step_decisions(MergeSchedule(end_percent=0.0, merge_every=2), SIGMAS)
    assert not any(d.merge or d.skipped for d in got)


@pytest.mark.parametrize("every", [2, 3])
def test_all_evaluations_of_a_step_share_its_decision(every: int) -> None:
    """DPM2-style midpoints and repeated calls at one sigma (CFG passes run separately, or a second
    evaluation) get the decision of the step they belong to."""
    schedule = MergeSchedule(merge_every=every, recompute_every=2 * every)
    window = schedule.window(percent_to_sigma)
    for i in range(len(SIGMAS) - 2):
        first = schedule.decide(SIGMAS[i], SIGMAS, window)
        midpoint = schedule.decide((SIGMAS[i] * SIGMAS[i + 1]) ** 0.5, SIGMAS, window)
        again = schedule.decide(SIGMAS[i], torch.tensor(SIGMAS), window)
        assert first == midpoint == again
        assert first.step == i


def test_heun_corrector_follows_the_sigma_it_runs_at() -> None:
    """Heun evaluates step i's corrector at sigma i+1, which is also step i+1's sigma: from the
    sigma alone the two are one noise level, so they share step i+1's decision (documented)."""
    schedule = MergeSchedule(merge_every=2)
    window = schedule.window(percent_to_sigma)
    predictor, corrector = schedule.decide(SIGMAS[0], SIGMAS, window), schedule.decide(SIGMAS[1], SIGMAS, window)
    assert predictor.merge and predictor.step == 0
    assert corrector.step == 1 and corrector.skipped and not corrector.merge


@pytest.mark.parametrize("every", [1, 2, 3, 4])
@pytest.mark.parametrize("recompute", [1, 2, 3, 5, 6, 8])
def test_plans_are_never_older_than_recompute_every_steps(every: int, recompute: int) -> None:
    """recompute_every counts sampling steps, merged or not: a plan serves only merged steps fewer
    than recompute_every steps after the step that selected it, and is kept as long as that
    allows (a re-selection happens only when the previous plan would be too old)."""
    got = [d for d in step_decisions(MergeSchedule(recompute_every=recompute, merge_every=every), LONG) if d.merge]
    built: dict[int, int] = {}
    last_build = None
    for d in got:
        if d.reselect:
            assert d.epoch not in built
            assert last_build is None or d.step - last_build >= recompute
            built[d.epoch] = last_build = d.step
        assert d.step - built[d.epoch] < recompute
    epochs = [d.epoch for d in got]
    assert epochs == sorted(epochs)  # the runtime drops older epochs' plans when a new one starts


def test_merge_every_one_keeps_the_recompute_epochs() -> None:
    for recompute in (1, 2, 3, 5):
        got = step_decisions(MergeSchedule(recompute_every=recompute, merge_every=1), LONG)
        assert [d.epoch for d in got] == [i // recompute for i in range(len(got))]
        assert [d.reselect for d in got] == [i % recompute == 0 for i in range(len(got))]


def test_merge_every_with_recompute_every_examples() -> None:
    def built_at(recompute: int) -> list[int]:
        got = step_decisions(MergeSchedule(recompute_every=recompute, merge_every=3), LONG[:13])
        return [d.step for d in got if d.reselect]

    assert built_at(1) == built_at(2) == built_at(3) == [0, 3, 6, 9]  # each merged step chooses afresh
    assert built_at(6) == [0, 6]  # 0 and 3 share one plan, 6 and 9 the next


def test_whole_float_steps_are_accepted_as_ints() -> None:
    schedule = MergeSchedule(recompute_every=2.0, merge_every=3.0)
    assert (schedule.recompute_every, schedule.merge_every) == (2, 3)
    assert isinstance(schedule.merge_every, int)
