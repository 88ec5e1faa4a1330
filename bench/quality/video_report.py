"""Tables, real-size predictions and the frames picture of the video quality study (video_quality.py).

Rows are video_quality.VideoRow objects. "fewer steps at 14B time": the PSNR the unpatched run
reaches with the step count that takes as long on Wan 2.1 14B as the row is predicted to
(ref_steps / predicted speed-up), interpolated between the measured fewer-steps rows
(quality_report.steps_psnr_at; above the largest measured count it is that count's PSNR, a lower
bound). A row "beats fewer steps" when its mean PSNR is above that.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from . import quality_report

REAL = {"wan14b": 40, "wan1.3b": 30}
"""Real families of the prediction and their block counts."""
FIXTURE_BLOCKS = 6
BLOCK_RANGE = re.compile(r"^blocks:(\d+)-(\d+)$")


def real_blocks(blocks: str, depth: int) -> str:
    """A fixture block list mapped to `depth` blocks by position ("all" unchanged). "auto" is mapped
    as what it selects on the fixture (blocks 2-5 of 6), so the prediction prices the blocks whose
    quality was measured: on the real depth that skips 13 of 40 blocks, where the real "auto" skips 5."""
    from harness.pack import pack_module

    if blocks.strip().lower() == "auto":
        blocks = pack_module("nodes.machinery.dit_blocks").parse_dit_blocks("auto", {"blocks": FIXTURE_BLOCKS}).describe()
    match = BLOCK_RANGE.match(blocks)
    if match is None:
        return blocks
    lo, hi = int(match[1]), int(match[2])
    return f"blocks:{lo * depth // FIXTURE_BLOCKS}-{(hi + 1) * depth // FIXTURE_BLOCKS - 1}"


def _toma_inputs(row: Any) -> dict[str, Any] | None:
    for link in row.params.get("chain", []):
        if link["node"].startswith("ToMAPatch"):
            return link["inputs"]
    return None


def add_predictions(rows: list[Any], metas: list[dict]) -> None:
    """Fill row.predicted[family] for every measured row (see video_quality's docstring)."""
    from ..speed import realsize
    from ..speed import realsize_model as model

    cache = realsize.load_cache(realsize.CACHE)
    plans = realsize.PlanTimes(cache, "cpu")
    costs = {name: model.fit_family(name, cache) for name in REAL}
    steps_of = {m["regime"]: m["steps"] for m in metas}
    for row in rows:
        if row.skipped is not None:
            continue
        ref_steps, steps = steps_of[row.regime], row.params["steps"]
        skipped = steps / row.computed_steps if row.computed_steps else 1.0
        inputs = _toma_inputs(row)
        for name, depth in REAL.items():
            if inputs is None:
                row.predicted[name] = round(ref_steps / steps * skipped, 3)
                continue
            setting = model.Setting(inputs["ratio"], inputs["tile_size"], inputs["start_percent"], inputs["end_percent"],
                                    inputs["recompute_every"], inputs["merge_every"], real_blocks(inputs["blocks"], depth))
            cfg = 6.0 if ref_steps >= 20 else 1.0
            p = model.predict(costs[name], "480p", setting, 81, steps, "euler", "simple", cfg, plan_ms=plans)
            row.predicted[name] = round(p.speedup * skipped, 3)


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def fewer_steps_psnr(rows: list[Any], ref_steps: int, speedup: float | None) -> float | None:
    """Unpatched PSNR at the step count of the same time (ref_steps / speedup), interpolated."""
    points = [(r.params["steps"], r.psnr_mean) for r in rows if r.group == "fewer steps" and r.skipped is None]
    if not speedup or not points:
        return None
    return quality_report.steps_psnr_at(ref_steps / speedup, points)


HEAD = ("| row | steps | speed-up fixture | 14B pred. | 1.3B pred. | PSNR mean | worst frame | SSIM mean | "
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
        pred = r.predicted.get("wan14b")
        other = fewer_steps_psnr(rows, meta["steps"], pred) if r.group not in ("reference", "fewer steps") else None
        beats = "" if other is None else ("yes" if r.psnr_mean > other else "no")
        lines.append(
            f"| {r.label} | {r.params['steps']} | {_num(r.speedup, '.2f')} | {_num(pred, '.2f')} | "
            f"{_num(r.predicted.get('wan1.3b'), '.2f')} | {_num(r.psnr_mean, '.2f')} | {_num(r.psnr_worst_frame, '.2f')} | "
            f"{_num(r.ssim_mean, '.3f')} | {_num(r.ssim_worst_frame, '.3f')} | {_num(r.flicker_mean, '.3f')} | "
            f"{_num(r.flicker_worst_pair, '.3f')} | {_num(r.computed_steps, '.0f')} | {_num(other, '.2f')} | {beats} |")
    return lines


def markdown(header: str, command: str, metas: list[dict], rows: list[Any]) -> str:
    out = ["# Video quality on the trained Wan fixture", "", f"`{command}`", "", header, ""]
    for meta in metas:
        out += regime_table([r for r in rows if r.regime == meta["regime"]], meta) + [""]
    return "\n".join(out) + "\n"


# ---- frames picture ---------------------------------------------------------------------------------

def picture_rows(rows: list[Any], default: str) -> list[Any]:
    """reference | the row `default` | fewer steps nearest its 14B time | the best cache near its speed."""
    main = [r for r in rows if r.regime == "20 steps" and r.skipped is None]
    by_label = {r.label: r for r in main}
    toma = by_label.get(default)
    chosen = [by_label.get("unpatched"), toma]
    if toma is None:
        return [r for r in chosen if r is not None]
    target = toma.predicted.get("wan14b") or toma.speedup
    steps = [r for r in main if r.group == "fewer steps"]
    caches = [r for r in main if r.group in ("EasyCache", "TeaCache", "MagCache")]
    if steps:
        chosen.append(min(steps, key=lambda r: abs(r.params["steps"] - 20 / target)))
    if caches:
        near = [r for r in caches if (r.predicted.get("wan14b") or r.speedup) >= 0.8 * target] or caches
        chosen.append(max(near, key=lambda r: r.psnr_mean))
    return [r for r in chosen if r is not None]


def frames_picture(path: Path, rows: list[Any], clips: dict[str, np.ndarray], default: str = "ToMA node defaults") -> Path:
    """One strip of the 9 frames of seed 0 per picture row (picture_rows), labelled on the left."""
    from PIL import Image, ImageDraw

    chosen = [r for r in picture_rows(rows, default) if r.label in clips]
    frames = [np.concatenate(list(clips[r.label]), axis=1) for r in chosen]
    margin, height = 190, frames[0].shape[0]
    canvas = Image.new("RGB", (margin + frames[0].shape[1], height * len(frames)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (r, strip) in enumerate(zip(chosen, frames)):
        canvas.paste(Image.fromarray((strip * 255).round().astype(np.uint8)), (margin, i * height))
        speed = r.predicted.get("wan14b")
        text = r.label if speed is None else f"{r.label}\n14B {speed:.2f}x, {r.psnr_mean:.1f} dB"
        draw.multiline_text((4, i * height + 4), text, fill="black")
    canvas.save(path)
    return path
