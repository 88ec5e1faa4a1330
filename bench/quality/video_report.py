"""Tables, real-size predictions and the frames picture of the video quality study (video_quality.py).

Rows are video_quality.VideoRow objects. "fewer steps at 14B time": the PSNR the unpatched run
reaches with the step count that takes as long on Wan 2.2 14B as the row is predicted to
(ref_steps / predicted speed-up), interpolated between the measured fewer-steps rows
(quality_report.steps_psnr_at; above the largest measured count it is that count's PSNR, a lower
bound). A row "beats fewer steps" when its mean PSNR is above that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import quality_report, real_speed

TARGET = real_speed.TARGETS["wan"][0].key
"""The real run the rows are priced on (real_speed.py: Wan 2.2 14B, 832 x 480 x 81)."""


def add_predictions(rows: list[Any], metas: list[dict]) -> None:
    """Fill row.predicted for every measured row (real_speed.Pricer: the ToMA node through the
    real-size cost model, steps and caches by the model calls that ran)."""
    pricer = real_speed.Pricer("wan")
    steps_of = {m["regime"]: m["steps"] for m in metas}
    for row in rows:
        if row.skipped is None:
            row.predicted = pricer.price(row.params["chain"], steps_of[row.regime], row.computed_steps)


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def fewer_steps_psnr(rows: list[Any], ref_steps: int, speedup: float | None) -> float | None:
    """Unpatched PSNR at the step count of the same time (ref_steps / speedup), interpolated."""
    points = [(r.params["steps"], r.psnr_mean) for r in rows if r.group == "fewer steps" and r.skipped is None]
    if not speedup or not points:
        return None
    return quality_report.steps_psnr_at(ref_steps / speedup, points)


HEAD = ("| row | steps | speed-up fixture | Wan 2.2 14B pred. | PSNR mean | worst frame | SSIM mean | "
        "worst frame | flicker mean | worst pair | computed steps | fewer steps at 14B time | beats |")
COLUMNS = HEAD.count("|") - 1


def regime_table(rows: list[Any], meta: dict) -> list[str]:
    lines = [f"### {meta['regime']} (reference: unpatched {meta['steps']} steps, {meta['reference_seconds']:.2f} s a clip "
             f"on the fixture; reference-to-reference clock change {100 * meta['reference_jitter']:.1f} %)", "",
             HEAD, "|---|" + "---:|" * (COLUMNS - 1)]
    for r in rows:
        if r.skipped is not None:
            lines.append(f"| {r.label} | skipped: {r.skipped[:120]} |" + " |" * (COLUMNS - 2))
            continue
        pred = r.predicted.get(TARGET)
        other = fewer_steps_psnr(rows, meta["steps"], pred) if r.group not in ("reference", "fewer steps") else None
        beats = "" if other is None else ("yes" if r.psnr_mean > other else "no")
        lines.append(
            f"| {r.label} | {r.params['steps']} | {_num(r.speedup, '.2f')} | {_num(pred, '.2f')} | "
            f"{_num(r.psnr_mean, '.2f')} | {_num(r.psnr_worst_frame, '.2f')} | "
            f"{_num(r.ssim_mean, '.3f')} | {_num(r.ssim_worst_frame, '.3f')} | {_num(r.flicker_mean, '.3f')} | "
            f"{_num(r.flicker_worst_pair, '.3f')} | {_num(r.computed_steps, '.0f')} | {_num(other, '.2f')} | {beats} |")
    return lines


def markdown(header: str, command: str, metas: list[dict], rows: list[Any]) -> str:
    out = ["# Video quality on the trained Wan fixture", "", f"`{command}`", "", header, ""]
    for meta in metas:
        out += regime_table([r for r in rows if r.regime == meta["regime"]], meta) + [""]
    return "\n".join(out) + "\n"


# ---- frames picture ---------------------------------------------------------------------------------

def picture_rows(rows: list[Any], default: str | None) -> list[Any]:
    """reference | the row `default` (None: the best keys/values row) | the best block-merge row | fewer
    steps nearest the first ToMA row's Wan 14B time | the best cache at least 0.8x as fast."""
    main = [r for r in rows if r.regime == "20 steps" and r.skipped is None]
    by_label = {r.label: r for r in main}

    def best(groups: tuple[str, ...]) -> Any | None:
        return max((r for r in main if r.group in groups), key=lambda r: r.psnr_mean, default=None)

    toma = by_label.get(default) if default else best(("keys_values", "keys_values no mass"))
    chosen = [by_label.get("unpatched"), toma, best(("block merge",))]
    if toma is None:
        return [r for r in chosen if r is not None]
    target = toma.predicted.get(TARGET) or toma.speedup
    steps = [r for r in main if r.group == "fewer steps"]
    caches = [r for r in main if r.group in ("EasyCache", "LazyCache", "TeaCache", "MagCache")]
    if steps:
        chosen.append(min(steps, key=lambda r: abs(r.params["steps"] - 20 / target)))
    if caches:
        near = [r for r in caches if (r.predicted.get(TARGET) or r.speedup) >= 0.8 * target] or caches
        chosen.append(max(near, key=lambda r: r.psnr_mean))
    return [r for r in chosen if r is not None]


def frames_picture(path: Path, rows: list[Any], clips: dict[str, np.ndarray], default: str | None = None) -> Path:
    """One strip of the 9 frames of seed 0 per picture row (picture_rows), labelled on the left."""
    from PIL import Image, ImageDraw

    chosen = [r for r in picture_rows(rows, default) if r.label in clips]
    frames = [np.concatenate(list(clips[r.label]), axis=1) for r in chosen]
    margin, height = 190, frames[0].shape[0]
    canvas = Image.new("RGB", (margin + frames[0].shape[1], height * len(frames)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (r, strip) in enumerate(zip(chosen, frames)):
        canvas.paste(Image.fromarray((strip * 255).round().astype(np.uint8)), (margin, i * height))
        speed = r.predicted.get(TARGET)
        text = r.label if speed is None else f"{r.label}\n14B {speed:.2f}x, {r.psnr_mean:.1f} dB"
        draw.multiline_text((4, i * height + 4), text, fill="black")
    canvas.save(path)
    return path
