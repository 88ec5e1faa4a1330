"""How far a tiny perturbation moves the sampled image, unpatched against ToMA.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.tokens.stability --tie-tolerances 0,1e-4
    python -m bench.tokens.stability --families flux --seeds 1 --compile        # also eager against inductor

Destination choice is discrete: where two candidate tokens are nearly as good, float noise decides,
and a flipped pick changes the merged tokens and the rest of the trajectory. On each trained fixture
(bench/harness/trained.py), for each seed, the image sampled through comfy.sample.sample is compared (PSNR,
dB; inf = bit-identical) with the image sampled after one perturbation:

- noise: the initial noise plus 1e-6 (--eps) times another seeded normal draw;
- weight: one element of one weight matrix in the middle of the model plus 1e-6, as a ComfyUI weight
  patch (``ModelPatcher.add_patches``);
- compiled (--compile): the same model through ComfyUI's TorchCompileModel node (inductor).

Rows: the unpatched model, and the ToMA Patch node at its defaults once per greedy tie tolerance
(``toma_core.facility.TIE_TOLERANCE``; 0: only exact ties go to the lowest index). The unpatched model's PSNR is the floor of what any perturbation does; the
closer ToMA's is to it, the more stable ToMA is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..harness import cli
from ..harness.metrics import psnr

BENCH = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_device_args(p)
    cli.add_kernel_args(p)
    p.add_argument("--families", nargs="*", help="fixtures to use (default: every one present)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per family")
    p.add_argument("--eps", type=float, default=1e-6, help="size of the perturbations")
    p.add_argument("--tie-tolerances", default="0,1e-4", help="comma-separated greedy tie tolerances for the ToMA rows")
    p.add_argument("--compile", action="store_true", help="also compare eager with TorchCompileModel (inductor)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def sampler(family: str) -> Callable[[Any, torch.Tensor, int], np.ndarray]:
    """sample(model, noise, seed) -> decoded image (H, W, 3) for this fixture's sampler settings."""
    import comfy.sample
    from ..harness import trained

    positive, negative = trained.conditioning(family)
    latent = torch.zeros(trained.latent_shape(family))
    s = trained.SAMPLER[family]

    def sample(model: Any, noise: torch.Tensor, seed: int) -> np.ndarray:
        out = comfy.sample.sample(model, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
                                  positive, negative, latent, seed=seed, disable_pbar=True)
        return trained.decode(family, out)[0].permute(1, 2, 0).double().numpy()

    return sample


def middle_weight(model: Any) -> str:
    """State-dict key of a 2-d weight halfway through the diffusion model."""
    keys = [k for k, v in model.model.state_dict().items() if v.ndim == 2 and k.startswith("diffusion_model.")]
    return keys[len(keys) // 2]


def perturbations(model: Any, eps: float, compile_too: bool) -> dict[str, Callable[[Any, torch.Tensor, int], tuple[Any, torch.Tensor]]]:
    """name -> f(patched model, noise, seed) -> (model, noise) with that one change."""
    key = middle_weight(model)
    shape = model.model.state_dict()[key].shape

    def noise(m: Any, x: torch.Tensor, seed: int) -> tuple[Any, torch.Tensor]:
        return m, x + eps * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 10_000))

    def weight(m: Any, x: torch.Tensor, seed: int) -> tuple[Any, torch.Tensor]:
        diff = torch.zeros(shape)
        diff[shape[0] // 2, shape[1] // 2] = eps
        m = m.clone()
        m.add_patches({key: (diff,)})
        return m, x

    found = {"noise": noise, "weight": weight}
    if compile_too:
        from comfy_extras.nodes_torch_compile import TorchCompileModel

        def compiled(m: Any, x: torch.Tensor, seed: int) -> tuple[Any, torch.Tensor]:
            return TorchCompileModel.execute(m, "inductor").result[0], x

        found["compiled"] = compiled
    return found


def run_family(family: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import comfy.sample
    from ..harness import trained
    from ..harness.pack import pack_module

    facility = pack_module("toma_core.facility")
    base = trained.load_model(family)
    sample = sampler(family)
    rows = [("unpatched", None, base)]
    for tol in (float(t) for t in args.tie_tolerances.split(",")):
        rows.append((f"ToMA defaults, tie tolerance {tol:g}", tol, trained.patch_at_node_defaults(base)))
    shaped = perturbations(base, args.eps, args.compile)
    results = []
    for label, tol, model in rows:
        if tol is not None:
            facility.TIE_TOLERANCE = tol  # an A/B knob of this bench: the library's one constant
        scores: dict[str, list[float]] = {name: [] for name in shaped}
        for seed in range(args.seeds):
            noise = comfy.sample.prepare_noise(torch.zeros(trained.latent_shape(family)), seed)
            reference = sample(model, noise, seed)
            for name, change in shaped.items():
                scores[name].append(psnr(reference, sample(*change(model, noise, seed), seed)))
        row = {"family": family, "row": label} | {name: statistics.fmean(v) for name, v in scores.items()}
        row |= {f"{name} min": min(v) for name, v in scores.items()}
        print(row, flush=True)
        results.append(row)
    return results


def markdown(rows: list[dict[str, Any]], names: list[str]) -> str:
    head = "| fixture | run | " + " | ".join(f"{n} (mean / min dB)" for n in names) + " |"
    lines = [head, "|---|---|" + "---:|" * len(names)]
    for r in rows:
        cells = " | ".join(f"{r[n]:.1f} / {r[n + ' min']:.1f}" for n in names)
        lines.append(f"| {r['family']} | {r['row']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = cli.import_comfy(args)
    torch.set_num_threads(args.threads)
    from ..harness import trained

    families = args.families or list(trained.available())
    if not families:
        sys.exit(f"error: no fixture in {trained.FIXTURE_DIR}; run bench/quality/train_fixtures.py first")
    print(cli.run_header(root, args) + f"eps {args.eps:g}, {args.seeds} seeds", flush=True)
    rows = [row for family in families for row in run_family(family, args)]
    names = [k for k in rows[0] if k not in ("family", "row") and not k.endswith(" min")]
    print(markdown(rows, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
