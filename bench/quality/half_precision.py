"""ToMA in bf16 and fp16 against fp32 on the trained Flux and SDXL fixtures (bench/harness/trained.py), CPU.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.quality.half_precision --steps 4 10 16

One sampler step (from the same fp32 latent, after `step` fp32 steps of the fixture's 20) runs in
each dtype, unpatched and with ToMA (ratio 0.5 on every block, a plan every call). Errors are the
relative L2 of the step's change of the latent (the model's prediction) against fp32:

* unpatched: the model's own low-precision error;
* ToMA, fp32 plans: the same merged blocks with the plans the fp32 run chose (recorded and replayed
  by PlanTape), i.e. the merge / block / unmerge arithmetic in the low dtype;
* ToMA, own plans: the plans chosen from the low-precision tokens. The plan's similarity, greedy
  choice and softmax run in fp32 whatever the dtype (nodes/machinery/merge.py `features`,
  toma_core/similarity.py `prepare_features`), but the tokens themselves carry the model's own
  low-precision error, and where two candidates' gains are closer than that error the greedy pick
  (toma_core/facility.py, ties within TIE_TOLERANCE to the lowest index) can go the other way: a
  discrete change of the merge in a few tiles.

Then whole 20-step runs: PSNR of the decoded image in each dtype against the fp32 image, unpatched
and with the ToMA Patch node's defaults (min_tokens 0, as trained.patch_at_node_defaults): what a
user sees when switching the weights' dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..harness import comfy_env, trained
from ..harness.metrics import psnr, relative_error
from ..harness.pack import pack_module

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def supported(dtype: torch.dtype) -> bool:
    """Whether this torch runs attention and matmuls in `dtype` on the CPU with finite results."""
    try:
        a = torch.ones(4, 4, dtype=dtype)
        return bool(torch.isfinite(torch.nn.functional.scaled_dot_product_attention(a[None], a[None], a[None]) @ a).all())
    except RuntimeError:
        return False


class PlanTape:
    """Stands in for nodes.runtime.make_plan: records the plans of a run while `plans` is a list, hands
    the recorded plans back in order while `replaying` is one (every run here builds the same plans in
    the same order), and builds fresh ones otherwise."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.plans: list[Any] | None = None
        self.replaying: list[Any] | None = None

    def __call__(self, features: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.replaying is not None:
            plan = self.replaying.pop(0)
            if plan.num_tokens != features.shape[1]:
                raise RuntimeError(f"replayed plan has {plan.num_tokens} tokens, the call {features.shape[1]}")
            return plan
        plan = self.real(features, *args, **kwargs)
        if self.plans is not None:
            self.plans.append(plan)
        return plan


@contextlib.contextmanager
def plan_tape() -> Iterator[PlanTape]:
    """nodes.runtime.make_plan replaced by a PlanTape for the duration."""
    runtime = pack_module("nodes.runtime")
    tape = PlanTape(runtime.make_plan)
    runtime.make_plan = tape
    try:
        yield tape
    finally:
        runtime.make_plan = tape.real


class Fixture:
    """One trained fixture's sampling set-up: conditioning, seeded noise, the sampler settings."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.positive, self.negative = trained.conditioning(family)
        self.sampler = trained.SAMPLER[family]
        self.empty = torch.zeros(trained.latent_shape(family))

    def run(self, model: Any, latent: torch.Tensor, start: int, last: int) -> torch.Tensor:
        """The latent after steps [start, last) from `latent`; from start > 0, the steps' change of it."""
        import comfy.sample

        noise = comfy.sample.prepare_noise(self.empty, 0)
        s = self.sampler
        out = comfy.sample.sample(
            model, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"], self.positive, self.negative,
            latent, seed=0, disable_pbar=True, start_step=start, last_step=last, disable_noise=start > 0,
        )
        return out - latent if start > 0 else out

    def image(self, model: Any) -> torch.Tensor:
        """The decoded (1, 3, H, W) image of a whole run."""
        return trained.decode(self.family, self.run(model, self.empty, 0, self.sampler["steps"]))


def merge_every_block(model: Any) -> Any:
    """ToMA at ratio 0.5 on every block of `model` (a clone)."""
    patching, settings = pack_module("nodes.patching"), pack_module("nodes.settings")
    return patching.patch_model(model, settings.ToMASettings(ratio=0.5, blocks="all"))


def step_errors(family: str, step: int) -> list[dict[str, Any]]:
    """Per supported low dtype, the three step errors of the module docstring (and finiteness)."""
    fx = Fixture(family)
    fp32 = trained.load_model(family)
    mid = fx.run(fp32, fx.empty, 0, step)
    plain32 = fx.run(fp32, mid, step, step + 1)
    with plan_tape() as tape:
        tape.plans = []
        merged32 = fx.run(merge_every_block(fp32), mid, step, step + 1)
        fp32_plans, tape.plans = tape.plans, None
        if not fp32_plans:
            raise RuntimeError(f"{family}: ToMA built no plan at step {step}")
        rows = []
        for name, dtype in DTYPES.items():
            if not supported(dtype):
                continue
            low = trained.load_model(family, dtype)
            plain = fx.run(low, mid, step, step + 1)
            model = merge_every_block(low)
            own = fx.run(model, mid, step, step + 1)
            tape.replaying = list(fp32_plans)
            replayed = fx.run(model, mid, step, step + 1)
            tape.replaying = None
            rows.append({
                "family": family, "step": step, "dtype": name,
                "unpatched": relative_error(plain, plain32),
                "fp32_plans": relative_error(replayed, merged32),
                "own_plans": relative_error(own, merged32),
                "toma_vs_unpatched_fp32": relative_error(merged32, plain32),
                "finite": all(bool(torch.isfinite(t).all()) for t in (plain, replayed, own)),
            })
    return rows


def image_psnr(family: str) -> list[dict[str, Any]]:
    """Per supported low dtype, PSNR of the whole-run image against fp32, unpatched and at the node defaults."""
    fx = Fixture(family)
    fp32 = trained.load_model(family)
    reference = {"unpatched": fx.image(fp32), "ToMA defaults": fx.image(trained.patch_at_node_defaults(fp32))}
    rows = []
    for name, dtype in DTYPES.items():
        if not supported(dtype):
            continue
        low = trained.load_model(family, dtype)
        images = {"unpatched": fx.image(low), "ToMA defaults": fx.image(trained.patch_at_node_defaults(low))}
        rows.append({"family": family, "dtype": name} | {k: psnr(reference[k][0], images[k][0]) for k in images})
    return rows


def markdown(steps: list[dict[str, Any]], images: list[dict[str, Any]]) -> str:
    lines = ["| fixture | step | dtype | unpatched | ToMA, fp32 plans | ToMA, own plans | own / unpatched | ToMA vs unpatched (fp32) |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in steps:
        lines.append(f"| {r['family']} | {r['step']} | {r['dtype']} | {r['unpatched']:.5f} | {r['fp32_plans']:.5f} | "
                     f"{r['own_plans']:.5f} | {r['own_plans'] / r['unpatched']:.1f}x | {r['toma_vs_unpatched_fp32']:.4f} |")
    lines += ["", "| fixture | dtype | unpatched: PSNR vs fp32 image | ToMA defaults: PSNR vs fp32 ToMA image |", "|---|---|---:|---:|"]
    for r in images:
        lines.append(f"| {r['family']} | {r['dtype']} | {r['unpatched']:.1f} dB | {r['ToMA defaults']:.1f} dB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=["flux", "sdxl"], choices=list(trained.FAMILIES))
    p.add_argument("--steps", nargs="+", type=int, default=[4, 10, 16], help="mid-run steps to compare at")
    p.add_argument("--tie-tolerance", type=float, default=None,
                   help="replace toma_core.facility.TIE_TOLERANCE for this run (what-if; the pack ships its own)")
    p.add_argument("--no-images", action="store_true", help="skip the whole-run image comparison (slow in bf16 on a CPU)")
    args = p.parse_args(argv)
    if args.tie_tolerance is not None:
        pack_module("toma_core.facility").TIE_TOLERANCE = args.tie_tolerance
    result = comfy_env.import_comfy()
    if isinstance(result, str):
        sys.exit(result)
    torch.set_num_threads(1)
    steps, images = [], []
    for family in args.families:
        for step in args.steps:
            for row in step_errors(family, step):
                steps.append(row)
                print(json.dumps(row), flush=True)
        for row in [] if args.no_images else image_psnr(family):
            images.append(row)
            print(json.dumps(row), flush=True)
    print(markdown(steps, images))
    return 0


if __name__ == "__main__":
    sys.exit(main())
