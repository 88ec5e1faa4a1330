"""Model-level fidelity and speed of ToMA on the Flux-shaped and SDXL-shaped benchmark models: the
flux and sdxl sections of bench/publish/run_all.py (`python -m bench.publish.run_all --sections flux
sdxl` runs them alone; `--device cuda` at Flux.1 / SDXL sizes).

The models, inputs, patches and timing loops are the ones of bench/speed/bench_flux.py and
bench/speed/bench_sdxl.py (imported, not copied): ComfyUI's own classes with random weights and fixed-seed
inputs. For every configuration this measures, in one process:

- rel. error: ||out - out_unpatched|| / ||out_unpatched|| of one model call (the denoiser output,
  same latent, timestep and conditioning; the plan is built in the call), averaged over
  the weight seeds' random weight draws (torch.manual_seed before each build; min-max shown too);
- ms/call: median ms per model call after warm-up (the benches' own round-robin loops), and the
  speed-up against the unpatched model timed in the same loop (on the first seed's weights).

Flux rows: unpatched, ToMA per ratio (every block merged), ToMA-prop (the same with proportional
attention: log cluster size on the merged keys' logits), and "ideal" (the unpatched model on a
grid of D tokens: the speed a merge with zero overhead would give; it has no error of its own).
SDXL rows: unpatched, ToMA per ratio (whole blocks), ToMA with scope "attention", and ComfyUI's
built-in ToMe (TomePatchModel). The latent is pure noise at the first sampling step and the
weights are random, so neighbouring tokens are less alike than in a trained model on a real
image: read the errors as a comparison between ratios and methods, not as image quality.
A family's result is a dict (run_all's section): setup, seconds, weight_seeds, reference_repeat_error
and rows (family, config, kind, ratio, tokens, ms, speedup, rel_error, rel_error_range).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from harness.metrics import relative_error

from .. import timing
from ..speed import bench_flux, bench_sdxl
from ..speed.model_speed import toma_every_block

PERTURB = 0.01
PERTURB_NAME = f"input +{PERTURB:.0%} noise"
"""Reference row: the unpatched model with its input latent moved by 1% (relative norm)."""
KINDS = {"toma": "toma", "toma-prop": "toma-prop", "toma-attn": "toma-attn", "tome": "tome", "ideal": "ideal",
         "input": "perturb"}
"""Row kind from a configuration name's first word ("ToMA 0.5", "ToMA-prop 0.5", ...); else "unpatched"."""


def perturbed(base, scale: float, seed: int = 1):
    """A clone of `base` whose diffusion model sees its input plus fixed-seed Gaussian noise of
    relative norm `scale` (a DIFFUSION_MODEL wrapper): how far the unpatched model's output moves for
    a small change of its input, the yardstick for the merge errors."""
    import comfy.patcher_extension

    def wrapper(executor, x, *args, **kwargs):
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x)
        return executor(x + noise * (scale * x.float().norm() / noise.float().norm()).to(x.dtype), *args, **kwargs)

    patcher = base.clone()
    patcher.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "toma_bench_perturb", wrapper)
    return patcher


def _ratio(name: str) -> float:
    return float(name.split()[-1]) if name.split()[0] in ("ToMA", "ToMA-prop", "ToMA-attn", "ToMe", "ideal") else 0.0


def _errors(bench: Any, configurations: Any, call: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Relative errors against the unpatched output of `bench`'s model (weights drawn with `seed`) of each of its
    configurations(base, args) and of the 1% input perturbation; call(patcher) is one output."""
    import comfy.model_management

    torch.manual_seed(seed)
    base = bench.build_model(args)
    configs = {"unpatched": base} | configurations(base, args) | {PERTURB_NAME: perturbed(base, PERTURB)}
    outputs = {}
    for name, patcher in configs.items():
        comfy.model_management.load_models_gpu([patcher])  # applies / removes object patches
        outputs[name] = call(patcher)
    ref = outputs.pop("unpatched")
    comfy.model_management.unload_all_models()
    return {name: relative_error(out, ref) for name, out in outputs.items()}


# --------------------------------------------------------------------------------------------
# Flux


def flux_configurations(base, args: argparse.Namespace) -> dict[str, object]:
    """ToMA per ratio, then ToMA with proportional attention per ratio, on every block."""
    configs = {f"ToMA {r:g}": toma_every_block(base, r, args) for r in args.ratios}
    configs |= {f"ToMA-prop {r:g}": toma_every_block(base, r, args, proportional_attention=True) for r in args.ratios}
    return configs


def flux_family(args: argparse.Namespace, seeds: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Errors (per weight seed) and timings (first seed's model) of unpatched / ToMA / ideal on
    bench_flux's model, in one process."""
    start = time.perf_counter()
    full = (args.grid, args.grid)
    errors = [_errors(bench_flux, flux_configurations, lambda p: bench_flux.make_call(p, args, full)(), args, seed)
              for seed in seeds]
    torch.manual_seed(seeds[0])
    base = bench_flux.build_model(args)
    n = args.grid * args.grid
    calls = {"unpatched": bench_flux.make_call(base, args, full)}
    tokens = {"unpatched": f"{n}", PERTURB_NAME: f"{n}"}
    for name, patcher in flux_configurations(base, args).items():
        calls[name] = bench_flux.make_call(patcher, args, full)
        tokens[name] = f"{n}->{bench_flux.kept_tokens(_ratio(name), args)}"
    for r in args.ratios:
        d = bench_flux.kept_tokens(r, args)
        calls[f"ideal {r:g}"] = bench_flux.make_call(base, args, bench_flux.ideal_grid(d, full))
        tokens[f"ideal {r:g}"] = f"{d}"
    ref = calls["unpatched"]()
    ms = timing.median_ms(calls, args.device, warmup=args.warmup, repeats=args.repeats)
    repeat = relative_error(calls["unpatched"](), ref)
    setup = (f"comfy.model_base.Flux, hidden {args.hidden}, {args.depth}+{args.depth_single} blocks, "
             f"{args.grid}x{args.grid} image tokens + {args.text} text, batch {args.batch}, {args.dtype}, "
             f"tile {args.tile_size}; median of {args.repeats} calls after {args.warmup} warm-up, round-robin")
    return _result("flux", setup, _rows("flux", ms, tokens, errors), repeat, start, seeds)


# --------------------------------------------------------------------------------------------
# SDXL


def sdxl_family(args: argparse.Namespace, seeds: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Errors (per weight seed) and timings (first seed's model) of unpatched / ToMA / ToMA-attn /
    ToMe on bench_sdxl's model."""
    import comfy.model_management

    start = time.perf_counter()
    errors = [_errors(bench_sdxl, bench_sdxl.configurations, lambda p: bench_sdxl.make_call(p, args)(), args, seed)
              for seed in seeds]
    torch.manual_seed(seeds[0])
    base = bench_sdxl.build_model(args)
    configs = bench_sdxl.configurations(base, args)

    def output(name: str) -> torch.Tensor:
        comfy.model_management.load_models_gpu([configs[name]])
        return bench_sdxl.make_call(configs[name], args)()

    ref = output("unpatched")
    times = bench_sdxl.round_robin(configs, args)
    repeat = relative_error(output("unpatched"), ref)
    ms = {name: statistics.median(values) for name, values in times.items()}
    tokens = {name: _sdxl_tokens(args, _ratio(name) if name.startswith("ToMA") else 0.0) for name in configs}
    tokens[PERTURB_NAME] = _sdxl_tokens(args, 0.0)
    config = bench_sdxl.unet_config(args)
    setup = (f"comfy.model_base.SDXL topology, model_channels {config['model_channels']}, context "
             f"{config['context_dim']}, latent {args.latent}x{args.latent}, batch {args.batch} (cond + uncond), "
             f"{args.dtype}, tile {args.tile_size}; median of {args.rounds} rounds x {args.calls} calls, "
             f"each round after a warm-up call")
    result = _result("sdxl", setup, _rows("sdxl", ms, tokens, errors), repeat, start, seeds)
    comfy.model_management.unload_all_models()
    return result


def _sdxl_tokens(args: argparse.Namespace, ratio: float) -> str:
    """Tokens per transformer level, "784->392, 196->98"; unmerged levels as just "784, 196"."""
    return re.sub(r"\b(\d+)->\1\b", r"\1", bench_sdxl.level_tokens(args, ratio))


def _result(family: str, setup: str, rows: list[dict], repeat: float, start: float, seeds: tuple[int, ...]) -> dict[str, Any]:
    return {"family": family, "setup": setup, "seconds": time.perf_counter() - start, "weight_seeds": list(seeds),
            "reference_repeat_error": repeat, "rows": rows}


def _rows(family: str, ms: dict[str, float], tokens: dict[str, str], errors: list[dict[str, float]]) -> list[dict]:
    """Table rows: timed configurations, then the untimed perturbation; errors averaged over seeds."""
    plain = ms["unpatched"]
    names = [*ms, *([PERTURB_NAME] if PERTURB_NAME in errors[0] else [])]
    rows = []
    for name in names:
        values = [e[name] for e in errors if name in e]
        error, spread = (0.0, None) if name == "unpatched" else (
            (statistics.fmean(values), [min(values), max(values)]) if values else (None, None))
        rows.append({"family": family, "config": name, "kind": KINDS.get(name.split()[0].lower(), "unpatched"),
                     "ratio": _ratio(name), "tokens": tokens[name], "ms": ms.get(name),
                     "speedup": plain / ms[name] if name in ms else None, "rel_error": error, "rel_error_range": spread})
    return rows


# --------------------------------------------------------------------------------------------
# Output


def markdown_table(result: dict[str, Any]) -> list[str]:
    """The family's table: config, tokens, ms/call, speed-up, relative error."""
    seeds = len(result["weight_seeds"])
    token_head = "tokens (1/2, 1/4 level)" if result["family"] == "sdxl" else "image tokens"
    error_head = f"rel. error (mean, min–max of {seeds} weight draws)" if seeds > 1 else "rel. error"
    lines = [f"| config | {token_head} | ms/call | speed-up | {error_head} |", "|---|---:|---:|---:|---:|"]
    for row in result["rows"]:
        ms = "–" if row["ms"] is None else f"{row['ms']:.1f}"
        speedup = "–" if row["speedup"] is None else f"{row['speedup']:.2f}x"
        error = "–" if row["rel_error"] is None else f"{row['rel_error']:.4f}"
        if row["rel_error_range"] and seeds > 1:
            error += f" ({row['rel_error_range'][0]:.3f}–{row['rel_error_range'][1]:.3f})"
        lines.append(f"| {row['config']} | {row['tokens']} | {ms} | {speedup} | {error} |")
    return lines


def plot_family(result: dict[str, Any], path: Path) -> Path | None:
    """Speed-up (y) against relative error (x), one point per configuration; None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    styles = {"toma": ("o-", "C0", "ToMA (block)"), "toma-prop": ("D-", "C4", "ToMA + proportional attention"),
              "toma-attn": ("s", "C2", "ToMA (scope attention)"), "tome": ("^", "C3", "built-in ToMe")}
    fig, ax = plt.subplots(figsize=(5.2, 3.6), dpi=110)
    for kind, (marker, color, label) in styles.items():
        rows = [r for r in result["rows"] if r["kind"] == kind]
        if not rows:
            continue
        x, y = [r["rel_error"] for r in rows], [r["speedup"] for r in rows]
        ax.plot(x, y, marker, color=color, label=label)
        spans = [(r["rel_error"] - r["rel_error_range"][0], r["rel_error_range"][1] - r["rel_error"])
                 if r["rel_error_range"] else (0, 0) for r in rows]
        ax.errorbar(x, y, xerr=list(zip(*spans)), fmt="none", ecolor=color, elinewidth=0.8, capsize=2)
        labels = [("ratios " + ", ".join(f"{r['ratio']:g}" for r in rows), rows[0])] if kind == "tome" else [
            (f"{r['ratio']:g}", r) for r in rows]  # ToMe: all at error 0, one label
        for text, r in labels:
            ax.annotate(text, (r["rel_error"], r["speedup"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ideal = {r["ratio"]: r["speedup"] for r in result["rows"] if r["kind"] == "ideal"}
    toma = [r for r in result["rows"] if r["kind"] == "toma" and r["ratio"] in ideal]
    if toma:
        ax.plot([r["rel_error"] for r in toma], [ideal[r["ratio"]] for r in toma], "x", color="0.4",
                label="ideal (unpatched on D tokens), at ToMA's error")
    ax.axhline(1.0, color="0.7", lw=0.8, ls="--")
    for r in result["rows"]:
        if r["kind"] == "perturb" and r["rel_error"] is not None:
            ax.axvline(r["rel_error"], color="C1", lw=1, ls=":", label=f"unpatched, {r['config']} (error only)")
    ax.set_xlabel("relative error of the denoiser output vs unpatched")
    ax.set_ylabel("speed-up vs unpatched (x)")
    ax.set_title(f"{result['family'].upper()}-shaped model: speed-up vs error (labels: ratio)", fontsize=9)
    return save_figure(plt, fig, ax, path)


def pyplot():
    """matplotlib.pyplot on the Agg backend; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(plt, fig, ax, path: Path) -> Path:
    """The bench figures' legend and grid, then `fig` written to `path` and closed."""
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
