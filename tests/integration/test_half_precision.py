"""ToMA in bf16 and fp16 on the trained Flux and SDXL fixtures, on the CPU.

One sampler step at mid-run (step 10 of the fixture's 20, from the same fp32 latent) runs in each
dtype, unpatched and with ToMA at ratio 0.5 on every block. The merged blocks must stay finite, and
with the plans of the fp32 run (recorded and replayed) their error against ToMA in fp32 must stay
within twice the unpatched model's own low-vs-fp32 error: the plan's similarity, choice and softmax
run in fp32 whatever the dtype, so this measures the merge / block / unmerge arithmetic. A plan
chosen from the low-precision tokens themselves may pick other destinations where gains are
near-tied (a discrete change of the merge, not a precision loss: docs/compatibility.md, "Half
precision", whose tables bench/quality/half_precision.py printed in commit bdfdd7a; `git show
43a29c6:bench/quality/half_precision.py` is its last version); that error is
logged and bounded loosely. Errors are the relative L2 of the step's change of the latent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

log = logging.getLogger(__name__)

MID_STEP = 10
OWN_PLAN_FACTOR = 50.0
"""Loose bound on the error with plans chosen in the low dtype, relative to the unpatched error
(measured up to about 24x at single steps; a regression that broke half precision would be orders larger)."""
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def supported(dtype: torch.dtype) -> bool:
    """Whether this torch runs attention and matmuls in `dtype` on the CPU with finite results."""
    try:
        a = torch.ones(4, 4, dtype=dtype)
        return bool(torch.isfinite(torch.nn.functional.scaled_dot_product_attention(a[None], a[None], a[None]) @ a).all())
    except RuntimeError:
        return False


class PlanTape:
    """Stands in for nodes.run.runtime.make_plan: records the plans of a run while `plans` is a list, hands
    the recorded plans back in order while `replaying` is one (every run here builds the same plans in
    the same order), and builds fresh ones otherwise."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.plans: list[Any] | None = None
        self.replaying: list[Any] | None = None

    def __call__(self, features: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.replaying is not None:
            plan = self.replaying.pop(0)
            assert plan.num_tokens == features.shape[1], "the replayed plan is for another call"
            return plan
        plan = self.real(features, *args, **kwargs)
        if self.plans is not None:
            self.plans.append(plan)
        return plan


@contextlib.contextmanager
def plan_tape() -> Iterator[PlanTape]:
    """nodes.run.runtime.make_plan replaced by a PlanTape for the duration."""
    from harness.pack import pack_module

    runtime = pack_module("nodes.run.runtime")
    tape = PlanTape(runtime.make_plan)
    runtime.make_plan = tape
    try:
        yield tape
    finally:
        runtime.make_plan = tape.real


def step_change(family: str, model: Any, latent: torch.Tensor, start: int, last: int) -> torch.Tensor:
    """The latent after the fixture's steps [start, last) from `latent`; from start > 0, the steps' change of it."""
    import comfy.sample

    from harness import trained

    positive, negative = trained.conditioning(family)
    s = trained.SAMPLER[family]
    noise = comfy.sample.prepare_noise(torch.zeros(trained.latent_shape(family)), 0)
    out = comfy.sample.sample(model, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"], positive, negative,
                              latent, seed=0, disable_pbar=True, start_step=start, last_step=last, disable_noise=start > 0)
    return out - latent if start > 0 else out


def merge_every_block(model: Any) -> Any:
    """ToMA at ratio 0.5 on every block of `model` (a clone)."""
    from harness.pack import pack_module

    patching, settings = pack_module("nodes.node.patching"), pack_module("nodes.settings")
    return patching.patch_model(model, settings.ToMASettings(ratio=0.5, blocks="all"))


def step_errors(family: str, step: int) -> list[dict[str, Any]]:
    """Per supported low dtype: the unpatched model's error, ToMA's with the fp32 run's plans and with
    its own, ToMA's against the unpatched model in fp32, and whether every output is finite."""
    from harness import trained
    from harness.metrics import relative_error

    fp32 = trained.load_model(family)
    mid = step_change(family, fp32, torch.zeros(trained.latent_shape(family)), 0, step)
    plain32 = step_change(family, fp32, mid, step, step + 1)
    rows = []
    with plan_tape() as tape:
        tape.plans = []
        merged32 = step_change(family, merge_every_block(fp32), mid, step, step + 1)
        fp32_plans, tape.plans = tape.plans, None
        assert fp32_plans, f"{family}: ToMA built no plan at step {step}"
        for name, dtype in DTYPES.items():
            if not supported(dtype):
                continue
            low = trained.load_model(family, dtype)
            plain = step_change(family, low, mid, step, step + 1)
            model = merge_every_block(low)
            own = step_change(family, model, mid, step, step + 1)
            tape.replaying = list(fp32_plans)
            replayed = step_change(family, model, mid, step, step + 1)
            tape.replaying = None
            rows.append({
                "dtype": name, "unpatched": relative_error(plain, plain32),
                "fp32_plans": relative_error(replayed, merged32), "own_plans": relative_error(own, merged32),
                "toma_vs_unpatched_fp32": relative_error(merged32, plain32),
                "finite": all(bool(torch.isfinite(t).all()) for t in (plain, replayed, own)),
            })
    return rows


@pytest.mark.parametrize("family", ["flux", "sdxl"])
def test_half_precision_error_of_merged_blocks(family: str, comfy: Any) -> None:
    from harness import trained

    assert trained.weights_path(family).is_file(), f"{trained.weights_path(family)} is not shipped"
    rows = step_errors(family, MID_STEP)
    if not rows:
        pytest.skip("neither bf16 nor fp16 is supported by this torch on the CPU")
    for r in rows:
        log.info("%s %s vs fp32: unpatched %.5f, ToMA (fp32 plans) %.5f, ToMA (own plans) %.5f",
                 family, r["dtype"], r["unpatched"], r["fp32_plans"], r["own_plans"])
        assert r["finite"], r
        assert r["toma_vs_unpatched_fp32"] > 1e-3, r  # ToMA merged something
        assert r["fp32_plans"] <= 2 * r["unpatched"], r
        assert r["own_plans"] <= OWN_PLAN_FACTOR * r["unpatched"], r
