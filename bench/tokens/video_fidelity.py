"""How many frames a ToMA tile should span: merge fidelity on video tokens of camera pans over
photographs (what the advanced node's tile_frames default rests on).

    OMP_NUM_THREADS=1 python -m bench.tokens.video_fidelity            (about a minute on one core)

Video. Each scikit-image sample photograph (nothing fetched, nothing stored) is resized so that a
window of --grid x (1.5 * --grid) tokens of --patch px fits with room to pan; frame f is the window
shifted right by f * pan px, for pans of 0 (a still shot), a quarter, one and three tokens per
latent frame. Tokens as bench/tokens/fidelity.py makes them (seeded projection to C channels and a
LayerNorm without affine), t-major: (1, F * h * w, C), the layout of Wan's patchified latent.

Plans are the Wan adapter's: frame 0 alone in spatial tiles, frames 1.. in tiles of tile_frames x
tile_size x tile_size (toma_core.video.make_video_plan). Errors as in bench/tokens/fidelity.py, means
over the photographs: roundtrip ||U M x - x|| / ||x||, attn ||U attn(M x) - attn(x)|| / ||attn(x)||
(a random content-based self-attention over all frames). Lower is better; the same D for every
tile_frames up to rounding (column "kept").
"""

from __future__ import annotations

import argparse
import statistics

import torch

from . import fidelity
from toma_core.video import Segment, make_video_plan

IMAGES = ("astronaut", "chelsea", "coffee", "rocket", "camera")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", nargs="+", default=list(IMAGES))
    p.add_argument("--frames", type=int, default=9, help="latent frames (9 = 33 video frames)")
    p.add_argument("--grid", type=int, default=16, help="tokens per frame column (frame width 1.5x)")
    p.add_argument("--patch", type=int, default=8)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--pans", type=float, nargs="+", default=[0.0, 0.25, 1.0, 3.0], help="tokens per latent frame")
    p.add_argument("--tile-frames", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75])
    p.add_argument("--tile-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def pan_video(image, frames: int, h: int, w: int, patch: int, pan: float, weight: torch.Tensor) -> torch.Tensor:
    """(1, F*h*w, C) t-major tokens of a window of h x w tokens panning right by `pan` tokens a frame."""
    from skimage.transform import resize

    span = w * patch + round(pan * patch * (frames - 1))
    scale = max(h * patch / image.shape[0], span / image.shape[1])
    size = (max(h * patch, round(image.shape[0] * scale)), max(span, round(image.shape[1] * scale)))
    pixels = torch.from_numpy(resize(image, size, anti_aliasing=True, preserve_range=True).astype("float32"))
    shots = [pixels[: h * patch, round(f * pan * patch): round(f * pan * patch) + w * patch] for f in range(frames)]
    return torch.cat([fidelity.embed(fidelity.patchify(shot, patch), weight) for shot in shots], dim=1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    h, w = args.grid, args.grid * 3 // 2
    weight = fidelity.projection(args.patch * args.patch * 3, args.channels, args.seed)
    attn = fidelity.RandomAttention.create(args.channels, 4, args.seed + 1)
    images = [fidelity.load_sample_image(name) for name in args.images]
    print(f"{len(images)} photographs, {args.frames} frames of {h} x {w} tokens ({args.frames * h * w} tokens), "
          f"tile {args.tile_size}, C={args.channels}; means over the photographs")
    print("| pan (tokens/frame) | ratio | tile_frames | kept | roundtrip | attn |")
    print("|---:|---:|---:|---:|---:|---:|")
    for pan in args.pans:
        videos = [pan_video(image, args.frames, h, w, args.patch, pan, weight) for image in images]
        refs = [attn(x) for x in videos]
        for ratio in args.ratios:
            for tile_frames in args.tile_frames:
                segments = [Segment(1), Segment(args.frames - 1, tile_frames=tile_frames)]
                rows = []
                for x, ref in zip(videos, refs):
                    plan = make_video_plan(x, segments, h, w, ratio, args.tile_size)
                    rows.append(fidelity.measure(plan, x, attn, ref) | {"kept": plan.num_kept})
                mean = {k: statistics.fmean(r[k] for r in rows) for k in ("roundtrip", "attn")}
                print(f"| {pan:g} | {ratio:g} | {tile_frames} | {rows[0]['kept']} | {mean['roundtrip']:.4f} | {mean['attn']:.4f} |")


if __name__ == "__main__":
    main()
