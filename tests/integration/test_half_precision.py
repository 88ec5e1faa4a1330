"""ToMA in bf16 and fp16 on the trained Flux and SDXL fixtures, on the CPU (bench/quality/half_precision.py).

One sampler step at mid-run (step 10 of the fixture's 20, from the same fp32 latent) runs in each
dtype, unpatched and with ToMA on every block. The merged blocks must stay finite, and with the
plans of the fp32 run (recorded and replayed) their error against ToMA in fp32 must stay within
twice the unpatched model's own low-vs-fp32 error: the plan's similarity, choice and softmax run
in fp32 whatever the dtype, so this measures the merge / block / unmerge arithmetic. A plan chosen
from the low-precision tokens themselves may pick other destinations where gains are near-tied (a
discrete change of the merge, not a precision loss: docs/compatibility.md, "Half precision"); that
error is logged and bounded loosely.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("torch")

log = logging.getLogger(__name__)

MID_STEP = 10
OWN_PLAN_FACTOR = 50.0
"""Loose bound on the error with plans chosen in the low dtype, relative to the unpatched error
(measured up to about 24x at single steps; a regression that broke half precision would be orders larger)."""


@pytest.fixture(scope="module")
def half_precision(comfy: Any) -> Any:
    from bench.quality import half_precision

    return half_precision


@pytest.mark.parametrize("family", ["flux", "sdxl"])
def test_half_precision_error_of_merged_blocks(family: str, half_precision: Any) -> None:
    from bench.harness import trained

    assert trained.weights_path(family).is_file(), f"{trained.weights_path(family)} is not shipped"
    rows = half_precision.step_errors(family, MID_STEP)
    if not rows:
        pytest.skip("neither bf16 nor fp16 is supported by this torch on the CPU")
    for r in rows:
        log.info("%s %s vs fp32: unpatched %.5f, ToMA (fp32 plans) %.5f, ToMA (own plans) %.5f",
                 family, r["dtype"], r["unpatched"], r["fp32_plans"], r["own_plans"])
        assert r["finite"], r
        assert r["toma_vs_unpatched_fp32"] > 1e-3, r  # ToMA merged something
        assert r["fp32_plans"] <= 2 * r["unpatched"], r
        assert r["own_plans"] <= OWN_PLAN_FACTOR * r["unpatched"], r
