"""Every method a user has, at its predicted real-size speed-up: the picture and tables of the scope study.

    python -m bench.quality.scope_report --image /tmp/qs/flux /tmp/qs/flux_064 --image /tmp/qs/sdxl \
        --video /tmp/vq /tmp/vq_064 --out bench/out/scope

Reads quality.py runs (quality.json, one --image per fixture) and video_quality.py runs
(video_quality.json): the first folder of a group is the main run; later ones (another ComfyUI tree,
e.g. the third-party caches that import on 0.3.64 only, stack rows added later, a re-run) add their
rows, replacing the main run's rows of the same label, and the report names their tree and checks
that their fewer-steps rows match the main run's. Every row is priced by real_speed.py (predicted real-size end-to-end speed-up,
never the fixture's clock) and drawn as one marker per method: keys/values (with and without the
log-mass weight), block merge, fewer steps (a line), each step cache, and the stack (ToMA + a cache).

Writes under --out: scope.md (image fixtures), scope_video.md (Wan), methods_<fixture>_<steps>.png.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import quality_report, real_speed

METHODS: dict[str, tuple[str, str]] = {
    "keys/values": ("o", "tab:red"),
    "keys/values, no log-mass": ("s", "tab:orange"),
    "block merge": ("^", "tab:purple"),
    "EasyCache": ("D", "tab:blue"),
    "LazyCache": ("v", "tab:cyan"),
    "TeaCache": ("P", "tab:green"),
    "MagCache": ("X", "tab:olive"),
    "stack": ("*", "tab:brown"),
}
"""Marker and colour of each method; "fewer steps" is the black line."""

FEWER = "fewer steps"
LEVELS = (1.1, 1.25, 1.5, 2.0, 3.0)
"""Predicted speed-ups at which the methods' best rows are compared."""


@dataclass
class Point:
    """One measured row of a fixture and regime (reference steps), whichever study measured it."""

    fixture: str
    regime: int
    label: str
    group: str
    steps: int
    chain: list[dict[str, Any]]
    computed: float
    psnr: float
    ssim: float
    worst: float
    flicker: float | None = None
    log: str = ""
    tree: str = ""
    predicted: dict[str, float] = field(default_factory=dict)

    @property
    def method(self) -> str | None:
        """The method the row stands for (None: the reference and the identity check)."""
        toma = real_speed.toma_inputs(self.chain)
        caches = [link["node"] for link in self.chain if not link["node"].startswith("ToMAPatch")]
        if toma is not None and caches:
            return "stack"
        if toma is not None:
            if toma.get("ratio", 0) == 0:
                return None
            if toma.get("scope") == "keys_values":
                return "keys/values" if toma.get("key_mass", True) else "keys/values, no log-mass"
            return "block merge"
        if caches:
            return caches[0]
        return FEWER if self.steps < self.regime else None


@dataclass
class Run:
    """The points of one fixture from one or more study folders, with what the report says of them."""

    fixture: str
    points: list[Point]
    metas: dict[int, dict[str, Any]]
    commands: list[str]
    setups: list[str]
    skipped: dict[int, list[str]]
    notes: list[str]
    frames: Path | None = None
    """The main video run's frames picture (video_quality.py: seed 0 at 20 steps)."""


def _tree(setup: str) -> str:
    return setup.split(";", 1)[0].strip()


def image_points(data: dict[str, Any]) -> tuple[list[Point], dict[int, dict], dict[int, list[str]]]:
    """Points, metas and skip reasons by regime of a quality.py run (one fixture)."""
    points, skipped = [], {}
    metas = {m["steps"]: m for m in data["families"]}
    for r in data["rows"]:
        regime = r.get("regime") or data["families"][0]["steps"]
        if r["skipped"] is not None:
            skipped.setdefault(regime, []).append(f"{r['label']} ({r['skipped']})")
            continue
        psnr, label = r["psnr_mean"], r["label"]
        seeds = r.get("psnr_per_seed") or []
        if math.isinf(psnr) and any(math.isfinite(v) for v in seeds):
            psnr = mse_psnr(seeds)
            same = [str(i) for i, v in enumerate(seeds) if math.isinf(v)]
            label = f"{label} (seed {', '.join(same)} identical; PSNR of the mean MSE)"
        points.append(Point(r["family"], regime, label, r["group"], r["params"]["steps"], r["params"]["chain"],
                            r.get("computed_steps") or r["params"]["steps"], psnr, r["ssim_mean"], r["psnr_min"],
                            log=r.get("log", ""), tree=_tree(data["setup"])))
    return points, metas, skipped


def mse_psnr(psnrs: list[float]) -> float:
    """PSNR of the mean squared error over seeds (an identical seed counts as error 0), for rows whose
    mean PSNR is inf because a cache skipped nothing on some seeds."""
    return -10 * math.log10(sum(10 ** (-v / 10) for v in psnrs) / len(psnrs))


def video_points(data: dict[str, Any]) -> tuple[list[Point], dict[int, dict], dict[int, list[str]]]:
    """Points, metas and skip reasons by regime of a video_quality.py run."""
    steps_of = {m["regime"]: m["steps"] for m in data["regimes"]}
    points, skipped = [], {}
    for r in data["rows"]:
        regime = steps_of[r["regime"]]
        if r["skipped"] is not None:
            skipped.setdefault(regime, []).append(f"{r['label']} ({r['skipped']})")
            continue
        points.append(Point("wan", regime, r["label"], r["group"], r["params"]["steps"], r["params"]["chain"],
                            r["computed_steps"], r["psnr_mean"], r["ssim_mean"], r["psnr_worst_frame"], r["flicker_mean"],
                            log=r.get("log", ""), tree=_tree(data["setup"])))
    return points, {m["steps"]: m for m in data["regimes"]}, skipped


def load(folders: list[Path], video: bool) -> Run:
    """One fixture's run from its folders: the first is the main run, later ones add (or replace) rows."""
    points: list[Point] = []
    metas: dict[int, dict] = {}
    skipped: dict[int, list[str]] = {}
    commands, setups, notes = [], [], []
    for i, folder in enumerate(folders):
        data = json.loads((folder / ("video_quality.json" if video else "quality.json")).read_text())
        new, run_metas, run_skipped = (video_points if video else image_points)(data)
        commands.append(data["command"])
        setups.append(data["setup"])
        if i == 0:
            points, metas, skipped = new, run_metas, run_skipped
            continue
        steps_check = [(p, q) for p in new for q in points
                       if (p.regime, p.label) == (q.regime, q.label) and p.method == FEWER]
        if steps_check:
            worst = max(abs(p.psnr - q.psnr) for p, q in steps_check)
            notes.append(f"{_tree(data['setup'])} rows ({folder.name}): its fewer-steps rows differ from the main run's "
                         f"by at most {worst:.2f} dB ({len(steps_check)} rows)")
        rows = {(p.regime, p.label) for p in new if p.method not in (None, FEWER)}
        points = [p for p in points if (p.regime, p.label) not in rows] + [p for p in new if (p.regime, p.label) in rows]
        for regime, reasons in run_skipped.items():
            skipped.setdefault(regime, []).extend(f"{reason} [{_tree(data['setup'])}]" for reason in reasons)
    measured = {(p.regime, p.label) for p in points}
    skipped = {regime: [r for r in reasons if (regime, r.split(" (")[0]) not in measured and "are already run" not in r]
               for regime, reasons in skipped.items()}
    fixture = points[0].fixture
    frames = folders[0] / "frames.png"
    return Run(fixture, points, metas, commands, setups, skipped, notes, frames if video and frames.is_file() else None)


MERGED = re.compile(r"merged \d+/\d+ steps, (\d+)/(\d+) calls")


def merged_share(log: str) -> float | None:
    """The share of a row's model calls ToMA merged, from its run lines (mean over seeds and passes);
    None without a ToMA run line."""
    found = [(int(a), int(b)) for a, b in MERGED.findall(log)]
    return None if not found else sum(a for a, _ in found) / max(1, sum(b for _, b in found))


def price(run: Run) -> None:
    """Fill every point's predicted speed-ups (real_speed.Pricer)."""
    pricer = real_speed.Pricer(run.fixture)
    for p in run.points:
        p.predicted = pricer.price(p.chain, p.regime, p.computed, merged_share(p.log))
    for p in [p for p in run.points if not p.predicted]:
        run.skipped.setdefault(p.regime, []).append(f"{p.label} (no model call ran the blocks: not priced, {p.psnr:.1f} dB)")
    for p in [p for p in run.points if p.method == "stack" and merged_share(p.log) == 0]:
        run.skipped.setdefault(p.regime, []).append(f"{p.label} [{p.tree}] (ToMA merged no call under the cache: the cache alone, {p.psnr:.1f} dB)")
    run.points = [p for p in run.points if p.predicted and not (p.method == "stack" and merged_share(p.log) == 0)]


# ------------------------------------------------------------------------------ comparisons


def fewer_steps_at(points: list[Point], regime: int, speedup: float) -> float | None:
    """PSNR of the unpatched run with the step count of the same predicted time (regime / speedup),
    interpolated between measured step counts (quality_report.steps_psnr_at; above the largest it is
    that count's PSNR, a lower bound)."""
    if speedup <= 1.0:
        return math.inf
    return quality_report.steps_psnr_at(regime / speedup, [(p.steps, p.psnr) for p in points if p.method == FEWER])


def best_at(points: list[Point], method: str, target: str, level: float) -> Point | None:
    """The method's highest-PSNR row predicted at least `level` x on `target`."""
    rows = [p for p in points if p.method == method and p.predicted[target] >= level]
    return max(rows, key=lambda p: p.psnr, default=None)


def _num(value: float | None, fmt: str = ".1f") -> str:
    if value is None:
        return "–"
    return "inf" if math.isinf(value) else format(value, fmt)


def same_speed_table(points: list[Point], regime: int, target: str) -> list[str]:
    """At each LEVELS speed-up: fewer steps (interpolated) and each method's best row at least that fast."""
    methods = [m for m in METHODS if any(p.method == m for p in points)]
    fastest = max((p.predicted[target] for p in points if p.method in METHODS), default=1.0)
    lines = [f"| predicted speed-up on {target} | {FEWER} | " + " | ".join(methods) + " |",
             "|---:|---:|" + "---|" * len(methods)]
    for level in LEVELS:
        if level > fastest:
            break
        cells = []
        for m in methods:
            best = best_at(points, m, target, level)
            cells.append("–" if best is None else f"{best.psnr:.1f} ({best.label}, {best.predicted[target]:.2f}x)")
        lines.append(f"| ≥ {level:g}x | {_num(fewer_steps_at(points, regime, level))} | " + " | ".join(cells) + " |")
    return lines


def row_table(points: list[Point], regime: int, targets: list[str], video: bool) -> list[str]:
    """Every row: method, calls, predicted speed-ups, PSNR, worst, SSIM (flicker), fewer steps at the
    first target's speed-up and the margin over it."""
    first = targets[0]
    worst = "worst frame PSNR" if video else "PSNR min"
    head = ("| row | method | model calls | " + " | ".join(f"{t} pred." for t in targets)
            + f" | PSNR mean (dB) | {worst} | SSIM" + (" | flicker" if video else "")
            + f" | fewer steps at the {first} speed-up (dB) | margin (dB) |")
    lines = [head, "|---|---|" + "---:|" * (head.count("|") - 3)]
    order = list(METHODS) + [FEWER]
    for p in sorted((p for p in points if p.method is not None), key=lambda p: (order.index(p.method), -p.predicted[first])):
        other = None if p.method == FEWER else fewer_steps_at(points, regime, p.predicted[first])
        margin = None if other is None or math.isinf(other) else p.psnr - other
        tree = f" [{p.tree}]" if p.tree != points[0].tree else ""
        lines.append(f"| {p.label}{tree} | {p.method} | {p.computed:g} | " + " | ".join(f"{p.predicted[t]:.2f}x" for t in targets)
                     + f" | {_num(p.psnr)} | {_num(p.worst)} | {p.ssim:.3f}" + (f" | {_num(p.flicker, '.3f')}" if video else "")
                     + f" | {_num(other)} | {_num(margin, '+.1f')} |")
    return lines


# ------------------------------------------------------------------------------ figures


def figure(path: Path, title: str, points: list[Point], regime: int, targets: list[str]) -> None:
    """PSNR against predicted real-size speed-up, one panel per target, one marker per method;
    fewer steps as a line; each method's best rows (its Pareto front) joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(targets), figsize=(6.5 * len(targets), 5.2), squeeze=False)
    for ax, target in zip(axes[0], targets):
        steps = sorted((regime / p.steps, p.psnr) for p in points if p.method == FEWER)
        if steps:
            ax.plot(*zip(*steps), "-o", color="black", markersize=4, label=FEWER)
            for x, y in steps:
                ax.annotate(f"{round(regime / x)}", (x, y), fontsize=6, xytext=(2, -8), textcoords="offset points")
        for method, (marker, color) in METHODS.items():
            rows = [(p.predicted[target], p.psnr) for p in points if p.method == method and math.isfinite(p.psnr)]
            if not rows:
                continue
            ax.scatter(*zip(*rows), marker=marker, color=color, s=30, label=method, alpha=0.85)
            front = quality_report.pareto_front(rows)
            if len(front) > 1:
                ax.plot(*zip(*front), "-", color=color, linewidth=0.8, alpha=0.7)
        ax.set_xlabel(f"predicted end-to-end speed-up on {target}")
        ax.set_ylabel("PSNR against the unpatched output (dB)")
        ax.set_title(target, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ report


def section(run: Run, out: Path, video: bool) -> list[str]:
    """Markdown of one fixture: per regime its figure, the same-speed table per target, every row."""
    targets = [t.key for t in real_speed.TARGETS[run.fixture]]
    lines = [f"### {run.fixture}", "", "```bash", *run.commands, "```", ""]
    lines += [f"Main run: {run.setups[0].rstrip('; ')}."] + [f"{note}." for note in run.notes] + [""]
    if run.frames is not None:
        name = f"methods_{run.fixture}_frames.png"
        shutil.copyfile(run.frames, out / name)
        lines += [f"![frames 0-8 of seed 0 at 20 steps]({name})", "",
                  "Frames 0-8 of seed 0 at 20 steps: the unpatched clip, the best keys/values and block-merge rows, "
                  "the fewer-steps row nearest the keys/values row's predicted time, the best cache at least 0.8x as fast "
                  "(predicted speed-up on Wan 2.2 14B and PSNR on the left).", ""]
    for regime in sorted(run.metas, reverse=True):
        points = [p for p in run.points if p.regime == regime]
        name = f"methods_{run.fixture}_{regime}.png"
        figure(out / name, f"{run.fixture} fixture, {regime} steps: PSNR against predicted real-size speed-up", points, regime, targets)
        meta = run.metas[regime]
        lines += [f"#### {run.fixture}, {regime} steps", "", f"![{run.fixture} at {regime} steps]({name})", "",
                  f"Seeds {meta['seeds']}; reference: the unpatched run at {regime} steps.", ""]
        for target in targets:
            lines += same_speed_table(points, regime, target) + [""]
        lines += row_table(points, regime, targets, video) + [""]
        if run.skipped.get(regime):
            lines += ["Skipped: " + "; ".join(run.skipped[regime]) + ".", ""]
    return lines


HEAD = """Each row's speed-up is **predicted for the real model** the fixture stands for
(bench/quality/real_speed.py: the real-size cost model for the ToMA node, the model calls a row ran
for fewer steps and step caches), not timed on the fixture. PSNR / SSIM against the unpatched output
of the same seed at the regime's step count. "same predicted speed-up" tables: per method, its best
row predicted at least that fast (label, its speed-up); fewer steps interpolated between measured
step counts. Margin: dB above (+) or below (-) fewer steps at the row's speed-up on the first target."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", nargs="+", action="append", type=Path, default=[], metavar="DIR",
                   help="quality.py --out folders of one fixture (the main run first)")
    p.add_argument("--video", nargs="+", type=Path, default=None, metavar="DIR", help="video_quality.py --out folders")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "out" / "scope")
    args = p.parse_args(argv)
    from harness import comfy_env

    root = comfy_env.find_comfy_root()
    if root is None:
        sys.exit("ComfyUI not found: set COMFYUI_PATH (the cost model builds the real models on the meta device)")
    real_speed.rs.import_comfy("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, groups, video in (("scope.md", args.image, False), ("scope_video.md", [args.video] if args.video else [], True)):
        if not groups:
            continue
        command = " ".join(["COMFYUI_PATH=/path/to/ComfyUI python -m bench.quality.scope_report", *sys.argv[1:]])
        lines = [HEAD, "", "```bash", command, "```", ""]
        for folders in groups:
            run = load(folders, video)
            price(run)
            lines += section(run, args.out, video)
        (args.out / name).write_text("\n".join(lines).rstrip() + "\n")
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
