"""Record the ToMA Patch defaults' image quality on each trained fixture.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.quality.quality_baseline --write

For every fixture (harness/trained.py) and seed in SEEDS, samples the unpatched model and the model
through the ToMA Patch node at its schema defaults, with the fixture's sampler settings, and takes
the PSNR (dB) of ToMA's decoded image against the unpatched one. ``--write`` stores the figures
with the defaults they were measured at in fixtures/quality_baseline.json;
tests/integration/test_quality_regression.py recomputes them and fails when the mean drops below
the recorded value by more than its margin, or when the node's defaults no longer match the record
(then re-run this command after measuring the new defaults with bench/quality/quality.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import metrics

from .. import cli

BENCH = Path(__file__).resolve().parents[1]

SEEDS = (0, 1, 2)
"""Seeds of the regression check: few enough for a CPU test, more than one image."""


def baseline_path() -> Path:
    from harness import trained

    return trained.FIXTURE_DIR / "quality_baseline.json"


def node_defaults() -> dict[str, Any]:
    """The ToMA Patch node's schema defaults (every input but the model)."""
    from harness.pack import pack_module

    node = pack_module("nodes.node.toma_nodes").ToMAPatch
    return {i.id: i.default for i in node.define_schema().inputs if i.id != "model"}


def sampler(family: str) -> Callable[[Any, torch.Tensor, int], np.ndarray]:
    """sample(model, noise, seed) -> decoded image (H, W, 3) for this fixture's sampler settings."""
    import comfy.sample

    from harness import trained

    positive, negative = trained.conditioning(family)
    latent = torch.zeros(trained.latent_shape(family))
    s = trained.SAMPLER[family]

    def sample(model: Any, noise: torch.Tensor, seed: int) -> np.ndarray:
        out = comfy.sample.sample(model, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
                                  positive, negative, latent, seed=seed, disable_pbar=True)
        return trained.decode(family, out)[0].permute(1, 2, 0).double().numpy()

    return sample


def default_psnr(family: str, seeds: tuple[int, ...] = SEEDS) -> list[float]:
    """PSNR (dB) per seed of the ToMA Patch defaults against the unpatched model on `family`."""
    import comfy.sample

    from harness import trained

    base = trained.load_model(family)
    patched = trained.patch_at_node_defaults(base)
    sample = sampler(family)
    scores = []
    for seed in seeds:
        noise = comfy.sample.prepare_noise(torch.zeros(trained.latent_shape(family)), seed)
        scores.append(metrics.psnr(sample(base, noise, seed), sample(patched, noise, seed)))
    return scores


def measure() -> dict[str, Any]:
    """{family: {"seeds", "psnr", "mean"}} for every fixture present, plus the defaults measured."""
    from harness import trained

    record: dict[str, Any] = {"defaults": node_defaults(), "families": {}}
    for family in trained.available():
        scores = default_psnr(family)
        record["families"][family] = {"seeds": list(SEEDS), "psnr": scores, "mean": statistics.fmean(scores)}
    return record


def record_main(argv: list[str] | None, doc: str, script: str, measure: Callable[[], dict[str, Any]],
                path: Callable[[], Path]) -> int:
    """A baseline recorder's command line (this one's, video_baseline.py's): ComfyUI imported as the
    device options say, `measure()` on one thread, printed as JSON with the command that records it
    (python -m bench.quality.<script> --write), stored at `path()` with --write."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    cli.add_device_args(p)
    cli.add_kernel_args(p)
    p.add_argument("--write", action="store_true", help=f"store the figures in fixtures/{script}.json")
    args = p.parse_args(argv)
    cli.import_comfy(args)
    torch.set_num_threads(1)
    record = measure() | {"command": f"python -m bench.quality.{script} --write"}
    print(json.dumps(record, indent=1))
    if args.write:
        path().write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return record_main(argv, __doc__, "quality_baseline", measure, baseline_path)


if __name__ == "__main__":
    raise SystemExit(main())
