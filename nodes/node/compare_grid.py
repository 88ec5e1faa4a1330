"""The ToMA Compare node's picture: each run's image side by side (a video: a strip of its frames per
run, one strip under the other), its caption underneath, the verdict and how it was timed at the
bottom. Drawn with Pillow, which ComfyUI itself requires (its nodes.py saves images with it).

Frames in and the picture out are ComfyUI's IMAGE layout, (F, H, W, C) and (1, H', W', C), values in
[0, 1].
"""

from __future__ import annotations

import re

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

STRIP_FRAMES = 4
"""Frames a video's strip shows, evenly spaced from the first to the last."""
GAP = 8
"""White pixels between panels and around the text."""
MIN_WIDTH = 128
"""Narrowest panel: a smaller image is enlarged (a 12 px caption line then holds "(repeats 0.67-1.13 s),")."""
FONT_DIVISOR = 40
"""Text height: the picture's width over this, within 12 - 28 px (a 3 x 1024 px row gets 28 px)."""
BACKGROUND, INK, WARNING = (255, 255, 255), (20, 20, 20), (170, 20, 20)


def comparison_picture(panels: list[tuple[torch.Tensor, str]], footer: list[str], header: list[str] | None = None) -> torch.Tensor:
    """The picture of `panels` (each run's frames (F, H, W, C) and its caption), with the `footer`
    lines under them and the `header` lines (what to read first) above them; (1, H', W', 3)."""
    strips = [(_strip(frames), caption) for frames, caption in panels]
    video = panels[0][0].shape[0] > 1
    width = strips[0][0].width if video else sum(strip.width + GAP for strip, _ in strips) - GAP
    font = _font(max(12, min(28, width // FONT_DIVISOR)))
    cells = [_captioned(strip, caption, font) for strip, caption in strips]
    canvas = _captioned(_stack(cells, vertical=video), "\n".join(footer), font)
    if header:
        canvas = _stack([_captioned(Image.new("RGB", (canvas.width, 0), BACKGROUND), "\n".join(header), font, WARNING), canvas], vertical=True)
    return torch.from_numpy(np.asarray(canvas, dtype=np.float32) / 255.0)[None]


def _strip(frames: torch.Tensor) -> Image.Image:
    """One image, or STRIP_FRAMES evenly spaced frames of a video side by side; enlarged by a whole
    factor (nearest pixel) to at least MIN_WIDTH, so that its caption's words fit under it."""
    picks = torch.linspace(0, frames.shape[0] - 1, min(STRIP_FRAMES, frames.shape[0])).round().long()
    images = [_pil(frames[int(i)]) for i in picks]
    strip = _stack(images, vertical=False) if len(images) > 1 else images[0]
    factor = -(-MIN_WIDTH // strip.width)
    return strip.resize((strip.width * factor, strip.height * factor), Image.NEAREST) if factor > 1 else strip


def _pil(frame: torch.Tensor) -> Image.Image:
    pixels = (frame[..., :3].detach().float().cpu().clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
    return Image.fromarray(pixels, "RGB")


def _stack(images: list[Image.Image], vertical: bool) -> Image.Image:
    """Images one after the other with GAP between them, left to right or top to bottom."""
    along = [image.height if vertical else image.width for image in images]
    across = max(image.width if vertical else image.height for image in images)
    length = sum(along) + GAP * (len(images) - 1)
    canvas = Image.new("RGB", (across, length) if vertical else (length, across), BACKGROUND)
    offset = 0
    for image, size in zip(images, along):
        canvas.paste(image, (0, offset) if vertical else (offset, 0))
        offset += size + GAP
    return canvas


def _captioned(image: Image.Image, text: str, font, ink: tuple[int, int, int] = INK) -> Image.Image:
    """`image` with `text` wrapped to its width underneath, in `ink`."""
    pen = ImageDraw.Draw(image)
    lines = [wrapped for paragraph in text.split("\n") for wrapped in _wrap(pen, paragraph, font, image.width - 2 * GAP)]
    height = pen.textbbox((0, 0), "Ag", font=font)[3] + GAP // 2
    canvas = Image.new("RGB", (image.width, image.height + GAP + height * len(lines) + GAP), BACKGROUND)
    canvas.paste(image, (0, 0))
    pen = ImageDraw.Draw(canvas)
    for row, line in enumerate(lines):
        pen.text((GAP, image.height + GAP + row * height), line, fill=ink, font=font)
    return canvas


UNIT = re.compile(r"\(?(s|dB|px|x|%|steps?|frames?)\W*")
"""A word that is the unit of the number before it ("7.43 s", "22.24 dB (identical)")."""
NUMBER = re.compile(r".*(\d|inf)")
LABELS = ("PSNR", "SSIM")
"""Words kept together with the number after them."""


def _words(text: str) -> list[str]:
    """The words of `text` split at spaces, a number kept together with the unit after it and a
    metric's name with its number."""
    words: list[str] = []
    for word in text.split():
        if words and (UNIT.fullmatch(word) and NUMBER.fullmatch(words[-1]) or words[-1] in LABELS):
            words[-1] = f"{words[-1]} {word}"
        else:
            words.append(word)
    return words


def _wrap(pen: ImageDraw.ImageDraw, text: str, font, width: int) -> list[str]:
    """`text` broken at spaces into lines no wider than `width`, never between a number and its unit
    (a longer word keeps its own line)."""
    lines: list[str] = []
    for word in _words(text):
        if lines and pen.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one fixed-size bitmap font
        return ImageFont.load_default()
