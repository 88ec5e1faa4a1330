"""ToMA (Token Merge with Attention, Lu et al., ICML 2025, arXiv 2509.10918) as a torch + einops
library: tile-wise facility-location destinations, soft merge N -> D, transpose unmerge D -> N,
and a sigma-based reuse schedule. Never imports ComfyUI.

Axis vocabulary: B batch, N image tokens, D kept tokens, C channels, T text tokens, G tiles,
n tokens per tile, k destinations per tile.
"""

from __future__ import annotations

from .checks import RATIO_RANGE, check_plan_args, check_ratio
from .destinations import DESTINATIONS, FACILITY, PENALTY_RANGE, check_destinations, count_destinations
from .facility import facility_location, greedy_with_gains
from .plan import BUDGETS, UNMERGES, MergePlan, TiledMergePlan, make_plan
from .schedule import MergeSchedule, SigmaWindow, StepDecision, step_index
from .similarity import SIMILARITIES
from .tiling import TileGrid, kept_per_tile

__all__ = [
    "BUDGETS",
    "DESTINATIONS",
    "FACILITY",
    "PENALTY_RANGE",
    "RATIO_RANGE",
    "SIMILARITIES",
    "UNMERGES",
    "MergePlan",
    "MergeSchedule",
    "SigmaWindow",
    "StepDecision",
    "TileGrid",
    "TiledMergePlan",
    "check_destinations",
    "check_plan_args",
    "check_ratio",
    "count_destinations",
    "facility_location",
    "greedy_with_gains",
    "kept_per_tile",
    "make_plan",
    "step_index",
]
