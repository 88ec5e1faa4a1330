"""Where ToMA's error comes from on the trained fixtures: one block, one model call, one run, on the
Wan fixture (video) against the Flux fixture (image).

    COMFYUI_PATH=../shared/ComfyUI OMP_NUM_THREADS=1 python -m bench.tokens.block_change

Each fixture samples one unpatched run per seed through ``comfy.sample.sample`` (its quality-bench
sampler settings), recording every model call (a unet function wrapper) and every block call
(forward pre-hooks). Each block call is replayed on its recorded input x (B, N, C) of the N image
tokens under a ToMA plan built from that input (tile 4; Wan: frame 0 alone, then tiles of
`--tile-frames` frames, as the Wan adapter cuts them; features: a LayerNorm of x, as the pack uses).
With Delta = block(x) - x the block's exact change on the image tokens and M / U the plan's merge
and unmerge, the first table gives, as means over seeds, blocks and the calls of each third of the
steps (early = high noise):

- input  ||U M x - x|| / ||x||: how far the merged tokens are from the tokens they stand for;
- carry  ||U M Delta - Delta|| / ||Delta||: the best any merged block could do with this plan (it
  returns exactly the merged change): how alike the merged tokens' changes are;
- run    ||U (block(M x) - M x) - Delta|| / ||Delta||: ToMA's delta unmerge (the block run on the D
  merged tokens, rope rows gathered to the destinations);
- call   ||ToMA(x_t) - model(x_t)|| / ||model(x_t)||: a whole model call through the pack (every
  block merged, a plan per call) on the recorded input x_t of the unpatched run: the error one
  sampling step adds.

The second table samples whole runs: ToMA on every block and step, ToMA on the first two thirds
or the last third of the steps only (`--windows`), and for scale the unpatched model from perturbed
noise (`--noise-mix` m: sqrt(1 - m^2) n + m n'; m = 1 is another seed):
relative error of the sampled latent and PSNR of the decoded pixels against the unpatched run.
The third gives how alike neighbouring tokens of the block inputs are (mean cosine), in space and,
for video, at the same place one frame later, beside a random token of the same call for scale.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..harness import cli
from ..harness.metrics import psnr, relative_error

FIXTURES = ("wan", "flux")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixtures", nargs="+", default=list(FIXTURES), choices=FIXTURES)
    p.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5])
    p.add_argument("--tile-size", type=int, default=4)
    p.add_argument("--tile-frames", type=int, default=4, help="frames per tile on the Wan fixture")
    p.add_argument("--noise-mix", type=float, nargs="+", default=[0.01, 0.05, 1.0],
                   help="unpatched runs from slightly perturbed noise, for scale (Fixture.sample)")
    p.add_argument("--wan-shift", type=float, default=0.0,
                   help="sample the Wan fixture at this flow shift (ComfyUI's ModelSamplingSD3; 0: its own 8)")
    p.add_argument("--windows", type=window, nargs="*", default=[(0.0, 2 / 3), (2 / 3, 1.0)], metavar="START:END",
                   help="whole runs with ToMA only from start_percent START to end_percent END")
    p.add_argument("--window-ratio", type=float, default=0.5, help="the ratio of the --windows runs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"])
    p.set_defaults(device="cpu", dtype="fp32")
    return p.parse_args(argv)


def window(text: str) -> tuple[float, float]:
    """"START:END" -> (start_percent, end_percent)."""
    start, _, end = text.partition(":")
    return float(start), float(end)


@dataclass
class BlockCall:
    """One recorded block call: its model call (`step`), the block's name, its image-token input
    x (B, N, C) and a replay of the block on other image tokens."""

    step: int
    block: str
    x: torch.Tensor
    replay: Callable[[torch.Tensor, Callable[[torch.Tensor, int], torch.Tensor] | None], torch.Tensor]
    """replay(img, take): the block's output image tokens for input image tokens img (B, N', C);
    take(rows, dim) gathers the per-token rope rows to img's tokens (None: all N tokens)."""


class Recorder:
    """Forward pre-hooks on a fixture's blocks that keep each call's arguments as a BlockCall."""

    def __init__(self) -> None:
        self.calls: list[BlockCall] = []
        self.step = -1
        self.handles: list[Any] = []

    def next_call(self) -> None:
        self.step += 1

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def record_wan(dm: Any, rec: Recorder) -> None:
    """Wan blocks: block(x (B, N, C), e, freqs (1, N, 1, hd/2, 2, 2), context, ...) -> x."""
    for i, block in enumerate(dm.blocks):
        def hook(module: Any, args: tuple, kwargs: dict, i: int = i) -> None:
            x, kw = args[0].detach().clone(), dict(kwargs)

            def replay(img: torch.Tensor, take: Callable | None, module: Any = module, kw: dict = kw) -> torch.Tensor:
                freqs = kw["freqs"] if take is None else take(kw["freqs"], 1)
                return module(img, **(kw | {"freqs": freqs}))

            rec.calls.append(BlockCall(rec.step, f"block {i}", x, replay))

        rec.handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))


def record_flux(dm: Any, rec: Recorder, image_tokens: int) -> None:
    """Flux double blocks: block(img=(B, N, C), txt=(B, T, C), vec, pe (1, 1, T+N, ...)) -> (img, txt);
    single blocks: block(cat(txt, img) (B, T+N, C), vec=, pe=) -> the same sequence."""
    for i, block in enumerate(dm.double_blocks):
        def hook(module: Any, args: tuple, kwargs: dict, i: int = i) -> None:
            kw = dict(kwargs, txt=kwargs["txt"].detach().clone())  # the block adds to txt in place
            text = kw["txt"].shape[1]

            def replay(img: torch.Tensor, take: Callable | None, module: Any = module, kw: dict = kw) -> torch.Tensor:
                fresh = {"img": img, "txt": kw["txt"].clone(), "pe": _flux_pe(kw["pe"], text, take)}
                return module(**(kw | fresh))[0]

            rec.calls.append(BlockCall(rec.step, f"double {i}", kw["img"].detach().clone(), replay))

        rec.handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    for i, block in enumerate(dm.single_blocks):
        def hook(module: Any, args: tuple, kwargs: dict, i: int = i) -> None:
            seq, kw = args[0], dict(kwargs)
            text = seq.shape[1] - image_tokens
            txt = seq[:, :text].detach().clone()

            def replay(img: torch.Tensor, take: Callable | None, module: Any = module, kw: dict = kw) -> torch.Tensor:
                out = module(torch.cat([txt, img], dim=1), **(kw | {"pe": _flux_pe(kw["pe"], text, take)}))
                return out[:, text:]

            rec.calls.append(BlockCall(rec.step, f"single {i}", seq[:, text:].detach().clone(), replay))

        rec.handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))


def _flux_pe(pe: torch.Tensor, text: int, take: Callable | None) -> torch.Tensor:
    """Flux's rope table (1, 1, T+N, hd/2, 2, 2) with its image rows gathered by take."""
    if take is None:
        return pe
    return torch.cat([pe[:, :, :text], take(pe[:, :, text:], 2)], dim=2)


@dataclass(frozen=True)
class Fixture:
    """A loaded fixture: its model, sampler inputs, and a plan maker for its block inputs."""

    name: str
    model: Any
    latent: torch.Tensor
    positive: list
    negative: list
    sampler: dict[str, Any]
    record: Callable[[Any, Recorder], None]
    plan: Callable[[torch.Tensor, float], Any]
    """plan(features (B, N, C), ratio) -> a toma_core MergePlan over the N image tokens."""
    decode: Callable[[torch.Tensor], torch.Tensor]
    """decode(latent) -> pixels in [0, 1] (B, 3, ...)."""
    grid: tuple[int, int, int]
    """(F, h, w) of the image tokens (F = 1 for an image), t-major."""

    def sample(self, model: Any, seed: int, noise_mix: float = 0.0) -> torch.Tensor:
        """The sampled latent of `model` from seed's noise; noise_mix m > 0 blends in m of another
        draw (sqrt(1 - m^2) n + m n'), a perturbation of known size for scale."""
        import comfy.sample

        noise = comfy.sample.prepare_noise(self.latent, seed)
        if noise_mix:
            other = comfy.sample.prepare_noise(self.latent, seed + 1000)
            noise = (1 - noise_mix ** 2) ** 0.5 * noise + noise_mix * other
        s = self.sampler
        return comfy.sample.sample(model, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
                                   self.positive, self.negative, self.latent, seed=seed, disable_pbar=True)


def wan_fixture(args: argparse.Namespace) -> Fixture:
    from ..harness import trained_video as tv
    from ..harness.pack import pack_module

    video = pack_module("toma_core.video")
    _, _, frames, height, width = tv.latent_shape()
    h, w = height // 2, width // 2
    # the Wan adapter's cut of a T2V call without a noise mask (nodes/families/wan.py, _frame_runs)
    segments = [video.Segment(n, tile_frames=args.tile_frames) for _, n in video.frame_runs([[0.0] * frames])]
    positive, negative = tv.conditioning()
    model = tv.load_model()
    if args.wan_shift:
        from comfy_extras.nodes_model_advanced import ModelSamplingSD3

        model = ModelSamplingSD3().patch(model, args.wan_shift)[0]
    return Fixture(
        "wan", model, torch.zeros(tv.latent_shape()), positive, negative, dict(tv.SAMPLER), record_wan,
        lambda feats, ratio: video.make_video_plan(feats, segments, h, w, ratio, args.tile_size), tv.decode,
        (frames, h, w),
    )


def flux_fixture(args: argparse.Namespace) -> Fixture:
    from ..harness import trained
    from ..harness.pack import pack_module

    make_plan = pack_module("toma_core").make_plan

    shape = trained.latent_shape("flux")
    h, w = shape[2] // 2, shape[3] // 2
    positive, negative = trained.conditioning("flux")
    return Fixture(
        "flux", trained.load_model("flux"), torch.zeros(shape), positive, negative, dict(trained.SAMPLER["flux"]),
        lambda dm, rec: record_flux(dm, rec, h * w),
        lambda feats, ratio: make_plan(feats, h, w, ratio, args.tile_size),
        lambda latent: trained.decode("flux", latent), (1, h, w),
    )


@dataclass
class ModelCall:
    """One recorded model call: BaseModel.apply_model's input (B, C, ...), sigma, conditioning and output."""

    step: int
    x: torch.Tensor
    sigma: torch.Tensor
    cond: dict[str, Any]
    out: torch.Tensor


def record_run(fixture: Fixture, seed: int) -> tuple[list[BlockCall], list[ModelCall], torch.Tensor]:
    """Every block call and every model call of one unpatched sampling run of `fixture` with `seed`,
    and the sampled latent."""
    model = fixture.model.clone()
    dm = model.get_model_object("diffusion_model")
    rec, calls = Recorder(), []

    def unet(apply_model: Callable, p: dict) -> torch.Tensor:
        rec.next_call()
        out = apply_model(p["input"], p["timestep"], **p["c"])
        cond = {k: v for k, v in p["c"].items() if k != "transformer_options"}
        calls.append(ModelCall(rec.step, p["input"].clone(), p["timestep"].clone(), cond, out.clone()))
        return out

    model.set_model_unet_function_wrapper(unet)
    fixture.record(dm, rec)
    try:
        latent = fixture.sample(model, seed)
    finally:
        rec.close()
    return rec.calls, calls, latent


def patched(fixture: Fixture, ratio: float, args: argparse.Namespace, start: float = 0.0, end: float = 1.0) -> Any:
    """The fixture under ToMA through the pack: every block, the steps from start_percent `start`
    to end_percent `end`, `ratio`, --tile-size and --tile-frames (which only video models read)."""
    from ..harness.pack import pack_module

    nodes, patching = pack_module("nodes.toma_nodes"), pack_module("nodes.patching")
    settings = nodes.build_settings(ratio, args.tile_size, start, end, 1, 1, blocks="all", min_tokens=0,
                                    tile_frames=args.tile_frames)
    return patching.patch_model(fixture.model, settings)


def call_error(model: Any, call: ModelCall) -> float:
    """||ToMA's output - the unpatched output|| / ||the unpatched output|| of one recorded call."""
    from ..harness import sampling

    sigmas = torch.cat([call.sigma[:1], torch.zeros(1)])
    out = sampling.model_call(model, call.x, sigmas, [0] * call.x.shape[0], ["block_change"] * call.x.shape[0],
                              **call.cond)()
    return relative_error(out, call.out)


def plan_features(x: torch.Tensor) -> torch.Tensor:
    """The features the pack builds its plans from (nodes/machinery/merge.features), (B, N, C)."""
    from ..harness.pack import pack_module

    return pack_module("nodes.machinery.merge").features(x)


@torch.no_grad()
def exact_output(call: BlockCall) -> torch.Tensor:
    """The block's output image tokens (B, N, C) on all of its recorded input."""
    return call.replay(call.x, None)


@torch.no_grad()
def errors(call: BlockCall, plan: Any, exact: torch.Tensor) -> dict[str, float]:
    """input / carry / run errors of one block call under `plan` (module docstring); exact is
    `exact_output(call)`, computed once for all plans of the call."""
    x = call.x
    delta = exact - x
    x_m = plan.merge(x)
    out_m = call.replay(x_m, plan.take)
    return {
        "input": relative_error(plan.unmerge(x_m), x),
        "carry": relative_error(plan.unmerge(plan.merge(delta)), delta),
        "run": relative_error(plan.unmerge_residual(x, x_m, out_m) - x, delta),
    }


def neighbours(feats: torch.Tensor, grid: tuple[int, int, int]) -> dict[str, float]:
    """Mean cosine similarity of each token's features (B, N, C) to its right and lower neighbour,
    to the token at its place in the next frame (frames 1.. only: frame 0 never merges with them;
    nan for an image) and, for scale, to a token drawn at random from the same call."""
    f, h, w = grid
    unit = F.normalize(feats.float(), dim=-1)
    x = unit.unflatten(1, (f, h, w))
    shuffled = unit[:, torch.randperm(unit.shape[1], generator=torch.Generator().manual_seed(0))]

    def cos(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a * b).sum(-1).mean())

    return {
        "right": cos(x[:, :, :, 1:], x[:, :, :, :-1]),
        "down": cos(x[:, :, 1:], x[:, :, :-1]),
        "next frame": cos(x[:, 2:], x[:, 1:-1]) if f > 2 else math.nan,
        "random": cos(unit, shuffled),
    }


def third(step: int, steps: int) -> str:
    return ("early", "middle", "late")[min(2, 3 * step // steps)]


PARTS = ("early", "middle", "late")


@dataclass
class Findings:
    """What `measure` collects for one fixture, keyed by (ratio, third of the steps) or run label."""

    blocks: dict[tuple[float, str], list[dict[str, float]]] = field(default_factory=dict)
    calls: dict[tuple[float, str], list[float]] = field(default_factory=dict)
    runs: dict[tuple[str, float | None], list[tuple[float, float]]] = field(default_factory=dict)
    alike: dict[str, list[dict[str, float]]] = field(default_factory=dict)


def measure(fixture: Fixture, args: argparse.Namespace) -> Findings:
    """Every seed's recorded run of `fixture`, its block and model calls replayed (module docstring)."""
    ratios, steps, found = args.ratios, fixture.sampler["steps"], Findings()
    models = {ratio: patched(fixture, ratio, args) for ratio in ratios}
    variants = {(f"ToMA {r:g}", r): (models[r], 0.0) for r in ratios}
    variants |= {(f"ToMA {args.window_ratio:g}, steps {a:.0%}-{b:.0%}", None): (patched(fixture, args.window_ratio, args, a, b), 0.0)
                 for a, b in args.windows}
    variants |= {(f"noise {m:g}", None): (fixture.model, m) for m in args.noise_mix}
    for seed in range(args.seeds):
        block_calls, model_calls, reference = record_run(fixture, seed)
        for call in block_calls:
            feats, exact = plan_features(call.x), exact_output(call)
            found.alike.setdefault(third(call.step, steps), []).append(neighbours(feats, fixture.grid))
            for ratio in ratios:
                found.blocks.setdefault((ratio, third(call.step, steps)), []).append(
                    errors(call, fixture.plan(feats, ratio), exact))
        for call in model_calls:
            for ratio in ratios:
                found.calls.setdefault((ratio, third(call.step, steps)), []).append(call_error(models[ratio], call))
        for key, (model, mix) in variants.items():
            latent = fixture.sample(model, seed, mix)
            found.runs.setdefault(key, []).append(
                (relative_error(latent, reference), psnr(fixture.decode(reference), fixture.decode(latent))))
    return found


def block_rows(name: str, found: Findings) -> list[str]:
    rows = []
    for (ratio, part), errs in sorted(found.blocks.items(), key=lambda kv: (kv[0][0], PARTS.index(kv[0][1]))):
        means = [statistics.fmean(e[k] for e in errs) for k in ("input", "carry", "run")]
        means.append(statistics.fmean(found.calls[(ratio, part)]))
        rows.append(f"| {name} | {ratio:g} | {part} | {len(errs)} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return rows


def run_rows(name: str, found: Findings) -> list[str]:
    rows = []
    for (label, ratio), results in found.runs.items():
        per_call = "" if ratio is None else f"{statistics.fmean(e for (r, _), es in found.calls.items() if r == ratio for e in es):.3f}"
        rows.append(f"| {name} | {label} | {per_call} | {statistics.fmean(e for e, _ in results):.3f} | "
                    f"{statistics.fmean(db for _, db in results):.1f} |")
    return rows


def alike_rows(name: str, found: Findings) -> list[str]:
    return [f"| {name} | {part} | " + " | ".join(f"{statistics.fmean(a[k] for a in found.alike[part]):.3f}"
                                                  for k in ("right", "down", "next frame", "random")) + " |"
            for part in PARTS]


TABLES = (
    ("| fixture | ratio | steps | block calls | input | carry | run | call |\n|---|---:|---|---:|---:|---:|---:|---:|",
     block_rows),
    ("| fixture | run | call error (mean) | sample error | PSNR (dB) |\n|---|---|---:|---:|---:|", run_rows),
    (("| fixture | steps | cosine to right neighbour | lower neighbour | same place, next frame | a random token |\n"
      "|---|---|---:|---:|---:|---:|"),
     alike_rows),
)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = cli.import_comfy(args)
    makers = {"wan": wan_fixture, "flux": flux_fixture}
    found = {name: measure(makers[name](args), args) for name in args.fixtures}
    print(cli.run_header(root, args) + f"seeds 0-{args.seeds - 1}, tile {args.tile_size}, Wan tile_frames {args.tile_frames}")
    for header, rows in TABLES:
        print(f"\n{header}")
        for name, findings in found.items():
            print("\n".join(rows(name, findings)))


if __name__ == "__main__":
    main()
