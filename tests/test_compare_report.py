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


def runs(toma_psnr: float, toma_s: float, fewer_psnr: float, fewer_s: float, fewer_steps: int = 15):
    unpatched = report.TimedRun("unpatched", 20, 10.0)
    return unpatched, report.TimedRun("ToMA", 20, toma_s, toma_psnr, 0.9), report.TimedRun("fewer steps", fewer_steps, fewer_s, fewer_psnr, 0.9)


def test_toma_wins_with_a_closer_image_at_equal_time():
    line = report.verdict(*runs(31.0, 7.5, 28.0, 7.6))
    assert line.startswith("Verdict: ToMA wins at equal time") and "31.00 dB" in line and "15 of 20 steps 28.00 dB" in line


def test_fewer_steps_win_with_a_closer_image_at_equal_time():
    assert report.verdict(*runs(25.0, 7.5, 28.0, 7.7)).startswith("Verdict: fewer steps win at equal time")


def test_a_closer_image_that_took_longer_wins_nothing():
    """ToMA's image is closer but its run took more than the tolerance longer than the fewer steps'."""
    assert report.verdict(*runs(31.0, 8.0, 28.0, 7.0)).startswith("Verdict: no winner at equal time")


def test_equal_time_allows_the_tolerance():
    slower = 7.0 * (1 + report.TIME_TOLERANCE) * 0.999
    assert report.verdict(*runs(31.0, slower, 28.0, 7.0)).startswith("Verdict: ToMA wins")


def test_toma_that_saves_no_step_does_not_pay():
    line = report.verdict(*runs(31.0, 9.8, math.inf, 10.0, fewer_steps=20))
    assert line.startswith("Verdict: ToMA does not pay here") and "1.02x" in line


def test_the_report_has_every_run_and_one_verdict_line():
    unpatched, toma, fewer = runs(31.0, 7.5, 28.0, 7.6)
    text = report.report([unpatched, toma, fewer], "setup", "timing", ["ToMA [flux]: 4096->2048 tokens"], report.verdict(unpatched, toma, fewer))
    lines = text.splitlines()
    assert [line for line in lines if line.startswith(report.VERDICT)] == [lines[-1]]
    assert "unpatched: 20 steps, 10.00 s, 1.00x, reference" in lines
    assert "ToMA: 20 steps, 7.50 s, 1.33x, PSNR 31.00 dB, SSIM 0.900" in lines
    assert "ToMA's run line: ToMA [flux]: 4096->2048 tokens" in lines
    assert report.NO_RUN_LINE in report.report([unpatched, toma, fewer], "s", "t", [], "v").splitlines()


# ---- the picture


@pytest.fixture(scope="module")
def grid():
    pytest.importorskip("PIL", reason="Pillow (ComfyUI's own requirement): pip install -e '.[demo]'")
    return pack_module("nodes.node.compare_grid")


def test_images_sit_side_by_side_with_text_underneath(grid):
    panels = [(images(i, (1, 64, 48, 3)), f"run {i}") for i in range(3)]
    picture = grid.comparison_picture(panels, ["Verdict: ...", "Timing: ..."])
    _, height, width, channels = picture.shape
    assert (width, channels) == (3 * 48 + 2 * grid.GAP, 3) and height > 64
    assert torch.equal(picture[0, :64, :48], (panels[0][0][0] * 255 + 0.5).to(torch.uint8).float() / 255)
    assert picture[0, 64:].std() > 0, "no caption drawn under the images"


def test_a_video_shows_a_strip_of_frames_per_run_one_under_the_other(grid):
    panels = [(images(i, (9, 32, 40, 3)), f"run {i}") for i in range(3)]
    picture = grid.comparison_picture(panels, ["Verdict: ..."])
    _, height, width, _ = picture.shape
    assert width == grid.STRIP_FRAMES * 40 + (grid.STRIP_FRAMES - 1) * grid.GAP
    assert height > 3 * 32
    last_frame = (panels[0][0][8] * 255 + 0.5).to(torch.uint8).float() / 255
    assert torch.equal(picture[0, :32, -40:], last_frame), "the strip ends on the last frame"
