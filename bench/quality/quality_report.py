"""Tables and figures of bench/quality/quality.py: the comparison with "fewer steps at the same time", the
Markdown tables, a Pareto plot (PSNR against speed-up) and an image grid per family.

Rows are quality.RowResult objects (duck-typed: family, label, group, speedup, psnr_mean, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

STEPS_GROUP = "fewer steps"
BASELINE_GROUPS = ("reference", STEPS_GROUP, "check")
GRID_COLUMNS = ("reference", "ToMA node defaults", "fewer steps at the same time", "EasyCache at the same time")
DEFAULT_LABEL = "ToMA node defaults"


def fit_overhead(points: Sequence[tuple[float, float]]) -> float:
    """Share of a full run's time that does not scale with the step count, fitted to the fewer-steps
    rows' measured speed-ups: speed-up(x) = 1 / (a + (1 - a) x) for x = steps / full steps.

    Least squares on 1 / speed-up (linear in a); clamped to [0, 0.9]. One parameter for every
    fewer-steps row smooths their timing noise, so the baseline is monotone in speed-up.
    """
    pairs = [(x, 1 / r) for x, r in points if x < 1]
    den = sum((1 - x) ** 2 for x, _ in pairs)
    if not den:
        return 0.0
    return min(0.9, max(0.0, sum((t - x) * (1 - x) for x, t in pairs) / den))


def same_time_steps(speedup: float, overhead: float, full_steps: int) -> float:
    """Step count of the unpatched run that takes as long as a run with this speed-up (fitted model)."""
    return (1 / speedup - overhead) / (1 - overhead) * full_steps


def steps_psnr_at(steps: float, points: Sequence[tuple[int, float]]) -> float | None:
    """PSNR the fewer-steps baseline reaches at `steps` (fractional), from its (steps, PSNR) points.

    Linear between the two measured step counts around `steps`. Above the largest measured count
    it is that count's PSNR: more steps only get closer to the reference, so this is a lower bound
    on what fewer steps gives there (the comparison then favours the row). Below the smallest
    measured count: None (not measured).
    """
    pts = sorted(points)
    if not pts or steps < pts[0][0]:
        return None
    if steps >= pts[-1][0]:
        return pts[-1][1]
    for (s0, p0), (s1, p1) in zip(pts, pts[1:]):
        if s0 <= steps <= s1:
            return p0 + (p1 - p0) * (steps - s0) / (s1 - s0)
    return None


def compare_with_fewer_steps(rows: list[Any]) -> float:
    """Set same_time_steps, steps_psnr_at_speedup and beats_fewer_steps on the measured rows of one
    family; return the fitted overhead share (fit_overhead)."""
    full = next(r.params["steps"] for r in rows if r.group == "reference")
    steps_rows = [r for r in rows if r.group == STEPS_GROUP and r.skipped is None]
    overhead = fit_overhead([(r.params["steps"] / full, r.speedup) for r in steps_rows])
    points = [(r.params["steps"], r.psnr_mean) for r in steps_rows]
    for r in rows:
        if r.skipped is not None or r.group in BASELINE_GROUPS:
            continue
        r.same_time_steps = round(same_time_steps(r.speedup, overhead, full), 2)
        at = steps_psnr_at(r.same_time_steps, points)
        r.steps_psnr_at_speedup = None if at is None else round(at, 3)
        r.beats_fewer_steps = None if at is None else bool(r.psnr_mean > at)
    return overhead


def _num(value: float | None, fmt: str) -> str:
    if value is None:
        return "–"
    return "inf" if math.isinf(value) else format(value, fmt)


def _beats(value: bool | None) -> str:
    return {None: "–", True: "**yes**", False: "no"}[value]


def family_table(rows: list[Any]) -> list[str]:
    """Markdown table lines of one family's measured rows, then the skipped ones."""
    lines = [
        "| row | group | speed-up | (wall) | PSNR mean (dB) | PSNR min (dB) | SSIM | s per run | steps in the same time | their PSNR (dB) | beats fewer steps |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        if r.skipped is None:
            lines.append(
                f"| {r.label} | {r.group} | {_num(r.speedup, '.2f')}x | {_num(r.speedup_wall, '.2f')}x | {_num(r.psnr_mean, '.1f')} | "
                f"{_num(r.psnr_min, '.1f')} | {_num(r.ssim_mean, '.3f')} | {_num(r.seconds, '.2f')} | "
                f"{_num(r.same_time_steps, '.1f')} | {_num(r.steps_psnr_at_speedup, '.1f')} | {_beats(r.beats_fewer_steps)} |"
            )
    skipped = [f"{r.label} ({r.skipped})" for r in rows if r.skipped is not None]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return lines


def winners(rows: list[Any]) -> str:
    """One line: the ToMA rows whose PSNR beats fewer steps at their speed-up (speed-up > 1.02 only)."""
    won = [r for r in rows if r.beats_fewer_steps and r.group.startswith("ToMA") and r.speedup > 1.02]
    if not won:
        return "No ToMA row beats fewer steps at the same speed-up."
    return "ToMA rows above fewer steps at the same speed-up: " + "; ".join(
        f"{r.label} ({r.speedup:.2f}x, {r.psnr_mean:.1f} vs {r.steps_psnr_at_speedup:.1f} dB)" for r in won) + "."


def _threshold(row: Any) -> float | None:
    return next((c["inputs"]["reuse_threshold"] for c in row.params["chain"] if c["node"] == "EasyCache"), None)


def combined_lines(rows: list[Any]) -> list[str]:
    """Each ToMA + EasyCache row beside EasyCache alone at the same threshold."""
    alone = {_threshold(r): r for r in rows if r.group == "EasyCache" and r.skipped is None}
    lines = []
    for r in rows:
        base = alone.get(_threshold(r)) if r.group == "ToMA + EasyCache" and r.skipped is None else None
        if base is not None:
            lines.append(f"- {r.label}: {r.speedup:.2f}x, {_num(r.psnr_mean, '.1f')} dB; {base.label} alone: "
                         f"{base.speedup:.2f}x, {_num(base.psnr_mean, '.1f')} dB")
    return lines


def _toma_inputs(row: Any) -> dict[str, Any] | None:
    """The inputs of the row's single ToMA node, None for other chains."""
    toma = [c for c in row.params.get("chain", []) if c["node"].startswith("ToMAPatch")]
    return toma[0]["inputs"] if len(toma) == 1 and len(row.params["chain"]) == 1 else None


def _base_key(row: Any) -> tuple[float, float] | None:
    inputs = _toma_inputs(row)
    return None if inputs is None else (inputs["ratio"], inputs["start_percent"])


BASE_LABEL = re.compile(r"^ToMA [\d.]+( start [\d.]+)?$")
"""Rows that set only ratio (and start_percent): what a lever row is compared with."""


def lever_lines(rows: list[Any]) -> list[str]:
    """Each lever (a schedule or advanced row) against plain ToMA at the same ratio and start."""
    base = {_base_key(r): r for r in rows if BASE_LABEL.match(r.label) and r.group.startswith("ToMA") and r.skipped is None}
    lines = ["| lever | against | speed-up | PSNR (dB) | change (dB) | beats fewer steps |", "|---|---|---:|---:|---:|:---:|"]
    for r in rows:
        levers = r.group in ("ToMA schedule", "ToMA advanced") and r.skipped is None
        b = base.get(_base_key(r)) if levers else None
        if b is not None and b is not r:
            lines.append(f"| {r.label} | {b.label} | {b.speedup:.2f}x -> {r.speedup:.2f}x | "
                         f"{_num(b.psnr_mean, '.1f')} -> {_num(r.psnr_mean, '.1f')} | "
                         f"{_num(r.psnr_mean - b.psnr_mean, '+.1f')} | {_beats(r.beats_fewer_steps)} |")
    return lines if len(lines) > 2 else []


def margin(row: Any) -> float | None:
    """dB above (+) or below (-) fewer steps at the row's speed-up."""
    return None if row.steps_psnr_at_speedup is None else row.psnr_mean - row.steps_psnr_at_speedup


def across_families(families: list[str], rows: list[Any]) -> list[str]:
    """ToMA rows measured on every family, by their worst margin over fewer steps."""
    by = {(r.family, r.label): r for r in rows if r.skipped is None and r.group.startswith("ToMA")}
    labels = [lab for lab in dict.fromkeys(lab for _, lab in by) if all((f, lab) in by for f in families)]
    if len(families) < 2 or not labels:
        return []

    def worst(label: str) -> float:
        margins = [margin(by[f, label]) for f in families]
        return min((m for m in margins if m is not None), default=-math.inf)

    head = " | ".join(f"{f}: speed-up, PSNR, margin" for f in families)
    lines = [f"| row | {head} |", "|---|" + "---:|" * len(families)]
    for label in sorted(labels, key=worst, reverse=True):
        cells = [by[f, label] for f in families]
        lines.append(f"| {label} | " + " | ".join(
            f"{c.speedup:.2f}x, {_num(c.psnr_mean, '.1f')} dB, {_num(margin(c), '+.1f')}" for c in cells) + " |")
    return lines


def markdown(header: str, metas: list[dict], rows: list[Any]) -> str:
    """quality.md: the setup line, then per family its sampler settings, table and winners."""
    out = ["# Image quality on the trained fixtures (bench/quality/quality.py)", "", header.rstrip("; "), ""]
    for meta in metas:
        fam_rows = run_rows(meta, rows)
        s = meta["sampler"]
        out += [
            f"## {run_name(meta)}", "",
            f"{meta['steps']} steps {s['sampler_name']} / {s['scheduler']}, cfg {s['cfg']}, latent {meta['latent']}, "
            f"seeds {meta['seeds']}, {meta['repeats']} timed pass(es), {meta['threads']} thread(s), "
            f"{meta['seconds']:.0f} s. PSNR and SSIM against the unpatched image of the same seed at the full "
            f"step count; speed-up of the whole sampling call against it, interleaved, on the {meta['clock']} "
            f"clock ((wall): elapsed time). Timing noise between consecutive reference runs: "
            + ", ".join(f"{c} {j:.1%}" for c, j in meta["reference_jitter"].items())
            + f". Share of a run that does not scale with steps (fit to the fewer-steps rows): "
            f"{meta['step_overhead']:.0%}.", "",
            *family_table(fam_rows), "", winners(fam_rows), "",
        ]
        combined = combined_lines(fam_rows)
        if combined:
            out += ["ToMA + EasyCache against EasyCache alone:", "", *combined, ""]
        levers = lever_lines(fam_rows)
        if levers:
            out += [f"Levers on {meta['family']}, each against plain ToMA at the same ratio:", "", *levers, ""]
    across = across_families([m["family"] for m in metas], rows) if len({m["steps"] for m in metas}) == 1 else []
    if across:
        out += ["## ToMA rows on every family", "",
                "Margin: dB above (+) or below (-) fewer steps at the same speed-up ('–': beyond the fastest "
                "fewer-steps row). Sorted by the worst margin over the families.", "", *across, ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------ figures

COLORS = {"fewer steps": "black", "ToMA defaults": "tab:red", "ToMA ratio": "tab:red", "ToMA schedule": "tab:orange",
          "ToMA advanced": "tab:purple", "EasyCache": "tab:blue", "LazyCache": "tab:cyan",
          "ToMA + EasyCache": "tab:green", "ToMe": "tab:brown", "ToMA added": "tab:pink", "added": "tab:olive"}


def run_name(meta: dict) -> str:
    """A run's name in headings and figure names: its family, with the steps when a run had several."""
    return meta.get("name", meta["family"])


def run_rows(meta: dict, rows: list[Any]) -> list[Any]:
    """The rows of one run (family and reference step count)."""
    return [r for r in rows if r.family == meta["family"] and getattr(r, "regime", None) in (None, meta["steps"])]


def write_figures(out: Path, metas: list[dict], rows: list[Any], images: dict[tuple[str, int], dict[str, dict[int, np.ndarray]]]) -> None:
    """pareto_<run>.png and grid_<run>.png for every run (images by (family, steps))."""
    import matplotlib

    matplotlib.use("Agg")
    for meta in metas:
        name = run_name(meta)
        run = [r for r in run_rows(meta, rows) if r.skipped is None]
        pareto_plot(out / f"pareto_{name}.png", name, run)
        image_grid(out / f"grid_{name}.png", name, run, images[(meta["family"], meta["steps"])])


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats in both speed-up and PSNR, by speed-up."""
    front, best = [], -math.inf
    for s, p in sorted(points, key=lambda sp: (-sp[0], -sp[1])):
        if p > best:
            front.append((s, p))
            best = p
    return sorted(front)


def labelled(rows: list[Any], front: list[tuple[float, float]]) -> set[str]:
    """Rows named on the plot (the table lists every row): fewer steps, the node defaults, the Pareto
    front and each group's best PSNR."""
    names = {r.label for r in rows if r.group == STEPS_GROUP or r.label == DEFAULT_LABEL
             or (r.speedup, r.psnr_mean) in front}
    for group in {r.group for r in rows}:
        names.add(max((r for r in rows if r.group == group), key=lambda r: r.psnr_mean).label)
    return names


def pareto_plot(path: Path, family: str, rows: list[Any]) -> None:
    """PSNR against speed-up: one colour per group, fewer steps as a line, the Pareto front dashed."""
    import matplotlib.pyplot as plt

    finite = [r for r in rows if math.isfinite(r.psnr_mean) and r.group not in ("reference", "check")]
    front = pareto_front([(r.speedup, r.psnr_mean) for r in finite])
    named = labelled(finite, front)
    fig, ax = plt.subplots(figsize=(10, 6.5))
    for group, color in COLORS.items():
        pts = sorted((r.speedup, r.psnr_mean, r.label) for r in finite if r.group == group)
        if not pts:
            continue
        xs, ys, labels = zip(*pts)
        style = "-o" if group == STEPS_GROUP else "o"
        ax.plot(xs, ys, style, color=color, label=group, markersize=5)
        for x, y, label in pts:
            if label in named:
                ax.annotate(label, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points", color=color)
    if front:
        ax.plot(*zip(*front), "--", color="grey", linewidth=0.8, label="Pareto front")
    ax.set_xlabel("speed-up of the sampling call against unpatched (same run, interleaved)")
    ax.set_ylabel("PSNR against the unpatched image (dB, mean over seeds)")
    ax.set_title(f"{family}: quality against speed-up (named: fewer steps, Pareto front, node defaults, "
                 "best of each group; every row is in the table)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def nearest(rows: list[Any], group: str, speedup: float) -> Any | None:
    """The row of `group` whose speed-up is closest to `speedup`."""
    candidates = [r for r in rows if r.group == group]
    return min(candidates, key=lambda r: abs(r.speedup - speedup), default=None)


def grid_rows(rows: list[Any]) -> list[Any | None]:
    """The grid's columns: reference, the node defaults, the fewer-steps row nearest to the defaults'
    same-time step count and the EasyCache row nearest to their speed-up."""
    by_label = {r.label: r for r in rows}
    default = by_label.get(DEFAULT_LABEL)
    speed = default.speedup if default else 1.0
    same_steps = default.same_time_steps if default and default.same_time_steps is not None else 0.0
    fewer = min((r for r in rows if r.group == STEPS_GROUP), key=lambda r: abs(r.params["steps"] - same_steps), default=None)
    return [by_label.get("unpatched"), default, fewer, nearest(rows, "EasyCache", speed)]


def image_grid(path: Path, family: str, rows: list[Any], images: dict[str, dict[int, np.ndarray]], max_seeds: int = 4) -> None:
    """One line of images per seed: reference | ToMA defaults | fewer steps | EasyCache."""
    import matplotlib.pyplot as plt

    columns = grid_rows(rows)
    seeds = sorted(next(iter(images.values())))[:max_seeds]
    fig, axes = plt.subplots(len(seeds), len(columns), figsize=(3 * len(columns), 3.1 * len(seeds)), squeeze=False)
    for j, (title, row) in enumerate(zip(GRID_COLUMNS, columns)):
        for i, seed in enumerate(seeds):
            ax = axes[i, j]
            ax.axis("off")
            if row is None:
                continue
            ax.imshow(np.clip(images[row.label][seed], 0, 1), interpolation="nearest")
            psnr = row.psnr_per_seed[seed]
            detail = "" if j == 0 else f"\n{row.label}, {row.speedup:.2f}x, {_num(psnr, '.1f')} dB"
            ax.set_title((f"seed {seed}: " if j == 0 else "") + title + detail, fontsize=7)
    fig.suptitle(f"{family}: reference | ToMA defaults | fewer steps | EasyCache at the same time", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
