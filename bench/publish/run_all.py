"""Run the whole benchmark suite and write one markdown table file, one JSON file and the plots.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.publish.run_all          # CPU, < 10 min on 2 cores
    python -m bench.publish.run_all --device cuda                                           # real model sizes, bf16/fp16
    python -m bench.publish.run_all --smoke --out /tmp/smoke                                # tiny sizes, seconds

Sections (each timed in this run, speed-ups always against the unpatched model of the same run):
- core: bench/speed/bench_core.py, make_plan + merge + unmerge against one Flux-width block.
- flux: bench/tokens/model_fidelity.py on bench_flux's Flux-shaped model: ms per model call, speed-up and
  relative error of the denoiser output, unpatched vs ToMA per ratio vs the ideal (D tokens).
- sdxl: the same on bench_sdxl's SDXL-shaped UNet: unpatched vs ToMA vs scope "attention" vs the
  built-in ToMe.
- families: bench/speed/bench_families.py, ms per model call of family-shaped SD3, Qwen-Image, Lumina2,
  HunyuanVideo and HiDream models at ratio 0.5 against each one's ideal (D tokens).
- wan: bench/speed/bench_wan.py, ms per model call of a Wan-shaped video model (14B's tokens-to-width
  balance at 832x480x81), unpatched vs ToMA per ratio vs the ideal (D tokens).
- tokens: bench/tokens/fidelity.py, merge fidelity on natural-image tokens, ToMA vs ToMe vs pooling.

Sizes. Default (CPU): the benches' CPU shapes (Flux hidden 768 with 2+4 blocks on 32x32 tokens,
SDXL topology at model_channels 64 on a 56x56 latent, core block width 1024 on 4096 tokens, token
fidelity for every similarity and tile 2/4/8 at the nodes' default temperature and 0). --device cuda:
Flux.1 and SDXL sizes (random weights; bf16 for Flux and the core, fp16 for SDXL); the token
fidelity (CPU work) as on CPU; `python -m bench.tokens.fidelity` alone runs its full sweep. --smoke: tiny everything (for the test suite, numbers meaningless).
The flux and sdxl sections need ComfyUI (COMFYUI_PATH or a sibling checkout); without it they are
skipped with the reason, and the rest still runs.

Writes <out>/results.md, <out>/results.json, <out>/*_speedup_vs_error.png, <out>/token_fidelity.png
and <out>/fidelity/ (bench/tokens/fidelity.py's own tables). bench/publish/update_docs.py turns them into the
generated Results section in docs/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..speed import bench_flux, bench_sdxl
from ..tokens import fidelity, model_fidelity

ROOT = Path(__file__).resolve().parents[2]

SECTIONS = ("core", "flux", "sdxl", "wan", "families", "tokens")
MODEL_SECTIONS = {"flux", "sdxl", "wan", "families"}
"""Sections that need ComfyUI."""
ROW_NOTES = {
    "flux": "ToMA r: every block merged at ratio r, a plan built in every call; ToMA-prop r: the same with "
            "proportional attention (the advanced node's proportional_attention: log cluster size added to "
            "the merged keys' logits); ideal r: the unpatched "
            "model on a grid of D tokens (what a merge with zero overhead would give; no error of its own). "
            + "{perturb}",
    "sdxl": "ToMA r: whole transformer blocks merged (blocks auto), a plan built in every call; ToMA-attn: "
            "scope \"attention\" (only self-attention merged); ToMe r: ComfyUI's built-in TomePatchModel, "
            "which merges only where attention runs at full latent resolution, i.e. nowhere in SDXL: it runs "
            "the unpatched computation, so its spread around 1.00x shows this run's timing noise. {perturb}",
}
PERTURB_NOTE = ("\"input +1% noise\" (not timed): the unpatched model with fixed-seed noise of 1% of the "
                "latent's norm added to its input, a yardstick for how strongly this random-weight model "
                "amplifies small changes.")
RATIOS = (0.25, 0.5, 0.75)
TABLE_SECTIONS = (
    ("wan", "Wan-shaped video model: speed", ". ToMA r: every block merged at ratio r, a plan built in every call; "
     "ideal r: the unpatched model on a video of D tokens; % of ideal = ToMA's speed-up / the ideal's."),
    ("families", "DiT families: speed against the ideal", ". ToMA: every block merged, a plan built in every call; "
     "ideal: the unpatched model on D tokens."),
    ("core", "Core overhead (make_plan + merge + unmerge vs one block)", ""),
)
"""(section, heading, note after its setup line) of the sections rendered as a bench's own table."""


@dataclass
class Preset:
    """Sizes and repeats of one run mode (smoke, cpu, cuda)."""

    name: str
    core: list[str]
    flux: list[str]  # bench_flux's arguments beside --device, --dtype and --ratios
    sdxl: list[str]  # bench_sdxl's
    tokens: list[str] = field(default_factory=list)
    weight_seeds: tuple[int, ...] = (0, 1, 2)
    wan: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=lambda: ["--repeats", "7", "--clock", "cpu"])


def preset_for(args: argparse.Namespace) -> Preset:
    """The sizes for --smoke, the CPU default or --device cuda."""
    if args.smoke:
        return Preset("smoke", ["--width", "64", "--grid", "8", "--repeats", "1"],
                      ["--repeats", "1", "--warmup", "0", "--hidden", "128", "--depth", "1", "--depth-single", "1",
                       "--grid", "8", "--text", "8"], ["--rounds", "1", "--calls", "1", "--channels", "32", "--latent", "16"],
                      ["--images", "astronaut", "--grid", "8", "--tome-seeds", "1", "--tiles", "4"], (0, 1),
                      ["--dim", "128", "--heads", "1", "--ffn", "256", "--depth", "1", "--frames", "3", "--height", "4",
                       "--width", "6", "--text", "16", "--repeats", "1", "--warmup", "0", "--ratios", "0.5"],
                      ["--grid", "4", "--repeats", "1", "--warmup", "0"])
    if args.device != "cpu":
        return Preset("cuda", ["--width", "3072", "--grid", "64", "--repeats", "20"],
                      ["--repeats", "10", "--warmup", "3", "--real-size"], ["--rounds", "3", "--calls", "5", "--real-size"],
                      ["--tiles", "2,4,8"], wan=["--dtype", "bf16", "--real-size", "--repeats", "5"],
                      families=["--dtype", "bf16", "--grid", "64", "--repeats", "7"])
    return Preset("cpu", ["--width", "1024", "--grid", "64", "--repeats", "5"], ["--repeats", "9", "--warmup", "1"],
                  ["--rounds", "4", "--calls", "2"],
                  ["--tiles", "2,4,8"], wan=["--repeats", "7"])


# --------------------------------------------------------------------------------------------
# Machine


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str) -> dict:
    """What the numbers were measured on."""
    info = {
        "cpu": cpu_model(), "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "device": device, "load_average_start": _loadavg(), "commit": git_commit(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def git_commit() -> str | None:
    """Short commit of the checkout the suite runs from, "+dirty" with uncommitted tracked edits."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def machine_line(info: dict) -> str:
    """One line for the tables: CPU, threads, torch, GPU, load."""
    parts = [f"{info['cpu']} ({info['logical_cores']} logical cores, torch threads {info['torch_threads']})",
             f"torch {info['torch']}", f"Python {info['python']}"]
    if info.get("gpu"):
        parts.append(f"GPU {info['gpu']} (CUDA {info.get('cuda')})")
    if info.get("comfyui"):
        parts.append(f"ComfyUI {info['comfyui']}")
    if info.get("commit"):
        parts.append(f"ComfyUI-ToMA commit {info['commit']}")
    load = info.get("load_average_start"), info.get("load_average_end")
    if all(load):
        parts.append(f"load average {load[0][0]:.1f} at start, {load[1][0]:.1f} at end")
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# Sections


def run_script(module: str, argv: list[str], threads: int) -> tuple[str, str]:
    """Run a bench script (``python -m bench.<module>`` from the repository root) with this Python;
    returns (command as text, stdout). Raises on failure."""
    cmd = [sys.executable, "-m", f"bench.{module}", *argv]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"bench.{module} exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
    prefix = [f"OMP_NUM_THREADS={threads}"] if threads else []
    return _display([*prefix, "python", "-m", f"bench.{module}", *argv]), result.stdout


def _display(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


def table_section(module: str, argv: list[str], threads: int) -> tuple[dict, list[list[str]]]:
    """Run a bench that prints one Markdown table: the section (command, setup line, table) and the
    table's body rows as cells."""
    command, stdout = run_script(module, argv, threads)
    lines = stdout.strip().splitlines()
    table = [line for line in lines if line.startswith("|")]
    return ({"command": command, "setup": lines[0] if lines else "", "table": table},
            [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]])


def core_section(args: argparse.Namespace, preset: Preset) -> dict:
    """bench_core.py's table (piece, median ms, % of one block) and its setup line."""
    dtype = "bf16" if args.device != "cpu" else "fp32"
    section, cells = table_section("speed.bench_core", ["--device", args.device, "--dtype", dtype, *preset.core], args.threads)
    return section | {"rows": [{"piece": piece, "ms": float(ms), "percent_of_block": float(pct.rstrip("%"))}
                               for piece, ms, pct in cells]}


def wan_section(args: argparse.Namespace, preset: Preset) -> dict:
    """bench_wan.py's table (unpatched, ideal and ToMA per ratio, % of the ideal's speed-up) and its setup line."""
    section, cells = table_section("speed.bench_wan", ["--device", args.device, *preset.wan], args.threads)
    return section | {"rows": [{"config": c[0], "tokens": int(c[1]), "ms": float(c[2]), "speedup": float(c[3])}
                               for c in cells]}


def families_section(args: argparse.Namespace, preset: Preset) -> dict:
    """bench_families.py's rows (per family: N, D, ms unpatched / ToMA / ideal, speed-ups) and its setup line."""
    command, stdout = run_script("speed.bench_families", ["--device", args.device, *preset.families], args.threads)
    lines = stdout.strip().splitlines()
    keys = ("family", "ratio", "tokens", "kept", "ms", "toma_ms", "speedup", "ideal_ms", "ideal_speedup")
    rows = [dict(zip(keys, line.split())) for line in lines[2:] if line.strip()]
    for row in rows:
        row.update({k: float(row[k]) for k in keys[1:]})
    table = ["| family | ratio | N | D | unpatched ms | ToMA ms | speed-up | ideal ms | ideal speed-up |",
             "|---|---|---|---|---|---|---|---|---|",
             *(f"| {r['family']} | {r['ratio']:g} | {r['tokens']:.0f} | {r['kept']:.0f} | {r['ms']:.1f} | {r['toma_ms']:.1f} | "
               f"{r['speedup']:.2f}x | {r['ideal_ms']:.1f} | {r['ideal_speedup']:.2f}x |" for r in rows)]
    return {"command": command, "setup": lines[0] if lines else "", "rows": rows, "table": table}


def merge_defaults() -> dict:
    """The default similarity, tile size, temperature and budget of ToMASettings (nodes/settings.py),
    which the token section always measures; no ComfyUI needed (the node schemas' defaults, which
    need it, are ``quality_baseline.node_defaults``)."""
    from harness.pack import pack_module

    s = pack_module("nodes.settings").ToMASettings()
    return {"similarity": s.similarity, "tile": s.tile_size, "temperature": s.temperature, "budget": s.budget}


def tokens_section(args: argparse.Namespace, preset: Preset) -> dict:
    """bench/tokens/fidelity.py on natural-image tokens (always including the nodes' default setting), and its plot."""
    default, out = merge_defaults(), Path(args.out)
    argv = ["--out", str(out / "fidelity"), *preset.tokens]
    if preset.name in ("cpu", "cuda"):
        argv += ["--temperatures", f"{default['temperature']:g},0"]
    elif preset.name == "smoke":
        argv += ["--temperatures", f"{default['temperature']:g}", "--budgets", default["budget"]]
    if preset.name == "smoke":
        argv += ["--similarities", default["similarity"], "--compare", ""]
    command, _ = run_script("tokens.fidelity", argv, args.threads)
    command = command.replace(str(out / "fidelity"), "<out>/fidelity")
    records = json.loads((out / "fidelity" / "fidelity.json").read_text())["records"]
    for r in records:
        r.pop("per_image", None)
    section = {"command": command, "default": default, "records": records, "ratios": list(RATIOS), "plot": "token_fidelity.png"}
    return section | {"plot_written": plot_tokens(section, out / section["plot"]) is not None}


def model_section(family: str, args: argparse.Namespace, preset: Preset) -> dict:
    """Speed and relative error of one model family (bench/tokens/model_fidelity.py)."""
    bench, measure = (bench_flux, model_fidelity.flux_family) if family == "flux" else (bench_sdxl, model_fidelity.sdxl_family)
    dtype = "fp32" if args.device == "cpu" else "bf16" if family == "flux" else "fp16"
    result = measure(bench.parse_args(["--device", args.device, "--dtype", dtype, "--ratios", *map(str, RATIOS),
                                       *getattr(preset, family)]), preset.weight_seeds)
    plot = f"{family}_speedup_vs_error.png"
    return result | {"table": model_fidelity.markdown_table(result), "plot": plot,
                     "plot_written": model_fidelity.plot_family(result, Path(args.out) / plot) is not None}


def import_comfy(args: argparse.Namespace) -> str:
    """Import ComfyUI the way the benches do; returns its version, raises RuntimeError if unavailable."""
    from .. import cli

    try:
        root = cli.import_comfy(bench_flux.parse_args(["--device", args.device]))
    except SystemExit as exc:
        raise RuntimeError(str(exc.code)) from None
    from harness import comfy_env

    return comfy_env.comfy_version(root)


# --------------------------------------------------------------------------------------------
# Tables and plots


def _setting_text(settings: dict) -> str:
    budget = "" if settings.get("budget", "tile") == "tile" else f", {settings['budget']} budget"
    return f"ToMA {settings['similarity']}, tile {settings['tile']}, T={settings['temperature']:g}{budget}"


def token_rows(section: dict) -> list[tuple[str, str]]:
    """(row title, fidelity record label) of the token table: node default, best by attn, ToMe, pooling."""
    default = section["default"]
    default_label = fidelity.toma_method(default["similarity"], default["tile"], default["temperature"], (),
                                         default["budget"]).label
    rows = [(f"{_setting_text(default)} (nodes' default)", default_label)]
    best = fidelity.best_toma(section["records"], "attn", section["ratios"])
    if best and best["label"] != default_label:
        rows.append((f"{_setting_text(best)} (lowest attn error here)", best["label"]))
    return rows + [("ToMe (ComfyUI built-in scheme)", "tome"), ("2x2 average pooling", "pool2x2"),
                   ("1x2 average pooling", "pool1x2")]


def token_table(section: dict) -> list[str]:
    """attn and roundtrip relative errors per ratio for the rows of token_rows()."""
    ratios = section["ratios"]
    head = " | ".join(f"attn {q:g}" for q in ratios) + " | " + " | ".join(f"roundtrip {q:g}" for q in ratios)
    lines = [f"| method | {head} |", "|---|" + "---:|" * (2 * len(ratios))]
    for title, label in token_rows(section):
        found = [(metric, fidelity.lookup(section["records"], label, q)) for metric in ("attn", "roundtrip") for q in ratios]
        lines.append(f"| {title} | " + " | ".join("–" if r is None else f"{r[metric]:.4f}" for metric, r in found) + " |")
    return lines


def plot_tokens(section: dict, path: Path) -> Path | None:
    """attn error against ratio for the rows of token_rows(); None without matplotlib."""
    plt = model_fidelity.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.6), dpi=110)
    for title, label in token_rows(section):
        points = sorted((r["ratio"], r["attn"]) for r in section["records"] if r["label"] == label)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-" if len(points) > 1 else "D", label=title)
    ax.set_xlabel("merge ratio (share of tokens merged away)")
    ax.set_ylabel("attention-layer relative error")
    ax.set_title("Natural-image tokens: self-attention on merged tokens, unmerged", fontsize=9)
    return model_fidelity.save_figure(plt, fig, ax, path)


def render_markdown(results: dict, image_dir: str = ".", heading: str = "#", header: bool = True) -> str:
    """Every table of a run as markdown; images linked under image_dir; section headings one level
    below `heading`; header=False leaves out the title, command and machine lines."""
    h2 = heading + "#"
    out = []
    if header:
        out = [f"{heading} ToMA benchmark results ({results['preset']})", "",
               f"Command: `{results['command']}` ({results['seconds']:.0f} s)  ",
               f"Machine: {machine_line(results['machine'])}.", ""]
    sections = results["sections"]
    for family, title in (("flux", "Flux-shaped model"), ("sdxl", "SDXL-shaped model")):
        s = sections.get(family)
        if s is None:
            continue
        out += [f"{h2} {title}: speed and denoiser-output error", ""]
        if "skipped" in s:
            out += [f"Skipped: {s['skipped']}", ""]
            continue
        out += [s["setup"] + ". Relative error = ||out - out_unpatched|| / ||out_unpatched|| of one model call "
                f"(seeded inputs; mean over {len(s['weight_seeds'])} seeded weight draws, timings on the first; "
                f"the unpatched model repeated gives {s['reference_repeat_error']:.1e}). "
                + ROW_NOTES[family].format(perturb=PERTURB_NOTE), "", *s["table"], ""]
        if s.get("plot_written"):
            out += [f"![{title}: speed-up vs error]({image_dir}/{s['plot']})", ""]
    for name, title, note in TABLE_SECTIONS:
        s = sections.get(name)
        if s is not None:
            out += [f"{h2} {title}", ""]
            out += [f"Skipped: {s['skipped']}", ""] if "skipped" in s else [
                f"`{s['command']}`: {s['setup']}{note}", "", *s["table"], ""]
    s = sections.get("tokens")
    if s is not None:
        out += [f"{h2} Token-level fidelity on natural-image tokens", ""]
        if "skipped" in s:
            out += [f"Skipped: {s['skipped']}", ""]
        else:
            out += [f"`{s['command']}`. Relative errors, mean over scikit-image's sample photographs: `attn` = "
                    "a self-attention layer on the merged tokens, unmerged, against the layer on all tokens; "
                    "`roundtrip` = unmerge(merge(x)) against x. Full tables: `<out>/fidelity/fidelity.md`.", "",
                    *token_table(s), ""]
            if s.get("plot_written"):
                out += [f"![token fidelity]({image_dir}/{s['plot']})", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", default=str(ROOT / "bench" / "out"), help="output folder (default bench/out/, git-ignored)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests (numbers meaningless)")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads, also for the sub-benchmarks (0 = torch default; default: 1 on CPU, "
                        "because on a machine whose cores other processes share, every multi-threaded op waits "
                        "for its slowest thread and timings become erratic)")
    args = p.parse_args(argv)
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    return args


def run_sections(args: argparse.Namespace, preset: Preset, info: dict) -> dict:
    """Each requested section in order; a failing or unavailable section is recorded as skipped."""
    runners = {"core": core_section, "wan": wan_section, "families": families_section, "tokens": tokens_section,
               "flux": lambda *a: model_section("flux", *a), "sdxl": lambda *a: model_section("sdxl", *a)}
    sections: dict[str, dict] = {}
    comfy_error = None
    if MODEL_SECTIONS & set(args.sections):
        try:
            info["comfyui"] = import_comfy(args)
        except RuntimeError as exc:
            comfy_error = f"ComfyUI unavailable: {exc}"
    for name in SECTIONS:
        if name not in args.sections:
            continue
        start = time.perf_counter()
        print(f"[run_all] {name} ...", flush=True)
        sections[name] = {"skipped": comfy_error} if name in MODEL_SECTIONS and comfy_error else runners[name](args, preset)
        seconds = time.perf_counter() - start
        sections[name].setdefault("section_seconds", seconds)
        note = sections[name].get("skipped", "done")
        print(f"[run_all] {name}: {note} ({seconds:.0f} s)", flush=True)
    return sections


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device} asked for, but torch sees no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = preset_for(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    info = machine_info(args.device)
    print(f"[run_all] {preset.name} preset; machine: {machine_line(info)}", flush=True)
    sections = run_sections(args, preset, info)
    info["load_average_end"] = _loadavg()
    shown = [a if a != str(out) else "<out>" for a in (argv if argv is not None else sys.argv[1:])]
    results = {"preset": preset.name, "command": _display(["python", "-m", "bench.publish.run_all", *shown]),
               "machine": info, "seconds": time.perf_counter() - start, "sections": sections}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(render_markdown(results) + "\n")
    print(render_markdown(results))
    print(f"[run_all] wrote {out / 'results.md'}, {out / 'results.json'} and the plots ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
