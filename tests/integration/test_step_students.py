"""The step-distilled students (fixtures/flux_4step, fixtures/wan_4step; bench/quality/distill_fixtures.py).

Each loads through the harness into its teacher's ComfyUI class with the shipped fp16 weights, stays
out of the families every bench and test iterates over, carries the teacher's conditioning, and is
distilled: on a held-out seed its 4-step output is closer to the teacher's 20-step output than the
teacher's own 4-step output is (the json's proof table holds the 8-seed figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from harness import metrics

STUDENTS = ("flux", "wan")


@pytest.fixture(scope="module")
def distill(comfy: Path) -> Any:
    from bench.quality import distill_fixtures

    return distill_fixtures


def test_students_stay_out_of_the_shipped_families(comfy: Path) -> None:
    from harness import trained

    assert not set(trained.STUDENTS) & set(trained.FAMILIES)
    assert set(trained.available()) <= set(trained.FAMILIES)
    assert trained.SAMPLER["flux_4step"] == trained.SAMPLER["flux"] | {"steps": 4}


@pytest.mark.parametrize("family", STUDENTS)
def test_student_loads_with_its_weights_and_teacher_conditioning(distill: Any, family: str) -> None:
    from safetensors.torch import load_file

    from harness import trained
    from harness import trained_video as tv

    teacher, student = distill.Fixture(family), distill.Fixture(family, student=True)
    path = tv.weights_path(student=True) if student.video else trained.weights_path(student.name)
    assert path.is_file(), f"{path} is not shipped"
    assert type(student.model) is type(teacher.model)
    stored = load_file(str(path))
    state = student.model.diffusion_model.state_dict()
    weights = {k: v for k, v in stored.items() if not k.startswith(trained.COND_PREFIX)}
    if family == "flux":
        weights = trained.family_config(family).process_unet_state_dict(weights)
    assert set(weights) == set(state) and all(v.dtype == torch.float16 for v in weights.values())
    assert all(torch.equal(state[k], v.float()) for k, v in weights.items())
    assert all(torch.equal(student.cond[k], v) for k, v in teacher.cond.items())
    assert student.sampler["steps"] == 4


@pytest.mark.parametrize("family", STUDENTS)
def test_student_at_4_steps_is_closer_to_the_teacher_at_20_than_the_teacher_at_4(distill: Any, family: str) -> None:
    teacher, student = distill.Fixture(family), distill.Fixture(family, student=True)
    noise = teacher.noise([distill.PROOF_SEEDS[0]])
    ref = teacher.images(teacher.sample(noise, 20))
    psnr_teacher = metrics.psnr(ref, teacher.images(teacher.sample(noise, 4)))
    psnr_student = metrics.psnr(ref, student.images(student.sample(noise, 4)))
    assert psnr_student > psnr_teacher, (psnr_student, psnr_teacher)
