"""Thumbnails for example_workflows/ and the pack icon, drawn by our own code from a real ToMA plan.

    python -m bench.publish.make_thumbnails            # every example_workflows/<name>.json -> <name>.jpg, assets/icon.png
    python -m bench.publish.make_thumbnails --check    # exit 1 if a workflow has no thumbnail (writes nothing)

ComfyUI's template browser shows `example_workflows/<name>.jpg` next to `<name>.json`. Each picture is a
scikit-image sample photograph cut into tokens, with the ToMA tile grid and the destination tokens that
`toma_core.make_plan` picks at the ratio and tile size set in that workflow's ToMA node. The plan comes
from bench/publish/demo.py (`reconstruct`), so the thumbnail shows exactly what the demo computes.

Needs pillow and scikit-image (`pip install -e ".[demo]"`). Deterministic: same inputs, same files.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import demo

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_workflows"
ASSETS = REPO / "assets"
PACK_NODE_TYPES = ("ToMAPatch", "ToMAPatchAdvanced")
SAMPLE_IMAGES = {"flux": "astronaut", "sdxl": "chelsea", "sd15": "coffee", "wan": "rocket"}
"""Workflow name prefix -> scikit-image sample picture (any other name gets the astronaut)."""
MODEL_TITLES = {"flux": "Flux", "flux2": "Flux.2", "sdxl": "SDXL", "wan": "Wan", "z_image": "Z-Image"}
"""Workflow name without "_toma" -> the model name in its thumbnail's title."""

THUMB_GRID, THUMB_PATCH = 32, 16  # 32 x 32 tokens of 16 px: a 512 px picture
ICON_GRID, ICON_PATCH, ICON_TILE = 16, 16, 4  # 256 px icon

log = logging.getLogger("make_thumbnails")


def toma_settings(workflow: dict) -> tuple[float, int]:
    """(ratio, tile_size) of the first ToMA node in a UI-format workflow (widgets in schema order)."""
    for node in workflow.get("nodes", []):
        if node.get("type") in PACK_NODE_TYPES:
            ratio, tile_size = node["widgets_values"][:2]
            return float(ratio), int(tile_size)
    raise ValueError("the workflow has no ToMA node")


def sample_image_for(name: str) -> str:
    return next((image for prefix, image in SAMPLE_IMAGES.items() if name.startswith(prefix)), "astronaut")


def plan_picture(image_name: str, ratio: float, tile_size: int, grid: int, patch: int):
    """bench/publish/demo.py's Reconstruction (pixels, token grid, plan) for a scikit-image sample picture."""
    args = demo.parse_args(["--ratio", str(ratio), "--tile-size", str(tile_size), "--grid", str(grid),
                            "--patch", str(patch), "--no-speed", "--device", "cpu"])
    demo.settle(args, demo.pick_device("cpu"))
    image = demo.fid.load_sample_image(image_name)
    return demo.reconstruct(image, args)


def font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pillow < 10.1: fixed-size bitmap font
        return ImageFont.load_default()


def overlay(rec, tile_size: int, line_width: int = 2):
    """The picture, lightened, with the tile grid (blue) and each destination token (red dot)."""
    from PIL import Image, ImageDraw

    picture = Image.fromarray((rec.pixels.clamp(0, 1) * 255 + 0.5).byte().numpy())
    picture = Image.blend(picture, Image.new("RGB", picture.size, "white"), 0.3)
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


def thumbnail(rec, tile_size: int, title: str, subtitle: str):
    """Overlay with a two-line caption band underneath."""
    from PIL import Image, ImageDraw

    picture = overlay(rec, tile_size)
    band = 64
    canvas = Image.new("RGB", (picture.width, picture.height + band), "white")
    canvas.paste(picture, (0, 0))
    pen = ImageDraw.Draw(canvas)
    pen.text((12, picture.height + 6), title, fill="black", font=font(24))
    pen.text((12, picture.height + 36), subtitle, fill=(70, 70, 70), font=font(18))
    return canvas


def workflow_thumbnail(path: Path):
    """The thumbnail image for one example workflow."""
    workflow = json.loads(path.read_text(encoding="utf-8"))
    ratio, tile_size = toma_settings(workflow)
    rec = plan_picture(sample_image_for(path.stem), ratio, tile_size, THUMB_GRID, THUMB_PATCH)
    n, d = rec.h * rec.w, rec.plan.num_kept
    model = MODEL_TITLES[path.stem.removesuffix("_toma")]
    subtitle = f"ratio {ratio:g}, tile {tile_size}x{tile_size}: {n} -> {d} tokens (red = kept)"
    return thumbnail(rec, tile_size, f"ToMA token merging - {model}", subtitle)


def icon():
    """A 256 px square: the astronaut with its tile grid and destination tokens, no text."""
    rec = plan_picture("astronaut", 0.5, ICON_TILE, ICON_GRID, ICON_PATCH)
    return overlay(rec, ICON_TILE, line_width=1)


def workflows() -> list[Path]:
    return sorted(EXAMPLES.glob("*.json"))


def write_all() -> list[Path]:
    written = []
    for path in workflows():
        target = path.with_suffix(".jpg")
        workflow_thumbnail(path).save(target, quality=80, optimize=True)
        written.append(target)
    ASSETS.mkdir(exist_ok=True)
    icon().quantize(colors=64).save(ASSETS / "icon.png", optimize=True)  # palette PNG: small
    written.append(ASSETS / "icon.png")
    return written


def missing_thumbnails() -> list[Path]:
    return [path for path in workflows() if not path.with_suffix(".jpg").is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report workflows without a thumbnail")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.check:
        missing = missing_thumbnails()
        for path in missing:
            log.error("no thumbnail for %s", path.relative_to(REPO))
        return 1 if missing else 0
    for target in write_all():
        log.info("wrote %s (%d bytes)", target.relative_to(REPO), target.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
