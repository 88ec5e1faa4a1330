"""The scope study's report (bench/quality/scope_report.py) and its pricing's block mapping
(bench/quality/real_speed.py): which method a row stands for, fewer steps interpolated at a
predicted speed-up, each method's best row at least as fast, and fixture block lists mapped to the
real depth by position. Pure Python on hand-made rows; no ComfyUI, no sampling."""

from __future__ import annotations

import math

import pytest

from bench.quality import real_speed, scope_report

KV = {"node": "ToMAPatchAdvanced", "inputs": {"ratio": 0.5, "scope": "keys_values"}}
KV_NO_MASS = {"node": "ToMAPatchAdvanced", "inputs": {"ratio": 0.5, "scope": "keys_values", "key_mass": False}}
BLOCK = {"node": "ToMAPatch", "inputs": {"ratio": 0.5}}
IDENTITY = {"node": "ToMAPatchAdvanced", "inputs": {"ratio": 0.0, "scope": "keys_values"}}
CACHE = {"node": "EasyCache", "inputs": {"reuse_threshold": 0.2}}


def point(label: str, chain: list, psnr: float, steps: int = 20, predicted: float = 1.0) -> scope_report.Point:
    return scope_report.Point("flux", 20, label, "g", steps, chain, steps, psnr, 0.9, psnr, predicted={"T": predicted})


@pytest.mark.parametrize(("chain", "steps", "method"), [
    ([KV], 20, "keys/values"), ([KV_NO_MASS], 20, "keys/values, no log-mass"), ([BLOCK], 20, "block merge"),
    ([KV, CACHE], 20, "stack"), ([CACHE], 20, "EasyCache"), ([], 12, "fewer steps"), ([], 20, None), ([IDENTITY], 20, None),
])
def test_each_row_is_one_method(chain: list, steps: int, method: str | None) -> None:
    assert point("row", chain, 30.0, steps).method == method


def test_fewer_steps_interpolated_at_the_step_count_of_the_same_time() -> None:
    rows = [point("10", [], 30.0, steps=10), point("16", [], 40.0, steps=16)]
    assert scope_report.fewer_steps_at(rows, 20, 1.6) == pytest.approx(30.0 + 10.0 * (12.5 - 10) / 6)
    assert scope_report.fewer_steps_at(rows, 20, 1.05) == 40.0  # above the largest count: its PSNR, a lower bound
    assert scope_report.fewer_steps_at(rows, 20, 2.5) is None  # below the smallest count: not measured
    assert math.isinf(scope_report.fewer_steps_at(rows, 20, 1.0))


def test_best_row_is_the_highest_psnr_at_least_as_fast() -> None:
    rows = [point("slow good", [KV], 40.0, predicted=1.2), point("fast", [KV], 30.0, predicted=1.6),
            point("fast better", [KV], 32.0, predicted=1.5), point("block", [BLOCK], 35.0, predicted=2.0)]
    assert scope_report.best_at(rows, "keys/values", "T", 1.1).label == "slow good"
    assert scope_report.best_at(rows, "keys/values", "T", 1.3).label == "fast better"
    assert scope_report.best_at(rows, "keys/values", "T", 1.7) is None


def test_fixture_blocks_map_to_the_real_depth_by_position() -> None:
    flux, wan, sdxl = (real_speed.TARGETS[f][0] for f in ("flux", "wan", "sdxl"))
    # auto on the fixture: Flux's later half, double 2-3 of 4, single 4-7 of 8; Wan (video) blocks 2-5 of 6
    assert real_speed.real_blocks("auto", "flux", flux) == "double:9-18,single:19-37"
    assert real_speed.real_blocks("auto", "wan", wan) == "blocks:13-39"
    assert real_speed.real_blocks("blocks:0-5", "wan", wan) == "blocks:0-39"
    assert real_speed.real_blocks("all", "flux", flux) == "all"
    assert real_speed.real_blocks("auto", "sdxl", sdxl) == "auto"  # UNet lists are priced as they are


def test_mean_mse_psnr_counts_an_identical_seed_as_no_error() -> None:
    assert scope_report.mse_psnr([20.0, 20.0]) == pytest.approx(20.0)
    assert scope_report.mse_psnr([20.0, math.inf]) == pytest.approx(20.0 + 10 * math.log10(2))


def test_merged_share_reads_the_run_lines() -> None:
    log = "LazyCache - skipped 7/20 steps (1.54x speedup).; 1024->512 tokens (32x32); merged 7/20 steps, 7/13 calls"
    assert scope_report.merged_share(log) == pytest.approx(7 / 13)
    assert scope_report.merged_share("1024->512 tokens (32x32); merged 0/20 steps, 0/20 calls") == 0
    assert scope_report.merged_share("EasyCache - skipped 6/20 steps (1.43x speedup).") is None
