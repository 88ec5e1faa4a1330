"""Argument checks shared by the plan builders (plan.py, video.py): every illegal value raises a
ValueError that names it and the allowed range."""

from __future__ import annotations

import math

RATIO_RANGE = (0.0, 0.95)
"""Allowed share of tokens merged away, the one range of the library and the nodes' ratio widget:
0 keeps every token (an identity plan); above 0.95 a tile keeps at most one token in twenty, and
every tile of 4 x 4 (16 tokens) or less already keeps a single token from 0.95 on."""


def check_ratio(ratio: float) -> None:
    """Reject a ratio outside RATIO_RANGE (or not a number) with a ValueError naming it and the range."""
    low, high = RATIO_RANGE
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not low <= ratio <= high:
        raise ValueError(f"ratio={ratio!r} is outside [{low:g}, {high:g}] (the share of image tokens merged away)")


def check_plan_args(height: int, width: int, ratio: float, tile_size: int, temperature: float) -> None:
    """Reject illegal plan settings with a ValueError that names the value and the allowed range."""
    check_ratio(ratio)
    if not whole(tile_size, 1):
        raise ValueError(f"tile_size={tile_size} must be an integer >= 1 (tokens per tile side)")
    if not (whole(height, 1) and whole(width, 1)):
        raise ValueError(f"grid {height}x{width} is empty; height and width must be integers >= 1")
    if not 0 <= temperature < math.inf:
        raise ValueError(f"temperature={temperature} must be >= 0 and finite (0 = hard nearest-destination assignment)")


def whole(value: object, low: int) -> bool:
    """True for an integer (int, SymInt under torch.compile, numpy int) or a float without fraction
    that is >= low; never for NaN, inf, a bool or a non-number."""
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and value >= low
    return not isinstance(value, bool) and hasattr(value, "__index__") and value >= low
