"""ToMA in one picture and one number: the "try it" command. Needs neither ComfyUI nor model weights.

    python -m bench.publish.demo                                   # scikit-image's astronaut, CPU
    python -m bench.publish.demo --image my.jpg --ratio 0.75 --tile-size 8 --device cuda --out toma_demo.png

1. Cuts the image into a grid of p x p pixel patches (tokens; 40 x 40 tokens on the long side by
   default, so the README's picture shows each tile's kept tokens; --grid 64 is Flux at 1024 px), builds a ToMA plan from the tokens (seeded projection + LayerNorm, as in
   bench/tokens/fidelity.py), merges the patches N -> D and unmerges them D -> N.
2. Writes a PNG: the image | the tile grid with each destination token marked | merged -> unmerged.
3. Prints the reconstruction error (ToMA and, for reference, ToMe's bipartite matching at the same
   ratio) and the speed of one Flux-width transformer block (bench/speed/bench_core.py's single-stream
   block; width 3072 and 4096 tokens on cuda, scaled to width 768 and 1024 tokens on cpu with the
   same linear-to-attention cost balance) with and without ToMA: median of repeats after warm-up.

Needs pillow; scikit-image only for the default image. Exit code 2 with one line on stderr for a bad
path, an unreadable image or bad settings.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import metrics
from toma_core import SIMILARITIES, make_plan

from .. import timing
from ..cli import DTYPES
from ..speed.bench_core import FluxWidthBlock
from ..tokens import fidelity as fid


class DemoError(Exception):
    """A problem the user can fix (path, image, settings): printed as one line, exit code 2."""


# --------------------------------------------------------------------------------------------
# Image in, tokens, reconstruction


def load_image(path: str | None):
    """The user's image, or scikit-image's astronaut: float32 (H, W, 3) array in [0, 1]."""
    if path is None:
        try:
            return fid.load_sample_image("astronaut")
        except ImportError:
            raise DemoError("the default image comes from scikit-image: pip install scikit-image, or pass --image PATH")
    file = Path(path)
    if not file.is_file():
        raise DemoError(f"image not found: {path}")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise DemoError(f"reading {path} needs pillow: pip install pillow")
    try:
        with Image.open(file) as image:
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise DemoError(f"cannot read {path} as an image ({type(err).__name__}: {err})")
    import numpy as np

    return fid.to_rgb_float(np.asarray(rgb))


def resize(image, height: int, width: int) -> torch.Tensor:
    """(H, W, 3) float array -> (height, width, 3) tensor (pillow, bicubic)."""
    import numpy as np
    from PIL import Image

    pil = Image.fromarray((np.clip(image, 0, 1) * 255 + 0.5).astype("uint8"))
    pil = pil.resize((width, height), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.asarray(pil).astype("float32") / 255.0)


@dataclass
class Reconstruction:
    """Pixels (H, W, 3), the token grid h x w, the plan and the reconstructions."""

    pixels: torch.Tensor
    h: int
    w: int
    patch: int
    plan: object
    toma: torch.Tensor
    tome: torch.Tensor


def reconstruct(image, args: argparse.Namespace) -> Reconstruction:
    """Patch tokens of the image, ToMA's and ToMe's merge -> unmerge of them (same ratio)."""
    h, w = fid.grid_for(image.shape[0], image.shape[1], args.grid)
    pixels = resize(image, h * args.patch, w * args.patch)
    patches = fid.patchify(pixels, args.patch)  # (1, N, p*p*3)
    features = fid.embed(patches, fid.projection(patches.shape[-1], 64, args.seed))
    plan = make_plan(features, h, w, args.ratio, args.tile_size, similarity=args.similarity, temperature=args.temperature)
    tome = fid.tome_merger(features, h, w, args.ratio, torch.Generator().manual_seed(args.seed))
    toma_px = fid.unpatchify(plan.unmerge(plan.merge(patches)), h, w, args.patch)
    tome_px = fid.unpatchify(tome.unmerge(tome.merge(patches)), h, w, args.patch)
    return Reconstruction(pixels, h, w, args.patch, plan, toma_px, tome_px)


# --------------------------------------------------------------------------------------------
# The picture


def overlay(rec: Reconstruction, tile_size: int, line_width: int = 2, fade: float = 0.3):
    """A PIL image: the picture, faded towards white, with the tile grid (blue) and each destination token
    (red dot); also make_thumbnails.py's pictures."""
    from PIL import Image, ImageDraw

    picture = Image.fromarray((rec.pixels.clamp(0, 1) * 255 + 0.5).byte().numpy())
    picture = Image.blend(picture, Image.new("RGB", picture.size, "white"), fade)
    draw = ImageDraw.Draw(picture)
    step = tile_size * rec.patch
    for x in range(0, picture.width + 1, step):
        x = min(x, picture.width - 1)
        draw.line([(x, 0), (x, picture.height)], fill=(30, 80, 200), width=line_width)
    for y in range(0, picture.height + 1, step):
        y = min(y, picture.height - 1)
        draw.line([(0, y), (picture.width, y)], fill=(30, 80, 200), width=line_width)
    radius = rec.patch * 0.32
    for index in rec.plan.dst_index[0].tolist():
        cy, cx = (index // rec.w + 0.5) * rec.patch, (index % rec.w + 0.5) * rec.patch
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=(225, 30, 30), outline="white")
    return picture


def draw_panels(rec: Reconstruction, tile_size: int, title: str):
    """A PIL image: original | tile grid + destinations | ToMA merged -> unmerged."""
    from PIL import Image, ImageDraw

    to_pil = lambda t: Image.fromarray((t.clamp(0, 1) * 255 + 0.5).byte().numpy())  # noqa: E731
    original, rebuilt, grid = to_pil(rec.pixels), to_pil(rec.toma), overlay(rec, tile_size, line_width=1, fade=0.45)
    labels = ["input", f"tiles {tile_size}x{tile_size} tokens, {rec.plan.num_kept} destinations",
              "ToMA merge -> unmerge"]
    margin, header = 8, 36
    canvas = Image.new("RGB", (3 * original.width + 4 * margin, original.height + header + margin), "white")
    pen = ImageDraw.Draw(canvas)
    pen.text((margin, 4), title, fill="black")
    for i, (panel, label) in enumerate(zip((original, grid, rebuilt), labels)):
        left = margin + i * (original.width + margin)
        pen.text((left, 20), label, fill="black")
        canvas.paste(panel, (left, header))
    return canvas


# --------------------------------------------------------------------------------------------
# One Flux-width block, timed


def time_block(rec: Reconstruction, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Median ms of: the full block, ToMA with a fresh plan, ToMA reusing a plan, the block on D tokens."""
    dtype, side = DTYPES[args.dtype], args.block_grid
    torch.manual_seed(args.seed)
    if args.block_width % max(1, args.block_width // 128):
        raise DemoError(f"--block-width {args.block_width} must be a multiple of 128 or below 256 (heads of 128)")
    block = FluxWidthBlock(args.block_width, max(1, args.block_width // 128)).to(device, dtype).eval()
    patches = fid.patchify(resize(rec.pixels.numpy(), side * 4, side * 4), 4)  # the image on a side x side grid
    x = fid.embed(patches, fid.projection(patches.shape[-1], args.block_width, args.seed)).to(device, dtype)  # (1, N, C)

    def plan_of(tokens: torch.Tensor):
        return make_plan(tokens, side, side, args.ratio, args.tile_size, similarity=args.similarity,
                         temperature=args.temperature)

    def toma(plan) -> torch.Tensor:
        merged = plan.merge(x)
        return plan.unmerge_residual(x, merged, block(merged))

    plan = plan_of(x)
    cases = {
        "full block": lambda: block(x),
        "ToMA, plan built in the call": lambda: toma(plan_of(x)),
        "ToMA, plan reused": lambda: toma(plan),
        f"block alone on D={plan.num_kept} tokens (limit)": lambda: block(x[:, : plan.num_kept]),
    }
    with torch.inference_mode():
        return timing.median_ms(cases, device, warmup=args.warmup, repeats=args.repeats)


# --------------------------------------------------------------------------------------------
# CLI


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DemoError("--device cuda asked for, but torch sees no CUDA device (use --device cpu)")
    return torch.device(name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ToMA token merging demo: a picture of the merge and one block's speed.")
    p.add_argument("--image", help="an image file (PNG, JPEG, ...); default: scikit-image's astronaut")
    p.add_argument("--ratio", type=float, default=0.5, help="share of tokens merged away, in [0, 1)")
    p.add_argument("--tile-size", type=int, default=4, help="tile side in tokens")
    p.add_argument("--similarity", default="cosine", choices=SIMILARITIES)
    p.add_argument("--temperature", type=float, default=1e-3, help="assignment temperature (0 = hard)")
    p.add_argument("--grid", type=int, default=40, help="tokens on the image's long side (64 = Flux at 1024 px)")
    p.add_argument("--patch", type=int, default=8, help="pixels per token side in the picture")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="block dtype (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--block-width", type=int, help="block channels (default: 3072 on cuda, 768 on cpu)")
    p.add_argument("--block-grid", type=int, help="block token grid side (default: 64 on cuda, 32 on cpu)")
    p.add_argument("--repeats", type=int, help="timed calls per case (default: 20 on cuda, 7 on cpu)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before timing each case")
    p.add_argument("--no-speed", action="store_true", help="skip the block timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/out/toma_demo.png", help="where to write the PNG")
    return p.parse_args(argv)


def settle(args: argparse.Namespace, device: torch.device) -> None:
    """Fill device-dependent defaults and reject bad values (DemoError, one line)."""
    cuda = device.type == "cuda"
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    args.block_width = args.block_width or (3072 if cuda else 768)
    args.block_grid = args.block_grid or (64 if cuda else 32)
    args.repeats = args.repeats or (20 if cuda else 7)
    if not 0 <= args.ratio < 1:
        raise DemoError(f"--ratio {args.ratio} must be in [0, 1)")
    checks = {"--tile-size": args.tile_size, "--grid": args.grid, "--patch": args.patch,
              "--block-width": args.block_width, "--block-grid": args.block_grid, "--repeats": args.repeats}
    for flag, value in checks.items():
        if value < 1:
            raise DemoError(f"{flag} {value} must be >= 1")
    if args.temperature < 0:
        raise DemoError(f"--temperature {args.temperature} must be >= 0")


READING = (
    "      how to read this: the round trip above rebuilds every pixel from the kept tokens alone, which\n"
    "      a model never does: in a block only the block's change is spread back and each token keeps\n"
    "      its own detail. ToMe's fixed 2x2 cells rebuild flat pixels well, but in ComfyUI ToMe merges\n"
    "      only attention queries (little speed-up; none on SDXL). Image quality on trained models is\n"
    "      measured by bench/quality/quality.py (the Quality section in docs/) - not by this number."
)
"""Printed under the errors: a lower ToMe error here does not mean ToMe gives better images."""


def run(args: argparse.Namespace) -> None:
    device = pick_device(args.device)
    settle(args, device)
    print(f"[1/4] loading {args.image or 'the default image (scikit-image astronaut)'}")
    image = load_image(args.image)
    print(f"[2/4] merging: ratio {args.ratio}, tiles {args.tile_size}x{args.tile_size}, {args.similarity}, "
        f"temperature {args.temperature}")
    rec = reconstruct(image, args)
    n, d = rec.h * rec.w, rec.plan.num_kept
    print(f"      {rec.h}x{rec.w} tokens of {args.patch}x{args.patch} px: N={n} -> D={d} ({d / n:.0%} kept)")
    for name, approx in (("ToMA", rec.toma), ("ToMe (ComfyUI's scheme, same ratio)", rec.tome)):
        print(f"      {name}: merge->unmerge relative error {metrics.relative_error(approx, rec.pixels):.4f}, "
            f"PSNR {metrics.psnr(approx, rec.pixels):.2f} dB")
    print(READING)
    out = Path(args.out)
    title = (f"ToMA ratio {args.ratio}, tile {args.tile_size}, {args.similarity}: {n} -> {d} tokens, "
             f"merge->unmerge error {metrics.relative_error(rec.toma, rec.pixels):.4f}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # 256 median-cut colours: a third of the RGB file, no visible change; the README's picture ships in
        # the Registry archive (tests/test_packaging.py test_archive_is_small).
        from PIL import Image

        draw_panels(rec, args.tile_size, title).quantize(256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    except OSError as err:
        raise DemoError(f"cannot write {out}: {err}")
    print(f"[3/4] wrote {out}")
    if args.no_speed:
        print("[4/4] speed skipped (--no-speed)")
        return
    print(f"[4/4] timing one block on {device.type}: width {args.block_width}, {args.block_grid}x{args.block_grid} "
        f"tokens, {args.dtype}, median of {args.repeats} after {args.warmup} warm-up")
    times = time_block(rec, args, device)
    full = times["full block"]
    for name, ms in times.items():
        print(f"      {name:<40} {ms:9.2f} ms   {full / ms:5.2f}x")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # each step's line shows as it happens, piped too
    try:
        run(args)
    except DemoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
