"""Model-level fidelity and speed of ToMA on the Flux-shaped and SDXL-shaped benchmark models.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.tokens.model_fidelity            # CPU, both
    python -m bench.tokens.model_fidelity --device cuda --real-size                                # GPU sizes

The models, inputs, patches and timing loops are the ones of bench/speed/bench_flux.py and
bench/speed/bench_sdxl.py (imported, not copied): ComfyUI's own classes with random weights and fixed-seed
inputs. For every configuration this measures, in one process:

- rel. error: ||out - out_unpatched|| / ||out_unpatched|| of one model call (the denoiser output,
  same latent, timestep and conditioning; the plan is built in the call), averaged over
  --weight-seeds random weight draws (torch.manual_seed before each build; min-max shown too);
- ms/call: median ms per model call after warm-up (the benches' own round-robin loops), and the
  speed-up against the unpatched model timed in the same loop (on the first seed's weights).

Flux rows: unpatched, ToMA per ratio (every block merged), ToMA-prop (the same with proportional
attention: log cluster size on the merged keys' logits), and "ideal" (the unpatched model on a
grid of D tokens: the speed a merge with zero overhead would give; it has no error of its own).
SDXL rows: unpatched, ToMA per ratio (whole blocks), ToMA with scope "attention", and ComfyUI's
built-in ToMe (TomePatchModel). The latent is pure noise at the first sampling step and the
weights are random, so neighbouring tokens are less alike than in a trained model on a real
image: read the errors as a comparison between ratios and methods, not as image quality.
`--out` writes model_fidelity.md, model_fidelity.json and one speed-up-vs-error PNG per family.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from harness.metrics import relative_error

from .. import cli, timing
from ..speed import bench_flux, bench_sdxl

BENCH = Path(__file__).resolve().parents[1]

RATIOS = (0.25, 0.5, 0.75)
PERTURB = 0.01
PERTURB_NAME = f"input +{PERTURB:.0%} noise"
"""Reference row: the unpatched model with its input latent moved by 1% (relative norm)."""
FAMILIES = ("flux", "sdxl")


@dataclass
class Row:
    """One configuration of one family: tokens, median ms per call, speed-up, relative error."""

    family: str
    config: str
    kind: str  # "unpatched", "toma", "toma-attn", "tome", "ideal"
    ratio: float
    tokens: str
    ms: float | None  # None: not timed (the perturbation reference)
    speedup: float | None
    rel_error: float | None  # mean over the weight seeds
    rel_error_range: list[float] | None = None  # [min, max] over the weight seeds


@dataclass
class FamilyResult:
    """Rows of one family plus what the run was (sizes, dtype, repeats) and its sanity checks."""

    family: str
    setup: str
    rows: list[Row]
    reference_repeat_error: float
    seconds: float
    seeds: list[int] = field(default_factory=lambda: [0])


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


def _kind(name: str) -> str:
    """Row kind from a configuration name such as "ToMA 0.5", "ToMA-prop 0.5" or "ToMA-attn 0.5"."""
    head = name.split()[0].lower()
    kinds = {"toma": "toma", "toma-prop": "toma-prop", "toma-attn": "toma-attn", "tome": "tome", "ideal": "ideal", "input": "perturb"}
    return kinds.get(head, "unpatched")


def _ratio(name: str) -> float:
    return float(name.split()[-1]) if name.split()[0] in ("ToMA", "ToMA-prop", "ToMA-attn", "ToMe", "ideal") else 0.0


# --------------------------------------------------------------------------------------------
# Flux


def flux_args(device: str, dtype: str, size: str, ratios: list[float], repeats: int, warmup: int):
    """bench_flux's argparse namespace for a size preset: "smoke", "cpu" (its default) or "real"."""
    argv = ["--device", device, "--dtype", dtype, "--repeats", str(repeats), "--warmup", str(warmup),
            "--ratios", *map(str, ratios)]
    if size == "real":
        argv.append("--real-size")
    elif size == "smoke":
        argv += ["--hidden", "128", "--depth", "1", "--depth-single", "1", "--grid", "8", "--text", "8"]
    return bench_flux.parse_args(argv)


def _flux_errors(args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Relative errors of ToMA per ratio and of the 1% input perturbation, weights drawn with `seed`."""
    torch.manual_seed(seed)
    base = bench_flux.build_model(args)
    full = (args.grid, args.grid)
    ref = bench_flux.make_call(base, args, full)()
    errors = {name: relative_error(bench_flux.make_call(patcher, args, full)(), ref)
              for name, patcher in flux_configurations(base, args).items()}
    errors[PERTURB_NAME] = relative_error(bench_flux.make_call(perturbed(base, PERTURB), args, full)(), ref)
    return errors


def flux_configurations(base, args: argparse.Namespace) -> dict[str, object]:
    """ToMA per ratio, then ToMA with proportional attention per ratio, on every block."""
    configs = {f"ToMA {r:g}": bench_flux.patch(base, r, args) for r in args.ratios}
    configs |= {f"ToMA-prop {r:g}": bench_flux.patch(base, r, args, proportional_attention=True) for r in args.ratios}
    return configs


def flux_family(args: argparse.Namespace, seeds: tuple[int, ...] = (0,)) -> FamilyResult:
    """Errors (per weight seed) and timings (first seed's model) of unpatched / ToMA / ideal on
    bench_flux's model, in one process."""
    start = time.perf_counter()
    errors = [_flux_errors(args, seed) for seed in seeds]
    torch.manual_seed(seeds[0])
    base = bench_flux.build_model(args)
    full = (args.grid, args.grid)
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
    rows = _rows("flux", ms, tokens, errors)
    setup = (f"comfy.model_base.Flux, hidden {args.hidden}, {args.depth}+{args.depth_single} blocks, "
             f"{args.grid}x{args.grid} image tokens + {args.text} text, batch {args.batch}, {args.dtype}, "
             f"tile {args.tile_size}; median of {args.repeats} calls after {args.warmup} warm-up, round-robin")
    return FamilyResult("flux", setup, rows, repeat, time.perf_counter() - start, list(seeds))


# --------------------------------------------------------------------------------------------
# SDXL


def sdxl_args(device: str, dtype: str, size: str, ratios: list[float], rounds: int, calls: int):
    """bench_sdxl's argparse namespace for a size preset: "smoke", "cpu" (its default) or "real"."""
    argv = ["--device", device, "--dtype", dtype, "--rounds", str(rounds), "--calls", str(calls),
            "--ratios", *map(str, ratios)]
    if size == "real":
        argv.append("--real-size")
    elif size == "smoke":
        argv += ["--channels", "32", "--latent", "16"]
    return bench_sdxl.parse_args(argv)


def _sdxl_errors(args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Relative errors of every non-unpatched configuration and of the 1% input perturbation."""
    import comfy.model_management

    torch.manual_seed(seed)
    base = bench_sdxl.build_model(args)
    configs = bench_sdxl.configurations(base, args)
    configs[PERTURB_NAME] = perturbed(base, PERTURB)
    outputs = {}
    for name, patcher in configs.items():
        comfy.model_management.load_models_gpu([patcher])  # applies / removes object patches
        outputs[name] = bench_sdxl.make_call(patcher, args)()
    ref = outputs.pop("unpatched")
    comfy.model_management.unload_all_models()
    return {name: relative_error(out, ref) for name, out in outputs.items()}


def sdxl_family(args: argparse.Namespace, seeds: tuple[int, ...] = (0,)) -> FamilyResult:
    """Errors (per weight seed) and timings (first seed's model) of unpatched / ToMA / ToMA-attn /
    ToMe on bench_sdxl's model."""
    import comfy.model_management

    start = time.perf_counter()
    errors = [_sdxl_errors(args, seed) for seed in seeds]
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
    result = FamilyResult("sdxl", setup, _rows("sdxl", ms, tokens, errors), repeat, time.perf_counter() - start, list(seeds))
    comfy.model_management.unload_all_models()
    return result


def _sdxl_tokens(args: argparse.Namespace, ratio: float) -> str:
    """Tokens per transformer level, "784->392, 196->98"; unmerged levels as just "784, 196"."""
    return re.sub(r"\b(\d+)->\1\b", r"\1", bench_sdxl.level_tokens(args, ratio))


def _rows(family: str, ms: dict[str, float], tokens: dict[str, str], errors: list[dict[str, float]]) -> list[Row]:
    """Table rows: timed configurations, then the untimed perturbation; errors averaged over seeds."""
    plain = ms["unpatched"]
    rows = []
    for name, value in ms.items():
        rows.append(Row(family, name, _kind(name), _ratio(name), tokens[name], value, plain / value, *_error(name, errors)))
    if PERTURB_NAME in errors[0]:
        rows.append(Row(family, PERTURB_NAME, "perturb", 0.0, tokens[PERTURB_NAME], None, None, *_error(PERTURB_NAME, errors)))
    return rows


def _error(name: str, errors: list[dict[str, float]]) -> tuple[float | None, list[float] | None]:
    """(mean over weight seeds, [min, max]) of one configuration's error; unpatched is 0."""
    if name == "unpatched":
        return 0.0, None
    values = [e[name] for e in errors if name in e]
    if not values:
        return None, None
    return statistics.fmean(values), [min(values), max(values)]


# --------------------------------------------------------------------------------------------
# Output


def _fmt_error(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def markdown_table(result: FamilyResult) -> list[str]:
    """The family's table: config, tokens, ms/call, speed-up, relative error."""
    token_head = "tokens (1/2, 1/4 level)" if result.family == "sdxl" else "image tokens"
    error_head = f"rel. error (mean, min–max of {len(result.seeds)} weight draws)" if len(result.seeds) > 1 else "rel. error"
    lines = [f"| config | {token_head} | ms/call | speed-up | {error_head} |", "|---|---:|---:|---:|---:|"]
    for row in result.rows:
        ms = "–" if row.ms is None else f"{row.ms:.1f}"
        speedup = "–" if row.speedup is None else f"{row.speedup:.2f}x"
        error = _fmt_error(row.rel_error)
        if row.rel_error_range and len(result.seeds) > 1:
            error += f" ({row.rel_error_range[0]:.3f}–{row.rel_error_range[1]:.3f})"
        lines.append(f"| {row.config} | {row.tokens} | {ms} | {speedup} | {error} |")
    return lines


def plot_family(result: FamilyResult, path: Path) -> Path | None:
    """Speed-up (y) against relative error (x), one point per configuration; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    styles = {"toma": ("o-", "C0", "ToMA (block)"), "toma-prop": ("D-", "C4", "ToMA + proportional attention"),
              "toma-attn": ("s", "C2", "ToMA (scope attention)"),
              "tome": ("^", "C3", "built-in ToMe")}
    fig, ax = plt.subplots(figsize=(5.2, 3.6), dpi=110)
    for kind, (marker, color, label) in styles.items():
        rows = [r for r in result.rows if r.kind == kind]
        if rows:
            ax.plot([r.rel_error for r in rows], [r.speedup for r in rows], marker, color=color, label=label)
            spans = [(r.rel_error - r.rel_error_range[0], r.rel_error_range[1] - r.rel_error) if r.rel_error_range else (0, 0)
                     for r in rows]
            ax.errorbar([r.rel_error for r in rows], [r.speedup for r in rows], xerr=list(zip(*spans)), fmt="none",
                        ecolor=color, elinewidth=0.8, capsize=2)
            if kind == "tome":  # all at error 0: one label
                ax.annotate("ratios " + ", ".join(f"{r.ratio:g}" for r in rows), (rows[0].rel_error, rows[0].speedup),
                            textcoords="offset points", xytext=(5, 4), fontsize=8)
                continue
            for r in rows:
                ax.annotate(f"{r.ratio:g}", (r.rel_error, r.speedup), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ideal = {r.ratio: r.speedup for r in result.rows if r.kind == "ideal"}
    toma = [r for r in result.rows if r.kind == "toma" and r.ratio in ideal]
    if toma:
        ax.plot([r.rel_error for r in toma], [ideal[r.ratio] for r in toma], "x", color="0.4",
                label="ideal (unpatched on D tokens), at ToMA's error")
    ax.axhline(1.0, color="0.7", lw=0.8, ls="--")
    for r in result.rows:
        if r.kind == "perturb" and r.rel_error is not None:
            ax.axvline(r.rel_error, color="C1", lw=1, ls=":", label=f"unpatched, {r.config} (error only)")
    ax.set_xlabel("relative error of the denoiser output vs unpatched")
    ax.set_ylabel("speed-up vs unpatched (x)")
    ax.set_title(f"{result.family.upper()}-shaped model: speed-up vs error (labels: ratio)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def result_dict(result: FamilyResult) -> dict:
    """JSON-ready form of a FamilyResult."""
    return {"family": result.family, "setup": result.setup, "seconds": result.seconds, "weight_seeds": result.seeds,
            "reference_repeat_error": result.reference_repeat_error, "rows": [asdict(r) for r in result.rows]}


# --------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--real-size", action="store_true", help="Flux.1 / SDXL sizes (GPU)")
    p.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    p.add_argument("--weight-seeds", type=int, default=3, help="random weight draws the errors are averaged over")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--out", default="bench/out/model_fidelity")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = args.device != "cpu"
    size = "real" if args.real_size else "cpu"
    fargs = flux_args(args.device, "bf16" if gpu else "fp32", size, args.ratios, 9 if gpu else 5, 3 if gpu else 1)
    cli.import_comfy(fargs)
    out = Path(args.out)
    results = []
    for family in args.families:
        if family == "flux":
            result = flux_family(fargs, tuple(range(args.weight_seeds)))
        else:
            result = sdxl_family(sdxl_args(args.device, "fp16" if gpu else "fp32", size, args.ratios, 3, 3 if gpu else 2),
                                 tuple(range(args.weight_seeds)))
        print(f"\n{family}: {result.setup}; {result.seconds:.0f} s")
        print("\n".join(markdown_table(result)))
        plot_family(result, out / f"{family}_speedup_vs_error.png")
        results.append(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_fidelity.json").write_text(json.dumps([result_dict(r) for r in results], indent=1) + "\n")
    md = []
    for r in results:
        md += [f"## {r.family}", "", r.setup, "", *markdown_table(r), ""]
    (out / "model_fidelity.md").write_text("\n".join(md))
    print(f"wrote {out}/model_fidelity.md, model_fidelity.json and the plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
