"""The destination rules (Advanced inputs `destinations`, `destination_penalty`) on tiny random-weight
Flux and SDXL models sampled through `comfy.sample.sample`: "output_similarity" plans every call
after the first from the planning block's output (the run line counts them, at every grid and in
every scope that runs a whole block), the penalty changes the image, and nothing a run remembers
reaches the next run. Skipped with a reason when ComfyUI is not importable."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compat_support import RUNTIME_LOGGER, patch, run_records  # noqa: E402
from harness.tiny_models import FLUX_LATENT  # noqa: E402

SDXL_LATENT = (1, 4, 16, 16)
OUTPUTS = {"destinations": "output_similarity"}


@pytest.mark.parametrize("scope", ["block", "keys_values"])
def test_flux_plans_from_block_outputs_after_the_first_call(tiny_flux: Any, tiny: Any, toma: Any, scope: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    today = tiny.sample(patch(toma, tiny_flux, blocks="all", scope=scope), FLUX_LATENT, steps=3, seed=1)
    out = tiny.sample(patch(toma, tiny_flux, blocks="all", scope=scope, **OUTPUTS), FLUX_LATENT, steps=3, seed=1)
    facility, outputs = run_records(caplog)
    assert facility.plans_from_outputs is None
    assert (outputs.plans_built, outputs.plans_from_outputs) == (3, 2)  # one plan per step; the first from the input
    assert torch.isfinite(out).all() and not torch.equal(out, today)


def test_sdxl_every_level_plans_from_its_own_outputs(tiny_sdxl: Any, tiny: Any, toma: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    tiny.sample(patch(toma, tiny_sdxl, destination_penalty=0.5, **OUTPUTS), SDXL_LATENT, steps=3, cfg=3.0)
    (run,) = run_records(caplog)
    assert (run.plans_built, run.plans_from_outputs) == (6, 4)  # 2 levels x 3 steps, cond and uncond in one batch


@pytest.mark.parametrize("rule", [{}, OUTPUTS])
def test_penalty_changes_the_image(tiny_flux: Any, tiny: Any, toma: Any, rule: dict) -> None:
    plain = tiny.sample(patch(toma, tiny_flux, blocks="all", **rule), FLUX_LATENT, steps=3, seed=2)
    penalised = tiny.sample(patch(toma, tiny_flux, blocks="all", destination_penalty=1.0, **rule), FLUX_LATENT, steps=3, seed=2)
    assert not torch.equal(plain, penalised)


@pytest.mark.parametrize("build, latent", [("tiny_flux", FLUX_LATENT), ("tiny_sdxl", SDXL_LATENT)])
def test_nothing_remembered_reaches_the_next_run(build: str, latent: tuple, tiny: Any, toma: Any,
                                                 request: pytest.FixtureRequest) -> None:
    """A run after another run of the same patched model (other seed, other size) equals a first run."""
    model = request.getfixturevalue(build)
    patched = patch(toma, model, blocks="all", destination_penalty=0.3, **OUTPUTS)
    first = tiny.sample(patched, latent, seed=3, steps=3)
    bigger = (*latent[:2], latent[2] + 4, latent[3])
    tiny.sample(patched, bigger, seed=4, steps=3)
    assert torch.equal(tiny.sample(patched, latent, seed=3, steps=3), first)
    fresh = patch(toma, model, blocks="all", destination_penalty=0.3, **OUTPUTS)
    assert torch.equal(tiny.sample(fresh, bigger, seed=4, steps=3), tiny.sample(patched, bigger, seed=4, steps=3))


def test_advanced_node_takes_the_rule_and_ratio_zero_stays_identical(tiny_flux: Any, tiny: Any, toma: Any) -> None:
    """The inputs go last on the node (saved workflows are positional) and are optional (an API prompt
    saved before them still validates); ratio 0 is the unpatched model."""
    inputs = toma.nodes.ToMAPatchAdvanced.define_schema().inputs
    assert [i.id for i in inputs[-2:]] == ["destinations", "destination_penalty"] and all(i.optional for i in inputs[-2:])
    baseline = tiny.sample(tiny_flux, FLUX_LATENT, seed=5)
    zero = patch(toma, tiny_flux, ratio=0.0, destination_penalty=1.0, **OUTPUTS)
    assert torch.equal(tiny.sample(zero, FLUX_LATENT, seed=5), baseline)
    defaults = {i.id: i.default for i in toma.nodes.ToMAPatchAdvanced.define_schema().inputs if i.id != "model"}
    model = toma.nodes.ToMAPatchAdvanced.execute(tiny_flux, **(defaults | {"min_tokens": "0", "destination_penalty": 0.2} | OUTPUTS)).result[0]
    assert torch.isfinite(tiny.sample(model, FLUX_LATENT, seed=5, steps=2)).all()
