"""A run's memory of its plans' destinations (Advanced inputs `destinations`, `destination_penalty`):
the planning block's output tokens at the last model call, and how often each token was chosen.

"output_similarity" (after DiTo, arXiv 2605.22011): a plan built in one model call chooses and
assigns its destinations on the output of the block that planned at the previous call of the same
plan key and batch composition (the first merged block at that grid: CallContext.note_output), in
place of the block's input; the first merged call of a run, a grid or batch whose stored output
does not have the plan's (B, N) shape, and runs under torch.compile plan from the input as before.
The penalty (toma_core/destinations.py) counts, per key and token, the earlier plans of the run
that chose it. Lives in RunState, so it is fresh for every sampling run and never outlives one; keys
carry the batch composition (cond and uncond, other prompts), so samples never share it.
Layouts: stored outputs (B, N, C) fp32 (LayerNorm'd as the plan's input features are), counts (B, N).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...toma_core import FACILITY, MergePlan, count_destinations
from .stats import RunStats


class DestinationMemory:
    """Per-run stored outputs and destination counts, by (plan key, B, composition)."""

    def __init__(self, stats: RunStats) -> None:
        self.outputs: dict[tuple, torch.Tensor] = {}
        self.counts: dict[tuple, tuple[torch.Tensor, int]] = {}
        self.stats = stats
        """Where plans built from a stored output are counted (RunStats.plans_from_outputs)."""
        self.lock = threading.Lock()

    def note_output(self, key: tuple, output: torch.Tensor) -> None:
        """Keep the planning block's image output (B, N, C) of this call for the next plan of `key`
        (a LayerNorm'd fp32 copy: a later block may write into the tensor in place)."""
        features = F.layer_norm(output.detach().float(), (output.shape[-1],))
        with self.lock:
            self.outputs[key] = features

    def plan_inputs(self, key: tuple, rule: str, penalty: float, tokens: int,
                    features: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """The features (B, N, C) a plan of `key` over `tokens` image tokens is built from, and the
        make_plan options of the penalty ({} with none: the plan is then the facility rule's own)."""
        batch = key[1]
        with self.lock:
            stored = self.outputs.get(key) if rule != FACILITY else None
            usable = stored is not None and tuple(stored.shape[:2]) == (batch, tokens)
            if usable:
                self.stats.plans_from_outputs = (self.stats.plans_from_outputs or 0) + 1
            counted = self.counts.get(key) if penalty > 0 else None
        options = {}
        if counted is not None and tuple(counted[0].shape) == (batch, tokens):
            options = {"frequency": counted[0] / counted[1], "penalty": penalty}
        return (stored if usable else features()), options

    def count(self, key: tuple, plan: MergePlan) -> None:
        """Add the destinations of a plan just built for `key` to its counts."""
        with self.lock:
            counts, plans = self.counts.get(key, (None, 0))
            if counts is not None and tuple(counts.shape) != (plan.batch, plan.num_tokens):
                counts, plans = None, 0
            self.counts[key] = (count_destinations(counts, plan.dst_index, plan.num_tokens), plans + 1)
