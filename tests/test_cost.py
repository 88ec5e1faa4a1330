"""The cost model (toma_core/cost.py): its calibration points, within the errors its range states, and
the directions a prediction must move in (more tokens, wider blocks, fewer merged blocks,
attention-only merging, keys/values merging, launch-bound GPUs)."""

from __future__ import annotations

import pytest

from harness.pack import pack_module

cost = pack_module("toma_core.cost")
constants = pack_module("toma_core.cost_constants")

FLUX_DEV = {"width": 3072, "count": 57, "merged": True}
"""Flux.1-dev: 19 double + 38 single blocks of width 3072, every one merged."""


def flux(tokens: int, text: int = 512, kept: float = 0.5, device: str = "cpu", **kwargs) -> float:
    return cost.call_speedup([cost.BlockCost(**(FLUX_DEV | kwargs))], tokens, text, kept, device)


@pytest.mark.parametrize("point", constants.CALIBRATION, ids=lambda p: f"{p['block']}-C{p['width']}-N{p['tokens']}-T{p['text']}")
def test_reproduces_its_calibration_measurements(point):
    unet = point["block"] == "unet"
    block = cost.BlockCost(point["width"], point.get("count", 1), linear=constants.LINEAR_UNET if unet else constants.LINEAR_DIT,
                           joint=not unet, merged=True)
    predicted = cost.call_speedup([block], point["tokens"], point["text"], 0.5, "cpu")
    assert predicted == pytest.approx(point["measured"], rel=constants.BLOCK_ERROR)


def test_nothing_kept_away_is_no_gain():
    assert flux(4096, kept=1.0) == 1.0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gain_grows_with_tokens_and_with_the_share_merged_away(device):
    by_tokens = [flux(n, device=device) for n in (256, 1024, 4096, 16384)]
    assert by_tokens == sorted(by_tokens) and by_tokens[-1] > 2
    by_ratio = [flux(4096, kept=k, device=device) for k in (0.75, 0.5, 0.25)]
    assert by_ratio == sorted(by_ratio)


def test_unmerged_blocks_and_attention_only_merging_dilute_the_gain():
    every = flux(4096)
    half = cost.call_speedup([cost.BlockCost(3072, 28, merged=True), cost.BlockCost(3072, 29)], 4096, 512, 0.5)
    attention_only = flux(4096, scope="attention")
    assert 1.0 < half < every and 1.0 < attention_only < every


def test_tiny_width_is_predicted_to_lose_on_a_gpu():
    tiny = [cost.BlockCost(64, 4, merged=True)]
    assert cost.call_speedup(tiny, 256, 256, 0.5, "cuda") < 1.0 < cost.call_speedup(tiny, 256, 256, 0.5, "cpu")


def test_a_gpu_launch_makes_small_calls_pay_less_than_on_a_cpu_and_a_batch_pays_more():
    small = [cost.BlockCost(320, 16, merged=True, linear=constants.LINEAR_UNET, joint=False)]
    on_gpu = cost.call_speedup(small, 1024, 0, 0.5, "cuda")
    assert on_gpu < cost.call_speedup(small, 1024, 0, 0.5, "cpu")
    assert on_gpu < 1.0 < cost.call_speedup(small, 1024, 0, 0.5, "cuda", batch=64)
    assert cost.launch_cost("mps") == cost.launch_cost("cuda")


def test_cross_attention_text_does_not_count_in_self_attention():
    joint = cost.BlockCost(1536, 30, merged=True)
    cross = cost.BlockCost(1536, 30, merged=True, joint=False)
    with_text = cost.call_speedup([joint], 4096, 4096, 0.5)
    assert cost.call_speedup([cross], 4096, 4096, 0.5) == pytest.approx(cost.call_speedup([cross], 4096, 0, 0.5))
    assert with_text < cost.call_speedup([cross], 4096, 4096, 0.5)  # text tokens stay unmerged in joint attention


@pytest.mark.parametrize("point", constants.PLAN_CALIBRATION, ids=lambda p: "x".join(map(str, p["grid"])) + f"-C{p['channels']}-tile{p['tile']}x{p['frames']}")
def test_plan_cost_follows_its_measurements_at_each_tile(point):
    """plan_flops against make_plan's measured ms (C 256, ratio 0.5), within a factor PLAN_ERROR (a
    noisy shared CPU: repeats spread up to 2.5x)."""
    frames, height, width = point["grid"]
    flops = cost.plan_flops(frames * height * width, point["channels"], point["tile"] ** 2 * point["frames"], 0.5, "cpu")
    predicted_ms = flops / constants.LAUNCH["cpu"] * constants.LAUNCH_SECONDS_CPU * 1000
    assert 1 / constants.PLAN_ERROR < predicted_ms / point["ms"] < constants.PLAN_ERROR


def test_plan_cost_grows_with_the_tiles_token_count():
    """Facility location's greedy does k ~ n iterations over n x n similarities per tile: per image
    token its work grows as n^2, so four times the tile's tokens cost the plan about 16 times more."""
    per_tile = [cost.plan_flops(4096, 64, n, 0.5, "cpu") for n in (16, 64, 256, 1024)]
    assert per_tile == sorted(per_tile)
    assert per_tile[3] / per_tile[2] > 8


def test_a_narrow_video_model_with_wide_tiles_is_predicted_to_gain_less():
    """Width 256, 1680 tokens (a Wan-shaped test model): tile 8 x 4 frames predicts far less than tile 4,
    and tile 16 x 4 frames a loss, which min_tokens auto then refuses; at a real width (Wan 1.3B,
    C 1536, 30 blocks) the plan is small beside the blocks and merging still pays."""
    narrow = [cost.BlockCost(256, 3, joint=False, merged=True)]
    by_tile = [cost.call_speedup(narrow, 1680, 0, 0.5, "cpu", tile_tokens=n) for n in (16, 256, 1024)]
    assert by_tile == sorted(by_tile, reverse=True) and by_tile[2] < 1.0 < by_tile[0]
    assert by_tile[1] < 0.75 * by_tile[0]
    wide = [cost.BlockCost(1536, 30, joint=False, merged=True)]
    assert cost.call_speedup(wide, 32760, 0, 0.5, "cpu", tile_tokens=256) > 2.0


NARROW_VIDEO = [cost.BlockCost(256, 3, joint=False, merged=True), cost.BlockCost(256, 1, joint=False)]
"""A Wan-shaped test model: width 256, 3 of its 4 blocks merged."""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("blocks, tokens, tile", [
    ([cost.BlockCost(**FLUX_DEV)], 4096, 16), ([cost.BlockCost(**FLUX_DEV)], 256, 64), (NARROW_VIDEO, 1680, 256), (NARROW_VIDEO, 1680, 16),
])
def test_the_range_holds_the_prediction(device, blocks, tokens, tile):
    low, high = cost.call_speedup_range(blocks, tokens, 512, 0.5, device, tile_tokens=tile)
    assert low < cost.call_speedup(blocks, tokens, 512, 0.5, device, tile_tokens=tile) < high
    assert (low == 0.0) is (device not in constants.CALIBRATED)


def test_the_range_widens_with_the_plans_share():
    """The plan's error (a factor 2.5) is wider than the blocks' (12 %): the larger its share of a call,
    the wider the range; where nothing merges the prediction is exact."""
    def width(tile: int) -> float:
        low, high = cost.call_speedup_range(NARROW_VIDEO, 1680, 0, 0.5, tile_tokens=tile)
        return high / low
    assert width(16) < width(64) < width(256)
    assert cost.call_speedup_range(NARROW_VIDEO, 1680, 0, 1.0) == (1.0, 1.0)
    parts = cost.call_parts(NARROW_VIDEO, 1680, 0, 0.5, tile_tokens=256)
    assert parts.total == cost.call_flops(NARROW_VIDEO, 1680, 0, 0.5, tile_tokens=256) and min(parts.plain, parts.merged, parts.plan) > 0


WAN_14B = {"width": 5120, "count": 40, "joint": False, "merged": True}
"""Wan 2.1 / 2.2 14B: 40 blocks of width 5120 (40 heads of 128), text by cross-attention."""


def wan(tokens: int, kept: float = 0.25, scope: str = "keys_values", device: str = "cpu", **kwargs) -> float:
    return cost.call_speedup([cost.BlockCost(**(WAN_14B | {"scope": scope} | kwargs))], tokens, 0, kept, device, tile_tokens=256)


def test_keys_values_shrinks_only_attention():
    """Every token keeps its per-token layers: the gain is below the block merge's at the same ratio,
    and below 1 / (the linear layers' share of the unmerged call), however many keys merge away."""
    block = cost.BlockCost(5120, 40, joint=False)
    unmerged = cost.block_flops(block, 75600, 0)
    linear_share = block.linear * 75600 * 5120 ** 2 / unmerged
    for kept in (0.5, 0.25, 0.1):
        assert 1.0 < wan(75600, kept) < wan(75600, kept, scope="block")
        assert wan(75600, kept) < 1.0 / linear_share
    assert [wan(75600, k) for k in (0.5, 0.25, 0.1)] == sorted(wan(75600, k) for k in (0.5, 0.25, 0.1))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_keys_values_gains_where_attention_dominates(device):
    """Attention's share of a block grows with N / C: Wan 14B at 1280 x 720 x 81 (75,600 tokens)
    gains more than at 832 x 480 (32,760), and Flux.1-dev at 1024 px (4,096 tokens, width 3072)
    gains less than at 2048 px."""
    assert wan(75600, device=device) > wan(32760, device=device) > wan(4096, device=device)
    flux_kv = [flux(n, kept=0.25, device=device, scope="keys_values") for n in (4096, 16384)]
    assert flux_kv == sorted(flux_kv) and flux_kv[0] < wan(75600, device=device)


def test_the_log_mass_channel_pads_the_head():
    """e' = e + 1 rounded up to 8; the padded channels make the attention dearer: head 64 pads to 72
    (12.5 %), head 63 to 64 (1.6 %), so head 64 gains less (their softmax per score, SCORE / e, is
    within 2 % of each other)."""
    assert [cost.padded_head(e) for e in (40, 64, 127, 128)] == [48, 72, 128, 136]
    assert wan(75600, head=64) < wan(75600, head=63)


def test_keys_values_keeps_text_keys_exact():
    """Joint text keys stay in the attention: the same block with text joining it gains less."""
    joint = cost.BlockCost(3072, 57, merged=True, scope="keys_values")
    cross = cost.BlockCost(3072, 57, merged=True, scope="keys_values", joint=False)
    assert cost.call_speedup([joint], 16384, 4096, 0.25) < cost.call_speedup([cross], 16384, 4096, 0.25)


@pytest.mark.parametrize("point", constants.KV_CALIBRATION, ids=lambda p: "x".join(map(str, p["grid"])) + f"-C{p['width']}-r{p['ratio']}")
def test_keys_values_merge_cost_follows_its_measurements(point):
    """keys_values_flops' K / V merge term (no attention: a block with attention off and no linear
    work) against the override's measured ms at real widths, within a factor 2 (a shared CPU)."""
    frames, height, width = point["grid"]
    tokens = frames * height * width
    block = cost.BlockCost(point["width"], linear=0.0, attention=False, joint=False, merged=True, scope="keys_values")
    tile = 64 * point["tile_frames"]
    flops = cost.keys_values_flops(block, tokens, 0, 1.0 - point["ratio"], tile)
    predicted_ms = flops / constants.LAUNCH["cpu"] * constants.LAUNCH_SECONDS_CPU * 1000
    assert 1 / 2 < predicted_ms / point["ms"] < 2


@pytest.mark.parametrize("point", constants.CALL_CALIBRATION, ids=lambda p: f"{p['shape']}-{p['scope']}")
def test_small_model_calls_follow_their_measurements(point):
    """The whole-call ratios LAUNCH["cpu"], CALL_OPS and SCORE are fitted to (tiny widths, narrow heads,
    wide plan tiles): every prediction within 15 % of each of its two measurements."""
    merged, plain = point["blocks"]
    blocks = [cost.BlockCost(point["width"], merged, joint=point["shape"] == "flux", merged=True, scope=point["scope"], head=point["head"]),
              cost.BlockCost(point["width"], plain, joint=point["shape"] == "flux", head=point["head"])]
    predicted = cost.call_speedup(blocks, point["tokens"], point["others"], 0.5, "cpu", point["batch"], point["tile_tokens"])
    for measured in point["measured"]:
        assert predicted == pytest.approx(measured, rel=0.15)
