"""The real-size cost model's untimed parts (bench/speed/realsize_setup.py, realsize_model.py):
evaluations counted on ComfyUI's own schedules and samplers, block lists from the real classes on
the meta device, and how block times combine into a run's speed-up. No timing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.speed import realsize_model as model
from bench.speed import realsize_setup as rs


@pytest.fixture(scope="module")
def schedule(comfy: Path):
    return rs.pack_module("toma_core").MergeSchedule


def test_flux_steps_merge_exactly_inside_the_sigma_window(schedule) -> None:
    ms = rs.model_sampling("flux", "1024")
    sigmas = [float(s) for s in rs.run_sigmas("flux", "1024", 20, "simple")]
    for start in (0.0, 0.4, 0.75):
        evals = rs.evaluations("flux", "1024", schedule(start, 1.0))
        assert [e.sigma for e in evals] == pytest.approx(sigmas[:-1])  # euler: one evaluation per step
        top, bottom = ms.percent_to_sigma(start), ms.percent_to_sigma(1.0)
        assert [e.merge for e in evals] == [bottom < e.sigma <= top for e in evals]
    counts = [sum(e.merge for e in rs.evaluations("flux", "1024", schedule(s, 1.0))) for s in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert counts[0] == 20 and counts[-1] == 0 and counts == sorted(counts, reverse=True)


def test_merge_every_and_recompute_follow_the_pack_schedule(schedule) -> None:
    evals = rs.evaluations("sdxl", "1024", schedule(0.0, 1.0, recompute_every=1, merge_every=2))
    assert len(evals) == 30 and sum(e.merge for e in evals) == 15
    reuse = rs.evaluations("sdxl", "1024", schedule(0.0, 1.0, recompute_every=4))
    assert sum(e.reselect for e in reuse) == math.ceil(30 / 4)


def test_heun_evaluates_twice_per_step_but_the_last(schedule) -> None:
    evals = rs.evaluations("sdxl", "1024", schedule(0.5, 1.0), steps=10, sampler="heun")
    assert len(evals) == 2 * 10 - 1
    assert {e.step for e in evals} == set(range(10))


def test_block_lists_come_from_the_real_classes(comfy: Path) -> None:
    flux = rs.block_sites("flux", "all")
    assert len(flux) == 19 + 38 and all(s.selected for s in flux)
    auto = rs.block_sites("flux", "auto")
    parsed = rs.pack_module("nodes.machinery.dit_blocks").parse_flux_blocks("auto", 19, 38)
    assert sum(s.selected for s in auto) == parsed.count < len(auto)
    sdxl = rs.block_sites("sdxl", "auto")
    assert sorted({(s.kind, s.level) for s in sdxl}) == [("unet1280", 4), ("unet640", 2)]
    assert sum(s.level == 2 for s in sdxl) == 10 and sum(s.level == 4 for s in sdxl) == 60
    sd15 = rs.block_sites("sd15", "auto")
    assert sorted(s.level for s in sd15 if s.selected) == [1, 1, 1, 2, 2, 2, 4, 4, 4]  # auto: output 3-11
    assert rs.dit_kinds("flux", reduced=True) == {"double": 1, "single": 1}


def _toy_cost() -> model.FamilyCost:
    curves = {kind: model.KindCurve(a=1.0, b=0.01, heads=1, alpha=1e-6, beta=0.0) for kind in ("double", "single")}
    return model.FamilyCost("flux", curves, {"unmerged": (5.0, 0.0), "merged": (5.0, 0.0)}, [], float("nan"), {})


def test_an_empty_window_or_no_merged_block_predicts_no_change(comfy: Path) -> None:
    cost = _toy_cost()
    assert model.predict(cost, "1024", model.Setting(0.5, 4, 1.0)).speedup == pytest.approx(1.0)
    assert model.predict(cost, "1024", model.Setting(0.0, 4, 0.0)).speedup == pytest.approx(1.0)


def test_speedup_combines_merged_share_of_steps_and_blocks(comfy: Path) -> None:
    cost = _toy_cost()
    grid = rs.grid_for("flux", 1024, 1024)
    full = model.predict(cost, "1024", model.Setting(0.5, 4, 0.0, blocks="all"))
    half = model.predict(cost, "1024", model.Setting(0.5, 4, 0.0, merge_every=2, blocks="all"))
    unmerged_call = full.unmerged_ms / full.evaluations
    merged_call = full.merged_ms / full.evaluations
    assert half.merged_ms == pytest.approx(10 * merged_call + 10 * unmerged_call)
    d = rs.kept_tokens(grid, 0.5, 4)
    t = cost.curves["double"]
    expected = 5.0 + 57 * t.ms(d + 256)
    assert merged_call == pytest.approx(expected)
    ratios = [model.predict(cost, "1024", model.Setting(r, 4, 0.0)).speedup for r in (0.25, 0.5, 0.75)]
    assert ratios == sorted(ratios) and ratios[0] > 1.0


def test_merge_correction_meets_each_probe_and_stays_between_them() -> None:
    curve = model.KindCurve(a=0.0, b=1.0, heads=1, alpha=0.0, beta=0.0, corrections=[(1000, 40.0), (4000, -20.0)])
    assert curve.merge_correction(1000) == pytest.approx(40.0)
    assert curve.merge_correction(4000) == pytest.approx(-20.0)
    assert curve.merge_correction(2500) == pytest.approx(10.0)
    assert curve.merge_correction(500) == pytest.approx(20.0)  # scaled with N below the first probe
    assert curve.merge_correction(8000) == pytest.approx(-40.0)  # and above the last
    assert model.KindCurve(a=0.0, b=1.0, heads=1, alpha=0.0, beta=0.0).merge_correction(1234) == 0.0


def test_a_probed_size_predicts_its_measured_merged_blocks(comfy: Path) -> None:
    """At a probed token count and the probes' setting, a merged block is predicted at its measured
    time (plan taken out), whatever the fit's error at the kept length."""
    from bench.speed import realsize

    cache = realsize.load_cache(realsize.CACHE)
    for name in ("flux", "sdxl"):
        cost = model.fit_family(name, cache)
        for record in (r for r in cache["probes"] if r["family"] == name):
            measured: dict[tuple[str, int], list[float]] = {}
            for kind, n, residual in model._merge_residuals(name, record, cost.curves):
                measured.setdefault((kind, n), []).append(residual)
            for (kind, n), residuals in measured.items():
                assert cost.curves[kind].merge_correction(n) == pytest.approx(sum(residuals) / len(residuals)), (name, kind, n)


KANDINSKY5 = [("kandinsky5_lite", 32), ("kandinsky5_pro", 60), ("kandinsky5_image", 50)]
TOY_KANDINSKY5 = {"model_dim": 64, "ff_dim": 128, "time_dim": 32, "axes_dims": (4, 6, 6), "in_text_dim": 32}
"""A toy width for Kandinsky 5's probe (4 heads of 16; the pooled CLIP-L width stays 768)."""


def require_class(name: str) -> None:
    import comfy.supported_models

    config_class = rs.family(name).config_class
    if not hasattr(comfy.supported_models, config_class):
        pytest.skip(f"this ComfyUI has no comfy.supported_models.{config_class} (it came after ComfyUI 0.3.64)")


@pytest.mark.parametrize("name, visual", KANDINSKY5)
def test_kandinsky5_prices_its_visual_blocks_on_image_tokens_alone(comfy: Path, name: str, visual: int) -> None:
    """The block list is the real class's visual blocks, selected as the adapter selects them; a block's
    L is the image tokens (text is cross-attention); heads x head_dim is the model width."""
    require_class(name)
    dm = rs.meta_patcher(name).get_model_object("diffusion_model")
    sites = rs.block_sites(name, "auto")
    chosen = rs.pack_module("nodes.machinery.dit_blocks").parse_dit_blocks("auto", {"blocks": visual}, video=True)
    assert len(sites) == len(dm.visual_transformer_blocks) == visual
    assert [s.selected for s in sites] == [chosen.selects("blocks", i) for i in range(visual)]
    heads, head_dim = model.HEADS[name]["double"]
    attention = dm.visual_transformer_blocks[0].self_attention
    assert (heads, head_dim) == (attention.num_heads, attention.head_dim) and heads * head_dim == dm.model_dim
    assert model.block_length(name, "double", 1000) == 1000


@pytest.mark.parametrize("name, grid", [("kandinsky5_lite", rs.Grid(4, 6, 3)), ("kandinsky5_image", rs.Grid(4, 6))])
def test_kandinsky5_probe_times_every_visual_block_merged_and_unmerged(comfy: Path, name: str, grid: rs.Grid) -> None:
    """A toy-width probe (the real class, the video model's concat channels) records each visual block
    of the reduced model once per call, at the call's image tokens, through the pack's hook when merged."""
    from bench.speed import realsize_measure as measure

    require_class(name)
    records = measure.probe(name, [grid], 0.5, 2, 1, "cpu", log=lambda _: None, overrides=TOY_KANDINSKY5)
    blocks = rs.dit_kinds(name, reduced=True)["double"]
    for label in ("unmerged", "merged"):
        assert [(kind, n) for kind, n, _ in records[0][label]["blocks"]] == [("double", grid.tokens)] * blocks
    assert list(records[0]["plan_ms"]) == [str(grid.tokens)]


def _toy_kv_cost() -> model.FamilyCost:
    cost = _toy_cost()
    for curve in cost.curves.values():
        curve.kv_alpha, curve.kv_beta = curve.alpha, curve.beta
    return cost


def test_keys_values_keeps_every_token_in_the_linear_layers(comfy: Path) -> None:
    """Scope keys_values prices a merged block as the unmerged curve with its attention over L_q x
    (L - N + D) in padded heads, plus the K / V merge: below the block merge's gain, above 1, and
    growing with the ratio."""
    cost = _toy_kv_cost()
    grid = rs.grid_for("flux", 1024, 1024)
    overhead = 0.5

    def kv_ms(*_):
        return overhead

    kv = model.predict(cost, "1024", model.Setting(0.5, 4, 0.0, blocks="all", scope="keys_values"), kv_ms=kv_ms)
    block = model.predict(cost, "1024", model.Setting(0.5, 4, 0.0, blocks="all"))
    d = rs.kept_tokens(grid, 0.5, 4)
    t = cost.curves["double"]
    length = grid.tokens + 256
    expected = 5.0 + 57 * (t.a + t.b * length + t.kv_alpha * length * (d + 256) + overhead)
    assert kv.merged_ms / kv.evaluations == pytest.approx(expected)
    assert 1.0 < kv.speedup < block.speedup
    ratios = [model.predict(cost, "1024", model.Setting(r, 4, 0.0, scope="keys_values"), kv_ms=kv_ms).speedup for r in (0.5, 0.75, 0.9)]
    assert ratios == sorted(ratios)
    with pytest.raises(ValueError, match="scope='attention'"):
        model.Setting(scope="attention")


def test_video_kept_tokens_follow_the_node_s_segments(comfy: Path) -> None:
    """With tile_frames, D is frame 0 in spatial tiles plus the other frames in tiles of that many
    frames (toma_core.video, as the video families build their plans); the plan built that way keeps D."""
    import torch

    from bench.speed import realsize_measure as measure

    grid = rs.Grid(6, 8, 5)
    tiling = rs.pack_module("toma_core").TileGrid
    d = rs.kept_tokens(grid, 0.75, 4, tile_frames=4)
    assert d == tiling(6, 8, 4, 0.75).num_kept + tiling(6, 8, 4, 0.75, frames=4, tile_frames=4).num_kept
    assert rs.kept_tokens(grid, 0.75, 4) == 5 * tiling(6, 8, 4, 0.75).num_kept
    plan = measure.video_plan(torch.randn(1, grid.tokens, 16), grid, 0.75, 4, 4)
    assert plan.num_kept == d


def test_keys_values_attention_fit_recovers_its_terms() -> None:
    points = [{"head_dim": 136, "length": q, "keys": k, "ms": 2e-6 * q * k + 3e-3 * q} for q, k in ((2048, 1024), (4096, 410), (8192, 4096))]
    assert model.kv_attention_fit(points, 136) == pytest.approx((2e-6, 3e-3))
    with pytest.raises(ValueError, match="head_dim 72"):
        model.kv_attention_fit(points, 72)


def test_the_k_v_merge_probe_times_the_override_around_a_kernel_doing_no_attention(comfy: Path) -> None:
    from bench.speed import realsize_measure as measure

    clock = measure.Clock("cpu")
    for grid, text in ((rs.Grid(8, 8, 5), 0), (rs.Grid(8, 8), 16)):
        assert measure.kv_overhead_ms(grid, 64, 2, text, 0.75, 4, 4 if grid.frames > 1 else None, clock, "cpu", repeats=1) >= 0.0


def test_wan_2_2_runs_as_its_template_wires_them(comfy: Path, schedule) -> None:
    """Wan 2.2 14B's template: 20 steps with CFG (2 samples per call) on shift 8, or the 4-step
    LightX2V path at cfg 1 on shift 5; both price the 40 blocks of Wan 14B's probes."""
    full = rs.evaluations("wan22_14b", "720p", schedule(0.0, 1.0))
    fast = rs.evaluations("wan22_14b_4step", "720p", schedule(0.0, 1.0))
    assert (len(full), rs.calls_per_evaluation("wan22_14b")) == (20, 2)
    assert (len(fast), rs.calls_per_evaluation("wan22_14b_4step")) == (4, 1)
    assert rs.family("wan22_14b_4step").probed == "wan14b" and len(rs.block_sites("wan22_14b_4step")) == 40
