"""Smoke tests of the evidence entry points (bench/tokens/fidelity.py, bench/publish/demo.py) on tiny inputs, plus
checks of the baselines they compare against (ToMe's bipartite matching, 2x2 pooling).

The benchmarks themselves are not run in CI; these run each entry point in a few seconds.
Tests that need scikit-image (sample images) or pillow (the demo's PNG) skip without them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_skimage = pytest.mark.skipif(not _has("skimage"), reason="scikit-image not installed (sample images)")
needs_pillow = pytest.mark.skipif(not _has("PIL"), reason="pillow not installed (the demo reads and writes images)")


@pytest.fixture(scope="module")
def fid():
    from bench.tokens import fidelity

    return fidelity


def _run(module: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python -m bench.<module> args`` from the repository root."""
    return subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------------------------ entry points


@needs_skimage
def test_fidelity_cli_tiny(tmp_path):
    result = _run("tokens.fidelity", "--out", str(tmp_path), "--images", "astronaut", "--grid", "8", "--tiles", "2",
                  "--similarities", "cosine", "--temperatures", "0.001", "--budgets", "tile", "--tome-seeds", "1",
                  "--compare", "")
    assert result.returncode == 0, result.stderr
    records = json.loads((tmp_path / "fidelity.json").read_text())["records"]
    assert {r["method"] for r in records} == {"toma", "tome", "pool2x2", "pool1x2"}
    assert len([r for r in records if r["method"] == "toma"]) == 3  # ratios 0.25, 0.5, 0.75
    for record in records:
        assert 0 < record["roundtrip"] < 1 and 0 < record["attn"] < 1, record["label"]
        assert record["kept_fraction"] == pytest.approx(1 - record["ratio"], abs=0.05)
    table = (tmp_path / "fidelity.md").read_text()
    assert "## roundtrip" in table and "| tome |" in table


def test_fidelity_rejects_bad_ratio(tmp_path):
    result = _run("tokens.fidelity", "--out", str(tmp_path), "--ratios", "1.5")
    assert result.returncode == 2
    assert "ratio=1.5" in result.stderr and "Traceback" not in result.stderr


@needs_skimage
@needs_pillow
def test_demo_tiny_default_image(tmp_path):
    out = tmp_path / "demo.png"
    result = _run("publish.demo", "--grid", "8", "--patch", "4", "--device", "cpu", "--block-width", "64",
                  "--block-grid", "8", "--repeats", "1", "--warmup", "0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "merge->unmerge relative error" in result.stdout and "full block" in result.stdout
    from PIL import Image

    with Image.open(out) as image:
        assert image.width > 3 * 8 * 4 and image.height > 8 * 4


@pytest.mark.parametrize("kind", ["missing", pytest.param("not_an_image", marks=needs_pillow)])
def test_demo_bad_image_is_one_line(tmp_path, kind):
    path = tmp_path / "nope.png"
    if kind == "not_an_image":
        path.write_text("this is not a PNG")
    result = _run("publish.demo", "--image", str(path), "--no-speed", "--out", str(tmp_path / "x.png"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and str(path) in lines[0], result.stderr
    assert not (tmp_path / "x.png").exists()


@needs_pillow
def test_demo_user_image_without_speed(tmp_path):
    from PIL import Image

    gradient = torch.linspace(0, 255, 40).byte()
    pixels = torch.stack([gradient.expand(30, 40), gradient.flip(0).expand(30, 40), torch.full((30, 40), 90).byte()], -1)
    src = tmp_path / "in.png"
    Image.fromarray(pixels.numpy()).save(src)
    result = _run("publish.demo", "--image", str(src), "--grid", "10", "--patch", "3", "--tile-size", "3",
                  "--ratio", "0.75", "--no-speed", "--out", str(tmp_path / "out.png"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.png").is_file()


# ------------------------------------------------------------------------------ baselines


@pytest.mark.parametrize(("h", "w", "ratio"), [(8, 8, 0.25), (8, 8, 0.75), (7, 9, 0.5), (9, 6, 0.75)])
def test_tome_keeps_n_minus_r_and_one_destination_per_cell(fid, h, w, ratio):
    x = torch.randn(2, h * w, 6, generator=torch.Generator().manual_seed(1))
    merger = fid.tome_merger(x, h, w, ratio, torch.Generator().manual_seed(2))
    assert merger.num_kept == h * w - int(h * w * ratio)
    assert merger.merge(x).shape == (2, merger.num_kept, 6)
    assert merger.unmerge(merger.merge(x)).shape == x.shape
    dst = fid.random_cell_destinations(h, w, torch.Generator().manual_seed(2)).view(h, w)
    cells = dst[: h // 2 * 2, : w // 2 * 2].reshape(h // 2, 2, w // 2, 2).sum((1, 3))
    assert bool((cells == 1).all()) and int(dst.sum()) == (h // 2) * (w // 2)


def test_tome_merges_the_most_similar_sources_first(fid):
    # 4x4 grid; tokens of the left half identical, right half random: at r = 4 the merged
    # sources are all from the left half (similarity 1 to a left destination).
    x = torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(0))
    left = (torch.arange(16) % 4) < 2
    x[0, left] = 1.0
    merger = fid.tome_merger(x, 4, 4, 0.25, torch.Generator().manual_seed(0))
    roundtrip = merger.unmerge(merger.merge(x))
    assert torch.allclose(roundtrip, x, atol=1e-6)


def test_pool_merger_is_cell_mean_and_nearest_upsampling(fid):
    x = torch.arange(3 * 5, dtype=torch.float32).view(1, 15, 1)  # 3x5 grid, odd both ways
    merger = fid.pool_merger(1, 3, 5)
    merged = merger.merge(x)
    assert merger.num_kept == 2 * 3
    assert merged[0, 0, 0] == pytest.approx((0 + 1 + 5 + 6) / 4)
    assert merged[0, 5, 0] == pytest.approx(14.0)  # bottom-right 1x1 partial cell
    assert torch.equal(merger.unmerge(merged)[0, 6], merged[0, 0])  # token (1, 1) -> cell 0


def test_cluster_sizes_count_tokens(fid):
    from toma_core import make_plan

    x = torch.randn(1, 64, 8, generator=torch.Generator().manual_seed(3))
    for merger in (fid.pool_merger(1, 8, 8), make_plan(x, 8, 8, 0.5, 4, temperature=0.0)):
        sizes = fid.cluster_sizes(merger, 1)
        assert sizes.shape == (1, merger.num_kept)
        assert float(sizes.sum()) == pytest.approx(64.0)
