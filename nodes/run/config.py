"""The fixed description of one ToMA patch (`ToMAConfig`), made by patching.patch_model when the
node runs and read by the per-run state (runtime.py) and the run line's record (stats.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...toma_core.kernels import Kernel

from ..contract import FamilyAdapter
from ..settings import ToMASettings
from .prediction import CostProfile


@dataclass(frozen=True)
class ToMAConfig:
    """Immutable description of one ToMA patch. cost: the cost model's view of the patched model
    (min_tokens "auto" and the predicted gains; prediction.py); None when there is none. kernel_of:
    (transformer_options, device type) -> (the attention kernel a call runs, its name)
    (machinery/kernel_choice.py run_kernel, handed down by patching.py); None: priced as the device's default."""

    settings: ToMASettings
    adapter: FamilyAdapter
    cost: CostProfile | None = None
    kernel_of: Callable[[dict, str], tuple[Kernel | None, str]] | None = None

    @property
    def off_reason(self) -> str:
        """Why every call runs unmerged when the settings merge no token (ratio 0, or a ratio the
        tile rounds to keeping every token)."""
        s = self.settings
        return "ratio 0 (nothing to merge)" if s.ratio == 0 else f"ratio {s.ratio:g} at tile_size {s.tile_size} keeps every token"
