"""Thumbnails for example_workflows/ and the pack icon, drawn by our own code from a real ToMA plan.

    python -m bench.publish.make_thumbnails            # every example_workflows/<name>.json -> <name>.jpg, assets/icon.png
    python -m bench.publish.make_thumbnails --check    # exit 1 if a workflow has no thumbnail (writes nothing)

ComfyUI's template browser shows `example_workflows/<name>.jpg` next to `<name>.json`, and the file name
as the template's title. Each picture is a scikit-image sample photograph cut into tokens, with the ToMA
tile grid and the destination tokens that `toma_core.make_plan` picks at the ratio and tile size set in
that workflow's (first) ToMA node. The plan comes from bench/publish/demo.py (`reconstruct`), so the
thumbnail shows exactly what the demo computes. The caption under it (the template's name, its ToMA
node's ratio, tile_size and start_percent, its scope where not "block", the token counts) is also stored
as the JPEG's comment, where tests/test_workflow_templates.py checks it against the template.

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
SCOPE_WIDGET = {"ToMAPatchAdvanced": 11}
"""Index of `scope` in a ToMA node's widgets_values (nodes/node/toma_nodes.py: basic_inputs, then
advanced_inputs); the basic node runs scope "block"."""
BLOCK_SCOPE, KEYS_VALUES_SCOPE = "block", "keys_values"
SAMPLE_IMAGES = {"sdxl": "chelsea", "wan": "rocket"}
"""Workflow name prefix (lower case) -> scikit-image sample picture (any other name gets the astronaut)."""

THUMB_GRID, THUMB_PATCH = 32, 16  # 32 x 32 tokens of 16 px: a 512 px picture
ICON_GRID, ICON_PATCH, ICON_TILE = 16, 16, 4  # 256 px icon

log = logging.getLogger("make_thumbnails")


def toma_settings(workflow: dict) -> tuple[float, int, float, str]:
    """(ratio, tile_size, start_percent, scope) of the first ToMA node in a UI-format workflow (both nodes'
    widgets start with ratio, tile_size, start_percent: nodes/node/toma_nodes.py)."""
    for node in workflow.get("nodes", []):
        if node.get("type") in PACK_NODE_TYPES:
            values, index = node["widgets_values"], SCOPE_WIDGET.get(node["type"])
            return float(values[0]), int(values[1]), float(values[2]), BLOCK_SCOPE if index is None else str(values[index])
    raise ValueError("the workflow has no ToMA node")


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


def fitted_font(pen, text: str, size: int, width: int):
    """The largest default font of at most `size` px (down to 12) in which `text` fits `width` px."""
    while size > 12 and pen.textlength(text, font=font(size)) > width:
        size -= 1
    return font(size)


def thumbnail(rec, tile_size: int, caption: list[str]):
    """Overlay with the caption underneath: a title line, then smaller lines."""
    from PIL import Image, ImageDraw

    picture = demo.overlay(rec, tile_size)
    title, *lines = caption
    canvas = Image.new("RGB", (picture.width, picture.height + 38 + 26 * len(lines)), "white")
    canvas.paste(picture, (0, 0))
    pen = ImageDraw.Draw(canvas)
    pen.text((12, picture.height + 6), title, fill="black", font=fitted_font(pen, title, 24, picture.width - 24))
    for row, line in enumerate(lines):
        pen.text((12, picture.height + 38 + 26 * row), line, fill=(70, 70, 70), font=fitted_font(pen, line, 18, picture.width - 24))
    return canvas


def caption(name: str, workflow: dict, rec) -> list[str]:
    """The template's name, its ToMA node's settings (as the node's widgets name them; the scope where
    not "block") and the tokens kept (of the keys and values, scope keys_values)."""
    ratio, tile_size, start_percent, scope = toma_settings(workflow)
    settings = f"ToMA: ratio {ratio:g}, tile_size {tile_size}, start_percent {start_percent:g}"
    kept = "keys and values" if scope == KEYS_VALUES_SCOPE else "tokens"
    return [name, settings if scope == BLOCK_SCOPE else f"{settings}, scope {scope}",
            f"{rec.h} x {rec.w} {kept}: {rec.h * rec.w} -> {rec.plan.num_kept} in {tile_size} x {tile_size} tiles (red = kept)"]


def workflow_thumbnail(path: Path):
    """The thumbnail image for one example workflow and its caption's lines."""
    workflow = json.loads(path.read_text(encoding="utf-8"))
    ratio, tile_size, _, _ = toma_settings(workflow)
    image = next((image for prefix, image in SAMPLE_IMAGES.items() if path.stem.lower().startswith(prefix)), "astronaut")
    rec = plan_picture(image, ratio, tile_size, THUMB_GRID, THUMB_PATCH)
    lines = caption(path.stem, workflow, rec)
    return thumbnail(rec, tile_size, lines), lines


def icon():
    """A 256 px square: the astronaut with its tile grid and destination tokens, no text."""
    rec = plan_picture("astronaut", 0.5, ICON_TILE, ICON_GRID, ICON_PATCH)
    return demo.overlay(rec, ICON_TILE, line_width=1)


def workflows() -> list[Path]:
    return sorted(EXAMPLES.glob("*.json"))


def write_all() -> list[Path]:
    written = []
    for path in workflows():
        target = path.with_suffix(".jpg")
        picture, lines = workflow_thumbnail(path)
        picture.save(target, quality=80, optimize=True, comment="\n".join(lines))
        written.append(target)
    ASSETS.mkdir(exist_ok=True)
    icon().quantize(colors=64).save(ASSETS / "icon.png", optimize=True)  # palette PNG: small
    written.append(ASSETS / "icon.png")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report workflows without a thumbnail")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.check:
        missing = [path for path in workflows() if not path.with_suffix(".jpg").is_file()]
        for path in missing:
            log.error("no thumbnail for %s", path.relative_to(REPO))
        return 1 if missing else 0
    for target in write_all():
        log.info("wrote %s (%d bytes)", target.relative_to(REPO), target.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
