"""The ToMA Compare node's arithmetic, without ComfyUI: PSNR / SSIM (nodes/node/compare_metrics.py),
the fewer-steps choice and the verdict at equal time (compare_report.py), and its picture's layout
(compare_grid.py)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.pack import pack_module

metrics = pack_module("nodes.node.compare_metrics")
report = pack_module("nodes.node.compare_report")


def images(seed: int, shape=(2, 24, 20, 3)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def noisy(reference: torch.Tensor, scale: float, seed: int = 9) -> torch.Tensor:
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(seed))
    return (reference + scale * noise).clamp(0, 1)


# ---- metrics


def test_identical_images_have_infinite_psnr_and_ssim_one():
    reference = images(0)
    assert metrics.psnr(reference, reference.clone()) == math.inf
    assert metrics.ssim(reference, reference.clone()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("offset", [0.1, 0.01, 0.25])
def test_psnr_of_a_uniform_offset_is_minus_20_log10_of_it(offset):
    reference = torch.full((1, 8, 8, 3), 0.5)
    assert metrics.psnr(reference, reference + offset) == pytest.approx(-20 * math.log10(offset), abs=1e-4)


def test_psnr_pools_the_squared_error_of_every_frame():
    """A clip whose one frame of two is off by d: MSE d^2 / 2, PSNR 3.01 dB above one frame's."""
    reference = torch.full((2, 8, 8, 3), 0.5)
    clip = reference.clone()
    clip[1] += 0.1
    assert metrics.psnr(reference, clip) == pytest.approx(20 + 10 * math.log10(2), abs=1e-4)
    assert metrics.psnr(reference[1:], clip[1:]) == pytest.approx(20, abs=1e-4)


def test_metrics_are_symmetric_and_fall_as_the_noise_grows():
    reference = images(1)
    slightly, badly = noisy(reference, 0.02), noisy(reference, 0.2)
    assert metrics.psnr(reference, slightly) == pytest.approx(metrics.psnr(slightly, reference))
    assert metrics.ssim(reference, slightly) == pytest.approx(metrics.ssim(slightly, reference))
    assert metrics.psnr(reference, slightly) > metrics.psnr(reference, badly)
    assert 1 > metrics.ssim(reference, slightly) > metrics.ssim(reference, badly)


def test_ssim_is_scikit_images_default():
    structural_similarity = pytest.importorskip("skimage.metrics", reason="scikit-image: pip install -e '.[demo]'").structural_similarity
    reference = images(2)
    image = noisy(reference, 0.1)
    expected = [structural_similarity(r.double().numpy(), x.double().numpy(), channel_axis=2, data_range=1.0) for r, x in zip(reference, image)]
    assert metrics.ssim(reference, image) == pytest.approx(sum(expected) / len(expected), abs=1e-9)


def test_ssim_sees_structure_psnr_does_not():
    """A uniform offset and +-offset noise have the same MSE, so the same PSNR; SSIM keeps the offset
    image's structure (near 1) and not the noisy one's."""
    y, x = torch.meshgrid(torch.linspace(0, 3, 32), torch.linspace(0, 3, 32), indexing="ij")
    reference = (0.5 + 0.25 * torch.sin(x) * torch.cos(y))[None, ..., None].expand(1, 32, 32, 3)
    signs = torch.sign(torch.randn(reference.shape, generator=torch.Generator().manual_seed(4)))
    offset, noise = reference + 0.1, reference + 0.1 * signs
    assert metrics.psnr(reference, offset) == pytest.approx(metrics.psnr(reference, noise), abs=1e-4)
    assert metrics.ssim(reference, offset) > 0.9
    assert metrics.ssim(reference, noise) < 0.5


@pytest.mark.parametrize("metric", ["psnr", "ssim"])
def test_metrics_refuse_different_shapes(metric):
    with pytest.raises(ValueError, match="same"):
        getattr(metrics, metric)(images(0), images(0, (2, 24, 21, 3)))


def test_ssim_refuses_images_smaller_than_its_window():
    tiny = images(0, (1, 6, 20, 3))
    with pytest.raises(ValueError, match="6 x 20 px"):
        metrics.ssim(tiny, tiny)


# ---- the fewer-steps choice


@pytest.mark.parametrize("steps, unpatched, toma, expected", [
    (20, 10.0, 7.4, 15),   # 14.8 -> 15
    (20, 10.0, 7.2, 14),   # 14.4 -> 14
    (4, 2.0, 1.6, 3),
    (8, 8.0, 0.1, 1),      # never below one step
    (20, 10.0, 10.0, 20),  # no gain: no step to drop
    (20, 10.0, 13.0, 20),  # slower: never more steps than the run
    (1, 1.0, 0.5, 1),
])
def test_fewer_steps_take_tomas_time(steps, unpatched, toma, expected):
    assert report.fewer_steps(steps, unpatched, toma) == expected


@pytest.mark.parametrize("args, match", [((0, 1.0, 1.0), "steps=0"), ((4, 0.0, 1.0), "unpatched_seconds=0.0"), ((4, 1.0, -1.0), "toma_seconds=-1.0"), ((4, 1.0, math.nan), "toma_seconds=nan")])
def test_fewer_steps_refuse_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        report.fewer_steps(*args)


# ---- the verdict


def runs(toma_psnr: float, toma_s, fewer_psnr: float, fewer_s, fewer_steps: int = 15, unpatched_s=(10.0,)):
    """Unpatched, ToMA and fewer-steps runs; each time a number or a tuple of the repeats' seconds."""
    def times(value):
        return tuple(value) if isinstance(value, tuple) else (value,)
    unpatched = report.TimedRun("unpatched", 20, times(unpatched_s))
    return (unpatched, report.TimedRun("ToMA", 20, times(toma_s), toma_psnr, 0.9),
            report.TimedRun("fewer steps", fewer_steps, times(fewer_s), fewer_psnr, 0.9))


def merged(steps: int, total: int = 20, planned: float = 12.0):
    return report.Merged(steps, total, planned, "24 of 40 model calls unmerged: min_tokens auto: predicted 0.69x", "set min_tokens ...")


def test_toma_wins_with_a_closer_image_at_equal_time():
    line = report.verdict(*runs(31.0, 7.5, 28.0, 7.6))
    assert line.startswith("Verdict: ToMA wins at equal time") and "31.00 dB" in line and "15 of 20 steps 28.00 dB" in line


def test_fewer_steps_win_with_a_closer_image_at_equal_time():
    assert report.verdict(*runs(25.0, 7.5, 28.0, 7.7)).startswith("Verdict: fewer steps win at equal time")


def test_clear_wins_each_way_hold_over_repeats():
    """Spreads that keep ToMA clearly faster than the unpatched run: the PSNR at equal time decides."""
    toma_first = runs(31.0, (7.4, 7.5, 7.7), 28.0, (7.5, 7.6, 7.6), unpatched_s=(9.9, 10.0, 10.4))
    fewer_first = runs(25.0, (7.4, 7.5, 7.7), 28.0, (7.5, 7.6, 7.6), unpatched_s=(9.9, 10.0, 10.4))
    assert report.verdict(*toma_first).startswith("Verdict: ToMA wins at equal time")
    assert report.verdict(*fewer_first).startswith("Verdict: fewer steps win at equal time")


def test_a_closer_image_that_took_longer_wins_nothing():
    """ToMA's image is closer but its run took more than the tolerance longer than the fewer steps'."""
    assert report.verdict(*runs(31.0, 8.0, 28.0, 7.0)).startswith("Verdict: no winner at equal time")


def test_equal_time_allows_the_tolerance_and_the_spread():
    slower = 7.0 * (1 + report.TIME_TOLERANCE) * 0.999
    assert report.verdict(*runs(31.0, slower, 28.0, 7.0)).startswith("Verdict: ToMA wins")
    assert report.verdict(*runs(31.0, (7.6, 8.0, 8.2), 28.0, (6.9, 7.1, 7.2))).startswith("Verdict: no winner")


def test_a_closer_image_that_took_longer_within_the_spread_is_too_close_to_call():
    """ToMA's image is closer, its median 13 % slower than the fewer steps', but the spreads overlap."""
    line = report.verdict(*runs(31.0, (7.0, 8.0, 8.2), 28.0, (6.9, 7.1, 7.2)))
    assert line.startswith("Verdict: too close to call: ToMA's image is closer"), line
    assert "took 0.90 s (13%) longer" in line and "ToMA 7.00-8.20 s, fewer steps 6.90-7.20 s" in line and "wins" not in line
    fewer_closer = report.verdict(*runs(25.0, (6.9, 7.1, 7.2), 28.0, (7.0, 8.0, 8.2)))
    assert fewer_closer.startswith("Verdict: too close to call: the fewer steps' image is closer"), fewer_closer


def test_toma_that_saves_no_step_does_not_pay():
    line = report.verdict(*runs(31.0, 10.2, math.inf, 10.0, fewer_steps=20))
    assert line.startswith("Verdict: ToMA does not pay here") and "0.98x" in line


def test_a_speedup_within_the_spread_is_too_close_to_call():
    """ToMA's median is 5 % faster, but its repeats overlap the unpatched ones: no winner is named."""
    unpatched, toma, fewer = runs(31.0, (8.9, 9.5, 9.8), 28.0, (8.9, 9.0, 9.1), fewer_steps=19, unpatched_s=(9.6, 10.0, 10.3))
    line = report.verdict(unpatched, toma, fewer)
    assert line.startswith("Verdict: too close to call: ToMA ran at 1.05x"), line
    assert "0.50 s (5%) faster" in line and "3 repeats" in line and "unpatched 9.60-10.30 s, ToMA 8.90-9.80 s" in line
    assert "wins" not in line


def test_toma_that_merged_nothing_says_so_first_and_competes_not():
    line = report.verdict(*runs(math.inf, 9.9, math.inf, 10.0, fewer_steps=20), merged(0))
    assert line.startswith("Verdict: ToMA merged nothing: 0 of 20 steps (24 of 40 model calls unmerged: min_tokens auto")
    assert "To make it merge: set min_tokens ..." in line and "no contender" in line
    assert "inf" not in line and "pay" not in line and "wins" not in line


def test_toma_that_merged_few_steps_says_so_before_the_contest():
    line = report.verdict(*runs(31.0, 7.5, 28.0, 7.6), merged(3))
    assert line.startswith("Verdict: ToMA merged only 3 of 20 steps (24 of 40")
    assert line.index("To merge more: set min_tokens") < line.index(". ToMA wins at equal time")
    assert report.verdict(*runs(31.0, 7.5, 28.0, 7.6), merged(12)).startswith("Verdict: ToMA wins"), "merged as planned"


@pytest.mark.parametrize("value", [0, 21, -1])
def test_repeats_out_of_range_are_refused(value):
    with pytest.raises(ValueError, match=f"repeats={value} is outside the allowed range 1 - 20"):
        report.check_repeats(value)


def test_a_run_is_timed_as_its_median_with_its_spread():
    run = report.TimedRun("ToMA", 20, (9.0, 7.0, 12.0), 30.0, 0.9)
    assert run.seconds == 9.0 and run.spread == (7.0, 12.0)
    reference = report.TimedRun("unpatched", 20, (10.0, 18.0, 9.0))
    assert report.run_text(run, reference) == "ToMA: 20 steps, 9.00 s (repeats 7.00-12.00 s), 1.11x, PSNR 30.00 dB, SSIM 0.900"
    out = report.TimedRun("fewer steps", 20, (10.0,), math.inf, 1.0, "no step to drop")
    assert report.run_text(out, reference).endswith("1.00x, not a contender: no step to drop")


def test_the_report_has_every_run_and_one_verdict_line():
    unpatched, toma, fewer = runs(31.0, 7.5, 28.0, 7.6)
    text = report.report([unpatched, toma, fewer], "setup", "timing", ["ToMA [flux]: 4096->2048 tokens"], report.verdict(unpatched, toma, fewer))
    lines = text.splitlines()
    assert [line for line in lines if line.startswith(report.VERDICT)] == [lines[-1]]
    assert "unpatched: 20 steps, 10.00 s (repeats 10.00-10.00 s), 1.00x, reference" in lines
    assert "ToMA: 20 steps, 7.50 s (repeats 7.50-7.50 s), 1.33x, PSNR 31.00 dB, SSIM 0.900" in lines
    assert "ToMA's run line: ToMA [flux]: 4096->2048 tokens" in lines
    assert report.NO_RUN_LINE in report.report([unpatched, toma, fewer], "s", "t", [], "v").splitlines()


# ---- the picture


@pytest.fixture(scope="module")
def grid():
    pytest.importorskip("PIL", reason="Pillow (ComfyUI's own requirement): pip install -e '.[demo]'")
    return pack_module("nodes.node.compare_grid")


def test_images_sit_side_by_side_with_text_underneath(grid):
    panels = [(images(i, (1, 64, 128, 3)), f"run {i}") for i in range(3)]
    picture = grid.comparison_picture(panels, ["Verdict: ...", "Timing: ..."])
    _, height, width, channels = picture.shape
    assert (width, channels) == (3 * 128 + 2 * grid.GAP, 3) and height > 64
    assert torch.equal(picture[0, :64, :128], (panels[0][0][0] * 255 + 0.5).to(torch.uint8).float() / 255)
    assert picture[0, 64:].std() > 0, "no caption drawn under the images"


def test_a_small_image_is_enlarged_to_hold_its_caption(grid):
    panels = [(images(i, (1, 20, 48, 3)), f"run {i}") for i in range(3)]
    picture = grid.comparison_picture(panels, ["Verdict: ..."])
    assert picture.shape[2] == 3 * 48 * 3 + 2 * grid.GAP, "48 px enlarged 3 times: at least MIN_WIDTH"
    enlarged = (panels[0][0][0] * 255 + 0.5).to(torch.uint8).float() / 255
    assert torch.equal(picture[0, :60, :144], enlarged.repeat_interleave(3, 0).repeat_interleave(3, 1))


def test_a_video_shows_a_strip_of_frames_per_run_one_under_the_other(grid):
    panels = [(images(i, (9, 32, 40, 3)), f"run {i}") for i in range(3)]
    picture = grid.comparison_picture(panels, ["Verdict: ..."])
    _, height, width, _ = picture.shape
    assert width == grid.STRIP_FRAMES * 40 + (grid.STRIP_FRAMES - 1) * grid.GAP
    assert height > 3 * 32
    last_frame = (panels[0][0][8] * 255 + 0.5).to(torch.uint8).float() / 255
    assert torch.equal(picture[0, :32, -40:], last_frame), "the strip ends on the last frame"


def test_a_number_never_parts_from_its_unit_when_captions_wrap(grid):
    """At every caption width, no line ends in a number whose unit starts the next line."""
    from PIL import Image, ImageDraw

    pen = ImageDraw.Draw(Image.new("RGB", (10, 10)))
    font = grid._font(12)
    caption = "ToMA: 20 steps, 7.43 s (repeats 7.40-8.92 s), 1.10x, PSNR 22.24 dB, SSIM 0.900; fewer 14 steps inf dB (identical)"
    for width in range(40, 400, 3):
        lines = grid._wrap(pen, caption, font, width)
        assert " ".join(lines) == caption
        for line, following in zip(lines, lines[1:]):
            assert not (grid.NUMBER.fullmatch(line.split()[-1]) and grid.UNIT.fullmatch(following.split()[0])), (width, lines)
            assert line.split()[-1] not in grid.LABELS, (width, lines)


def test_a_header_goes_above_the_images(grid):
    panels = [(images(i, (1, 64, 128, 3)), f"run {i}") for i in range(3)]
    plain = grid.comparison_picture(panels, ["Verdict: ..."])
    headed = grid.comparison_picture(panels, ["Verdict: ..."], ["ToMA merged nothing: 0 of 20 steps"])
    rise = headed.shape[1] - plain.shape[1]
    assert rise > 0 and torch.equal(headed[0, rise:], plain[0])
    assert (headed[0, :rise] < 0.9).any(), "no header text drawn"


# ---- what ToMA merged, and the input that makes it merge (compare_truth.py)


@pytest.fixture(scope="module")
def truth():
    return pack_module("nodes.node.compare_truth")


def run_record(steps_merged: int, unmerged: dict[str, int], total_steps: int = 20):
    return pack_module("nodes.run.report").RunRecord(
        family="flux", tokens={}, steps_merged=steps_merged, total_steps=total_steps, calls_merged=steps_merged,
        total_calls=total_steps, blocks_selected=2, blocks="auto", block_runs_merged=0, plans_built=0,
        unmerged_calls=unmerged, unmerged_blocks={}, status=None, eligible_calls=None, settings="ratio 0.5", gain=None)


AUTO_REASON = ("min_tokens auto: merging 256 image tokens at width 3072 on cpu is predicted 0.69x "
               "(needs 1.05x; a number in min_tokens forces merging)")


@pytest.mark.parametrize("node, says", [
    ("ToMAPatch", "ToMA Patch has no min_tokens: use ToMA Patch (Advanced) with the same settings and set its min_tokens to a number"),
    ("ToMAPatchAdvanced", "set min_tokens on ToMA Patch (Advanced) to a number"),
    (None, "set min_tokens to a number on ToMA Patch (Advanced)"),
])
def test_nothing_merged_by_auto_names_the_input_on_the_users_node(truth, node, says):
    settings = pack_module("nodes.settings").ToMASettings()
    ran = truth.merged(run_record(0, {"outside the sigma window": 8, AUTO_REASON: 12}), settings, node)
    assert ran.nothing and ran.fix.startswith(says)
    assert ran.reason == "12 of 20 model calls unmerged: " + AUTO_REASON.replace("; a number in min_tokens forces merging", "")
    if node == "ToMAPatch":
        assert "min_tokens on ToMA Patch " not in ran.fix, "the basic node has no min_tokens"


@pytest.mark.parametrize("reason, says", [
    ("outside the sigma window", "lower start_percent (or raise end_percent) on ToMA Patch"),
    ("between merge steps (merge_every=3)", "set merge_every to 1 on ToMA Patch"),
    ("ratio 0 (nothing to merge)", "raise ratio on ToMA Patch"),
    ("fewer than min_tokens=4096 image tokens", "lower min_tokens on ToMA Patch (Advanced)"),
])
def test_each_reason_has_its_fix(truth, reason, says):
    assert truth.fix(reason, "ToMAPatch").startswith(says)


def test_few_merged_steps_count_against_the_planned_ones(truth):
    settings = pack_module("nodes.settings").ToMASettings()  # start_percent 0.4: 12 of 20 steps planned
    assert truth.merged(run_record(5, {AUTO_REASON: 7, "outside the sigma window": 8}), settings, None).few
    assert not truth.merged(run_record(11, {"outside the sigma window": 9}), settings, None).few


def test_the_users_toma_node_is_found_upstream_of_toma_model(truth):
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {}},
        "2": {"class_type": "ToMAPatch", "inputs": {"model": ["1", 0]}},
        "3": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["2", 0]}},
        "4": {"class_type": "ToMACompare", "inputs": {"model": ["1", 0], "toma_model": ["3", 0]}},
    }
    assert truth.toma_node(prompt, "4") == "ToMAPatch"
    prompt["2"]["class_type"] = "ToMAPatchAdvanced"
    assert truth.toma_node(prompt, "4") == "ToMAPatchAdvanced"
    prompt["4"]["inputs"]["toma_model"] = ["1", 0]
    assert truth.toma_node(prompt, "4") is None
    assert truth.toma_node(None, None) is None
