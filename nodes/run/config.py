"""The fixed description of one ToMA patch (`ToMAConfig`), made by patching.patch_model when the
node runs and read by the per-run state (runtime.py) and the run line's record (stats.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..contract import FamilyAdapter
from ..settings import ToMASettings
from .prediction import CostProfile


@dataclass(frozen=True)
class ToMAConfig:
    """Immutable description of one ToMA patch. cost: the cost model's view of the patched model
    (min_tokens "auto" and the predicted gains; prediction.py); None when there is none."""

    settings: ToMASettings
    adapter: FamilyAdapter
    cost: CostProfile | None = None
    kernel_reader: Callable[[dict, str], tuple] | None = None
    """(transformer_options, device type) -> (Kernel | None, name): the attention kernel a model call
    runs (nodes/machinery/kernel_choice.run_kernel, handed in by the node layer), read eagerly per call
    for scope keys_values (its merged form depends on it) outside any compiled region, and by min_tokens
    "auto", whose prediction prices that kernel (None: the device's default, prediction.default_kernel)."""

    @property
    def off_reason(self) -> str:
        """Why every call runs unmerged when the settings merge no token (ratio 0, or a ratio the
        tile rounds to keeping every token)."""
        s = self.settings
        return "ratio 0 (nothing to merge)" if s.ratio == 0 else f"ratio {s.ratio:g} at tile_size {s.tile_size} keeps every token"
