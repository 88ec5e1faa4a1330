"""Why merging keys after rope is sound, checked on every family's tiny ComfyUI model
(harness/keys_values_probe.py; docs/keys_values.md "Roped keys").

At the first self-attention scope keys_values merges, with the plan that run used: the pack's kernel
inputs (every query, the merged keys and values, the log-mass in one extra q / k channel) give the
attention softmax(q K_m^T / sqrt(e) + log m) V_m, and that attention is closer to the exact one than
the same plan merging the queries too (the block and attention scopes' side, unmerged to N): keys
merged after rope keep every query's own rotation, and a merged key's logit is the mean of its
cluster's own roped logits."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

NEWER = {"Flux.2": "Flux2", "LongCat-Image": "LongCatImage", "Z-Image": "ZImage", "Kandinsky 5": "Kandinsky5"}
"""Cases whose comfy.supported_models class came after ComfyUI 0.3.64."""


@pytest.fixture(scope="module")
def probe(comfy: Any) -> Any:
    from harness import keys_values_probe

    return keys_values_probe


@pytest.mark.parametrize("name", [
    "Flux", "Flux.2", "LongCat-Image", "SD3", "Qwen-Image", "Lumina2", "Z-Image", "HiDream", "HunyuanVideo", "Wan",
    "Kandinsky 5", "SDXL", "SD1.5",
])
def test_keys_values_beat_merging_the_queries_too(probe: Any, name: str) -> None:
    result = probe.probe(probe.CASES[name])
    if result is None:
        pytest.skip(f"this ComfyUI has no comfy.supported_models.{NEWER[name]} (it came after ComfyUI 0.3.64)")
    assert result.kept < result.tokens
    assert result.kernel < 1e-5, result
    assert 0 < result.keys_values < result.queries_too, result
