"""When to merge and when to re-select destinations, from sigmas rather than call counts.

The reference implementation counted block calls and desynchronised under CFG, Heun and img2img
(research/toma_algorithm.md §7.4). Here the step is derived from the current sigma and the run's
sigma schedule, so any number of model evaluations per step gives the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepDecision:
    """What to do at one model evaluation.

    step: index into the run's schedule; merge: run blocks on merged tokens; reselect: this step
    starts a new selection epoch; epoch: which plan generation applies (None when not merging),
    so evaluations of one step (Heun, DPM2, CFG run separately) share one plan.
    """

    step: int
    merge: bool
    reselect: bool
    epoch: int | None


@dataclass(frozen=True)
class SigmaWindow:
    """Merging is active while end_sigma < sigma <= start_sigma."""

    start_sigma: float
    end_sigma: float

    def contains(self, sigma: float) -> bool:
        return self.end_sigma < sigma <= self.start_sigma


@dataclass(frozen=True)
class MergeSchedule:
    """The user's schedule: merge from start_percent to end_percent of the run (in sigma percent,
    as ComfyUI's other patches), re-selecting destinations every `recompute_every` merged steps."""

    start_percent: float = 0.0
    end_percent: float = 1.0
    recompute_every: int = 1

    def __post_init__(self) -> None:
        for name in ("start_percent", "end_percent"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} is outside [0, 1] (a fraction of the sampling run)")
        if int(self.recompute_every) != self.recompute_every or self.recompute_every < 1:
            raise ValueError(f"recompute_every={self.recompute_every} must be an integer >= 1 (steps)")

    def window(self, percent_to_sigma: Callable[[float], float]) -> SigmaWindow:
        """Sigma bounds of the merge window; an empty window when end_percent <= start_percent."""
        if self.end_percent <= self.start_percent:
            return SigmaWindow(0.0, float("inf"))
        return SigmaWindow(float(percent_to_sigma(self.start_percent)), float(percent_to_sigma(self.end_percent)))

    def decide(self, sigma: float, sample_sigmas: Sequence[float] | torch.Tensor, window: SigmaWindow) -> StepDecision:
        """Decide for the evaluation at `sigma` in a run whose schedule is `sample_sigmas`."""
        sigmas = [float(s) for s in sample_sigmas]
        step = step_index(sigma, sigmas)
        first = next((i for i, s in enumerate(sigmas[:-1] or sigmas) if window.contains(s)), None)
        if not window.contains(sigma) or first is None:
            return StepDecision(step, False, False, None)
        offset = max(0, step - first)
        return StepDecision(step, True, offset % self.recompute_every == 0, offset // self.recompute_every)


def step_index(sigma: float, sample_sigmas: Sequence[float]) -> int:
    """Largest i with sample_sigmas[i] >= sigma (covers a sampler's intermediate evaluations)."""
    below = [i for i, s in enumerate(sample_sigmas) if s >= sigma]
    return below[-1] if below else 0
