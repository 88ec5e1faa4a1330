"""The one decision of a model call (nodes/run/wrappers.py call_veto): each rule, in its order, from
its arguments alone; `auto` is asked only for a call every other rule lets merge, and asks the run's
timer only where the cost model's prediction is close (gain.auto_call_veto)."""

from __future__ import annotations

import pytest

from harness.pack import pack_module

wrappers = pack_module("nodes.run.wrappers")
gain = pack_module("nodes.run.gain")
prediction = pack_module("nodes.run.prediction")
cost = pack_module("toma_core.cost")
contract = pack_module("nodes.contract")
settings_mod = pack_module("nodes.settings")
core = pack_module("toma_core")

MERGE = core.StepDecision(3, True, False, 0)
GRID = contract.CallGeometry(8, 8, 12)


def veto(settings=None, decision=MERGE, geometry=GRID, auto=lambda: None, asked=None) -> str | None:
    def ask() -> str | None:
        if asked is not None:
            asked.append(True)
        return auto()

    return wrappers.call_veto(settings or settings_mod.ToMASettings(), decision, geometry, "OFF", ask)


@pytest.mark.parametrize("case, expected", [
    ({"decision": None}, "outside a sampling run"),
    ({"settings": settings_mod.ToMASettings(ratio=0.0)}, "OFF"),
    ({"decision": core.StepDecision(3, False, False, None, skipped=True),
      "settings": settings_mod.ToMASettings(schedule=core.MergeSchedule(merge_every=2))}, "between merge steps (merge_every=2)"),
    ({"decision": core.StepDecision(3, False, False, None)}, "outside the sigma window"),
    ({"geometry": contract.CallGeometry(1, 1, 12, reason="a video latent")}, "a video latent"),
    ({"settings": settings_mod.ToMASettings(min_tokens=65)}, "fewer than min_tokens=65 image tokens"),
    ({"settings": settings_mod.ToMASettings(min_tokens=64)}, None),
    ({"settings": settings_mod.ToMASettings(min_tokens="auto"), "auto": lambda: "predicted slower"}, "predicted slower"),
    ({"settings": settings_mod.ToMASettings(min_tokens="auto")}, None),
])
def test_each_rule(case: dict, expected: str | None) -> None:
    assert veto(**case) == expected


def test_auto_is_asked_only_when_every_other_rule_lets_the_call_merge() -> None:
    auto = settings_mod.ToMASettings(min_tokens="auto")
    asked: list[bool] = []
    assert veto(auto, decision=core.StepDecision(3, False, False, None), auto=lambda: "x", asked=asked) == "outside the sigma window"
    assert not asked
    assert veto(auto, auto=lambda: "x", asked=asked) == "x" and asked == [True]
    assert veto(settings_mod.ToMASettings(min_tokens=0), auto=lambda: "x", asked=asked) is None and asked == [True]


CLOSE = prediction.CostProfile((cost.BlockCost(64, 4, joint=False, merged=True, head=32), cost.BlockCost(64, 2, joint=False, head=32)), 64, 0.5, 256)
"""The trained Wan fixture at scope block, tile 8 x 4 frames: 2,304 tokens predicted 1.24x, within the model's error of 1.05x."""
SURE = prediction.CostProfile((cost.BlockCost(64, 4, merged=True),), 64, 0.5)
"""Width 64: 64 tokens predicted 0.85x, the whole range below 1.05x."""
VIDEO, SMALL = contract.CallGeometry(48, 48, 5), contract.CallGeometry(8, 8, 5)


def test_auto_asks_the_timer_only_where_the_prediction_is_close_and_not_under_compile():
    timer = gain.CallTimer()
    assert gain.auto_call_veto(CLOSE, timer, VIDEO, "cpu", 1, measure=True) == gain.AUTO_TIMING
    assert list(timer.verdicts) == [(1, 2304, 5)]
    untouched = gain.CallTimer()
    assert gain.auto_call_veto(CLOSE, untouched, VIDEO, "cpu", 1, measure=False) is None  # torch.compile: predicted 1.24x merges
    assert gain.auto_call_veto(SURE, untouched, SMALL, "cpu", 2, measure=True) == SURE.auto_veto(SMALL, "cpu", 2)
    assert gain.auto_call_veto(None, untouched, SMALL, "cpu", 2, measure=False) is None  # no cost model: merge
    assert not untouched.verdicts
    assert gain.auto_call_veto(None, untouched, SMALL, "cpu", 2, measure=True) == gain.AUTO_TIMING  # nor a prediction: measure
