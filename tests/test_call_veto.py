"""The one decision of a model call (nodes/run/wrappers.py call_veto): each rule, in its order, from
its arguments alone; `auto` is asked only for a call every other rule lets merge."""

from __future__ import annotations

import pytest

from harness.pack import pack_module

wrappers = pack_module("nodes.run.wrappers")
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
