"""The cost model per attention kernel (toma_core/cost.py over toma_core/kernels.py; nodes/run/prediction.py):
the keys/values channel priced at the kernel's bucket, the head-keeping forms at their own head, a
faster kernel leaving merging less to gain, and `scope` / `min_tokens` auto deciding per kernel."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.pack import pack_module

cost = pack_module("toma_core.cost")
prediction = pack_module("nodes.run.prediction")
CHANNEL, BlockCost, call_speedup, head_cost, padded_head = cost.CHANNEL, cost.BlockCost, cost.call_speedup, cost.head_cost, cost.padded_head
LINEAR_UNET = pack_module("toma_core.cost_constants").LINEAR_UNET
KERNELS, MATMUL = pack_module("toma_core.kernels").KERNELS, pack_module("toma_core.kernels").MATMUL
CallGeometry = pack_module("nodes.contract").CallGeometry
AUTO_MIN_SPEEDUP, KV_MIN_SPEEDUP, CostProfile = prediction.AUTO_MIN_SPEEDUP, prediction.KV_MIN_SPEEDUP, prediction.CostProfile
default_kernel, on_kernel = prediction.default_kernel, prediction.on_kernel

WAN_720P = 21 * 45 * 80
"""Wan 2.2 14B's image tokens at 720p x 81 frames."""


def wan14b(kernel: str, form: str = CHANNEL, scope: str = "keys_values") -> tuple[BlockCost, ...]:
    """Wan 2.2 14B (width 5120, head 128, text by cross-attention): blocks 5-29 merged of 40, as its templates run."""
    k = KERNELS[kernel]
    return (BlockCost(5120, 25, joint=False, merged=True, scope=scope, kernel=k, form=form),
            BlockCost(5120, 15, joint=False, kernel=k))


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("head", [64, 128])
def test_the_channel_costs_the_kernels_bucket_and_the_other_forms_their_head(name: str, head: int) -> None:
    kernel = KERNELS[name]
    block = BlockCost(3072, head=head, kernel=kernel)
    ratio = kernel.cost_ratio(head, padded_head(head))
    assert head_cost(block) == (1.0 if ratio is None else ratio)  # refused: keys_values.py retries at the head
    if not kernel.buckets:
        assert head_cost(block) == padded_head(head) / head
    for form in ("equal_mass", "plain"):
        assert head_cost(replace(block, form=form)) == 1.0


@pytest.mark.parametrize("tokens", [4096, 32_760, WAN_720P])
def test_a_dearer_bucket_costs_keys_values_its_gain(tokens: int) -> None:
    for name in ("sdpa", "flash2.8", "flash3"):
        channel = call_speedup(wan14b(name), tokens, 0, 0.5, "cuda", tile_tokens=256)
        kept_head = call_speedup(wan14b(name, "equal_mass"), tokens, 0, 0.5, "cuda", tile_tokens=256)
        assert kept_head > channel > 0


@pytest.mark.parametrize("scope", ["block", "keys_values"])
def test_a_faster_kernel_leaves_merging_less_to_gain(scope: str) -> None:
    by_speed = sorted(("sdpa", "flash3", "sage1", "sage2"), key=lambda n: KERNELS[n].speed)
    gains = [call_speedup(wan14b(n, "plain", scope), WAN_720P, 0, 0.5, "cuda", tile_tokens=256) for n in by_speed]
    assert all(1.0 < later <= earlier for earlier, later in zip(gains, gains[1:]))


def test_each_call_is_priced_in_the_form_its_kernel_runs() -> None:
    wan, flux = BlockCost(5120, joint=False, merged=True, scope="keys_values"), BlockCost(3072, merged=True, scope="keys_values")
    unet = BlockCost(640, linear=LINEAR_UNET, joint=False, merged=True, scope="keys_values", head=64)
    assert default_kernel("cuda") is KERNELS["sdpa"] and default_kernel("cpu") is KERNELS[MATMUL]
    assert [b.form for b in on_kernel((wan, flux, unet), None, "cpu")] == [CHANNEL] * 3
    assert [b.form for b in on_kernel((wan, flux, unet), KERNELS["sage2"], "cuda")] == ["equal_mass", "plain", "equal_mass"]
    assert [b.form for b in on_kernel((wan, flux, unet), None, "cuda")] == ["equal_mass", "plain", "equal_mass"]
    assert all(b.kernel is KERNELS["flash3"] for b in on_kernel((wan, flux), KERNELS["flash3"], "cuda"))


def test_scope_auto_keeps_keys_values_only_where_it_pays_on_the_kernel() -> None:
    profile = CostProfile(wan14b(MATMUL), 5120, 0.5, tile_tokens=256)
    decisions = {name: profile.keys_values_pays(KERNELS[name], "cuda") for name in ("sdpa", "flash3", "sage1", "sage2")}
    for pays, predicted in decisions.values():
        assert pays == (predicted >= KV_MIN_SPEEDUP)
    assert decisions["sdpa"][1] > decisions["flash3"][1] > decisions["sage1"][1] > decisions["sage2"][1]
    assert decisions["sdpa"][0] and not decisions["sage2"][0]  # the fastest kernel leaves the block merge to run


def test_min_tokens_auto_decides_per_kernel() -> None:
    profile = CostProfile(wan14b(MATMUL), 5120, 0.5, tile_tokens=256)
    tokens = next(n for n in range(1024, WAN_720P, 512)
                  if profile.speedup(n, 0, "cuda", 1, KERNELS["sdpa"]) >= AUTO_MIN_SPEEDUP > profile.speedup(n, 0, "cuda", 1, KERNELS["sage2"]))
    geometry = CallGeometry(1, tokens, text_len=0)
    assert profile.auto_veto(geometry, "cuda", 1, KERNELS["sdpa"]) is None
    reason = profile.auto_veto(geometry, "cuda", 1, KERNELS["sage2"])
    assert reason is not None and "sage2" in reason
    assert profile.predict(tokens, 0, "cuda", 1, KERNELS["sage2"]) is profile.predict(tokens, 0, "cuda", 1, KERNELS["sage2"])
