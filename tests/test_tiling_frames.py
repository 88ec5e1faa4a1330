"""Spatio-temporal tiles: a t-major frames x height x width grid cut into
tile_frames x tile_size x tile_size tiles, padded where the tile does not divide the grid."""

from __future__ import annotations

import pytest
import torch

from toma_core import TileGrid

SHAPES = [
    # frames, height, width, tile_size, tile_frames
    (1, 8, 12, 4, 1),
    (5, 8, 12, 4, 2),
    (7, 5, 9, 4, 3),
    (3, 3, 2, 4, 4),
    (21, 3, 5, 2, 2),
    (4, 1, 7, 3, 2),
]


def decode(index: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return index // (height * width), (index // width) % height, index % width


@pytest.mark.parametrize(("frames", "height", "width", "tile", "tile_frames"), SHAPES)
def test_every_token_sits_in_exactly_one_tile(frames, height, width, tile, tile_frames):
    grid = TileGrid(height, width, tile, 0.5, frames=frames, tile_frames=tile_frames)
    index = grid.raster_index()
    real = index[index >= 0]
    assert index.shape == (grid.num_tiles, grid.tile_tokens)
    assert sorted(real.tolist()) == list(range(frames * height * width))
    assert sum(grid.real_counts) == grid.num_tokens == frames * height * width
    assert [int((row >= 0).sum()) for row in index] == grid.real_counts


@pytest.mark.parametrize(("frames", "height", "width", "tile", "tile_frames"), SHAPES)
def test_tiles_are_boxes_of_the_requested_extent(frames, height, width, tile, tile_frames):
    grid = TileGrid(height, width, tile, 0.5, frames=frames, tile_frames=tile_frames)
    for row in grid.raster_index():
        f, r, c = decode(row[row >= 0], height, width)
        assert int(f.max() - f.min()) < min(tile_frames, frames)
        assert int(r.max() - r.min()) < min(tile, height)
        assert int(c.max() - c.min()) < min(tile, width)
        # a box: every (frame, row, column) combination of its extent is present
        assert len(f) == len(set(f.tolist())) * len(set(r.tolist())) * len(set(c.tolist()))


@pytest.mark.parametrize(("frames", "height", "width", "tile", "tile_frames"), SHAPES)
def test_fold_gathers_the_raster_index_and_unfold_index_inverts_it(frames, height, width, tile, tile_frames):
    grid = TileGrid(height, width, tile, 0.5, frames=frames, tile_frames=tile_frames)
    x = torch.randn(2, grid.num_tokens, 3)
    tiles = grid.fold(x)
    index = grid.raster_index()
    assert tiles.shape == (2, grid.num_tiles, grid.tile_tokens, 3)
    assert torch.equal(tiles[:, index >= 0], x[:, index[index >= 0]])
    assert torch.all(tiles[:, index < 0] == 0)
    assert torch.equal(tiles.flatten(1, 2).index_select(1, grid.unfold_index()), x)  # as TiledMergePlan.unmerge reads it


def test_keep_counts_follow_each_tiles_real_tokens():
    grid = TileGrid(5, 6, 4, 0.5, frames=5, tile_frames=2)
    # frame blocks of 2, 2, 1 frames; row blocks of 4, 1; column blocks of 4, 2
    assert grid.real_counts == [f * r * c for f in (2, 2, 1) for r in (4, 1) for c in (4, 2)]
    assert grid.keep_counts == [max(1, round(n / 2)) for n in grid.real_counts]
    assert grid.padded and not TileGrid(8, 8, 4, 0.5, frames=4, tile_frames=2).padded


def test_one_frame_is_the_image_grid():
    image = TileGrid(6, 10, 4, 0.25)
    video = TileGrid(6, 10, 4, 0.25, frames=1, tile_frames=3)
    assert torch.equal(image.raster_index(), video.raster_index())
    assert image.keep_counts == video.keep_counts and video.tt == 1
