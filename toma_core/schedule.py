"""When to merge and when to re-select destinations, from sigmas rather than call counts.

Counting block calls desynchronises as soon as a step makes more than one model evaluation (CFG
batches run as separate calls, Heun's corrector, DPM2's midpoint) or a run starts mid-schedule
(img2img). Here the step is derived from the current sigma and the run's sigma schedule, so any
number of model evaluations per step gives the same answers.
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
    so evaluations of one step (DPM2 midpoints, CFG run separately) share one plan. skipped: inside
    the sigma window but not a merge step (merge_every > 1), so the evaluation runs unmerged.
    """

    step: int
    merge: bool
    reselect: bool
    epoch: int | None
    skipped: bool = False


@dataclass(frozen=True)
class SigmaWindow:
    """Merging is active while end_sigma < sigma <= start_sigma."""

    start_sigma: float
    end_sigma: float

    def contains(self, sigma: float) -> bool:
        return self.end_sigma < sigma <= self.start_sigma


@dataclass(frozen=True)
class MergeSchedule:
    """The user's schedule: which sampling steps merge and when destinations are re-selected.

    start_percent / end_percent: merge only inside this part of the run (sigma percent, as
    ComfyUI's other patches).
    merge_every: of the sampling steps inside the window, the first merges, then every
    merge_every-th after it; the steps between run unmerged (1 = every step). The paper's Flux
    configuration merges steps 0, 3, 6, ... (merge_every=3).
    recompute_every: counted in sampling steps, like merge_every, not in merged steps. A plan is
    reused only by merged steps fewer than recompute_every steps after the step that selected
    it: the tokens keep changing on the unmerged steps between, so a plan's staleness grows with
    sampling steps, merged or not. Hence with merge_every >= recompute_every every merged step
    re-selects; with merge_every=3 and recompute_every=6 the steps 0 and 3 share one selection,
    6 and 9 the next.

    Every value is a function of the evaluation's sigma and the run's schedule, so all
    evaluations at one noise level (CFG passes batched or separate, DPM2-style midpoints) share
    one decision. Heun-style samplers evaluate step i's corrector at sigma i+1, which is also
    step i+1's sigma; that evaluation follows step i+1's decision (from the sigma alone the two
    cannot be told apart).
    """

    start_percent: float = 0.0
    end_percent: float = 1.0
    recompute_every: int = 1
    merge_every: int = 1

    def __post_init__(self) -> None:
        for name in ("start_percent", "end_percent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r} is outside [0, 1] (a fraction of the sampling run)")
        for name in ("recompute_every", "merge_every"):
            object.__setattr__(self, name, _whole_steps(name, getattr(self, name)))

    @property
    def merged_steps_per_plan(self) -> int:
        """Merged steps that share one selection: those fewer than recompute_every sampling steps
        after the step that selected it, ceil(recompute_every / merge_every)."""
        return -(-self.recompute_every // self.merge_every)

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
        if offset % self.merge_every:
            return StepDecision(step, False, False, None, skipped=True)
        merged = offset // self.merge_every
        per_plan = self.merged_steps_per_plan
        return StepDecision(step, True, merged % per_plan == 0, merged // per_plan)


def _whole_steps(name: str, value: object) -> int:
    """`value` as an int >= 1, or a ValueError naming it (floats only when whole, never bools)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1 (sampling steps; 1 = every step)")
    return int(value)


def step_index(sigma: float, sample_sigmas: Sequence[float]) -> int:
    """Largest i with sample_sigmas[i] >= sigma (covers a sampler's intermediate evaluations)."""
    below = [i for i, s in enumerate(sample_sigmas) if s >= sigma]
    return below[-1] if below else 0
