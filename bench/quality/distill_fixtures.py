"""Distil a trained fixture into a 4-step student by reflow on the teacher's own 20-step couplings.

    COMFYUI_PATH=/path/to/ComfyUI OMP_NUM_THREADS=1 python -m bench.quality.distill_fixtures --family flux --pairs 64 --minutes 12 --lr 2e-4

Writes fixtures/<family>_4step.safetensors (fp16, the teacher's tensor names and conditioning) and
its .json (command, seeds, minutes, losses, proof). Reflow (arXiv 2209.03003): noises z (seeds from
PAIR_SEED, disjoint from PROOF_SEEDS) go through the teacher's 20-step euler / simple sampler
(``comfy.sample.sample``) to x0; the student, a copy of the teacher, learns through
``BaseModel.apply_model`` (``train_fixtures``' path) to predict x0 from x_t = sigma z + (1 - sigma) x0
(``CONST.noise_scaling``), sigma one of the 4-step schedule's (``comfy.samplers.calculate_sigmas``)
with probability ``--on-grid``, else the teacher's uniform flow time through the class's shift. An
exact prediction puts every Euler step on the line from z to x0. Loss: MSE of denoised against x0.
Proof: PSNR of decoded outputs on PROOF_SEEDS (as quality.py draws them) against the teacher's 20
steps: the teacher at 4 steps, the student at 3, 4 and 8 (Wan: over the whole clip).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness import comfy_env, metrics, trained, trained_video as tv

from . import train_video_fixture as tvf
from .train_fixtures import import_comfy, lr_at, model_kwargs, training_transformer_options, write_meta, write_weights

PAIR_SEED = 1000
PROOF_SEEDS = tuple(range(8))


class Fixture:
    """The teacher and student of one family behind one interface (image: harness.trained, Wan: trained_video)."""

    def __init__(self, family: str, student: bool = False) -> None:
        self.family, self.video = family, family == tv.FAMILY
        self.name = f"{family}_4step" if student else family
        if self.video:
            self.patcher, self.cond = tv.load_model(student=student), tv.conditioning_tensors()
            self.shape, self.latent_format, self.positive = tv.latent_shape(), tv._latent_format(), tv.conditioning()
            self.decode, self.sampler = tv.decode, dict(tv.STUDENT_SAMPLER if student else tv.SAMPLER)
        else:
            self.patcher, self.cond = trained.load_model(self.name), trained.conditioning_tensors(family)
            self.shape, self.latent_format = trained.latent_shape(family), trained._latent_format(family)
            self.positive = trained.conditioning(family)
            self.decode, self.sampler = (lambda z: trained.decode(family, z)), dict(trained.SAMPLER[self.name])
        self.model, self.path = self.patcher.model, tv.weights_path(student) if self.video else trained.weights_path(self.name)

    def kwargs(self, batch: int) -> dict[str, torch.Tensor]:
        return tvf.model_kwargs(self.model, self.cond, batch) if self.video else model_kwargs(self.model, self.family, self.cond, batch)

    def noise(self, seeds: list[int]) -> torch.Tensor:
        """(B, ...) noises, each the one quality.py / comfy.sample.prepare_noise draws for its seed."""
        import comfy.sample

        latent = torch.zeros(self.shape[1:])[None]
        return torch.cat([comfy.sample.prepare_noise(latent, s) for s in seeds])

    @torch.no_grad()
    def sample(self, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """Model-space outputs (B, ...) of the family's sampler at `steps` steps from `noise`."""
        import comfy.sample

        s, latent = self.sampler, torch.zeros(noise.shape)
        positive, negative = self.positive
        out = comfy.sample.sample(self.patcher, noise, steps, s["cfg"], s["sampler_name"], s["scheduler"],
                                  positive, negative, latent, seed=0, disable_pbar=True)
        return self.latent_format.process_in(out.float())

    def images(self, z: torch.Tensor) -> torch.Tensor:
        return self.decode(self.latent_format.process_out(z)).double()


def sigmas(model: Any, batch: int, on_grid: float, steps: int, gen: torch.Generator) -> torch.Tensor:
    """(B,) sigmas: the `steps`-step schedule's (share `on_grid`), else the teacher's training draw."""
    import comfy.samplers

    ms = model.model_sampling
    grid = comfy.samplers.calculate_sigmas(ms, "simple", steps)[:-1].float()
    pick = grid[torch.randint(len(grid), (batch,), generator=gen)]
    spread = ms.sigma(torch.rand((batch,), generator=gen).clamp(1e-3, 1) * getattr(ms, "multiplier", 1.0)).float()
    return torch.where(torch.rand((batch,), generator=gen) < on_grid, pick, spread)


def reflow_loss(student: Fixture, z: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor, kwargs: dict,
                options: dict) -> torch.Tensor:
    s = sigma.view(-1, *[1] * (z.ndim - 1))
    with trained.comfy_training():
        denoised = student.model.apply_model(s * z + (1 - s) * x0, sigma, transformer_options=options, **kwargs)
    return F.mse_loss(denoised, x0)


def proof(teacher: Fixture, student: Fixture) -> dict[str, Any]:
    """Mean PSNR (dB) over PROOF_SEEDS against the teacher's 20 steps: teacher 4, student 3 / 4 / 8 steps."""
    noise = teacher.noise(list(PROOF_SEEDS))
    ref = teacher.images(teacher.sample(noise, teacher.sampler["steps"]))
    runs = {"teacher_4": (teacher, 4), "student_3": (student, 3), "student_4": (student, 4), "student_8": (student, 8)}
    table = {}
    for name, (fix, steps) in runs.items():
        out = fix.images(fix.sample(noise, steps))
        scores = [metrics.psnr(r, o) for r, o in zip(ref, out)]
        table[name] = {"mean": round(statistics.fmean(scores), 2), "min": round(min(scores), 2)}
        print(f"proof {name}: PSNR mean {table[name]['mean']:.2f} dB, min {table[name]['min']:.2f} dB", flush=True)
    return {"seeds": list(PROOF_SEEDS), "psnr_vs_teacher_20": table}


def teacher_names(path: Path, teacher: Path, metadata: dict[str, str] | None) -> None:
    """Rewrite `path` with the teacher file's tensor names: ComfyUI 0.33 names Flux's RMSNorm gains
    `*_norm.weight` where the fixtures (and 0.3.64, which does not convert) say `*_norm.scale`."""
    from safetensors.torch import load_file, save_file

    names = set(load_file(str(teacher)))
    tensors = {k if k in names else k.removesuffix(".weight") + ".scale": v for k, v in load_file(str(path)).items()}
    if set(tensors) != names:
        raise RuntimeError(f"{path}: tensor names differ from {teacher}: {sorted(set(tensors) ^ names)[:4]}")
    save_file(tensors, str(path), metadata=metadata)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", required=True, choices=["flux", tv.FAMILY])
    p.add_argument("--pairs", type=int, default=64, help="teacher couplings (noise, 20-step output) to train on")
    p.add_argument("--minutes", type=float, default=10.0, help="wall-time budget of the training loop")
    p.add_argument("--steps", type=int, default=0, help="step budget instead of --minutes (exactly reproducible)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--on-grid", type=float, default=0.75, help="share of sigmas taken from the 4-step schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=trained.FIXTURE_DIR)
    args = p.parse_args(argv)
    if args.minutes <= 0 and args.steps <= 0:
        p.error(f"--minutes ({args.minutes}) or --steps ({args.steps}) must be > 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = import_comfy()
    teacher = Fixture(args.family)
    start = time.monotonic()
    seeds = list(range(PAIR_SEED, PAIR_SEED + args.pairs))
    z = teacher.noise(seeds)
    x0 = torch.cat([teacher.sample(z[i:i + 8], teacher.sampler["steps"]) for i in range(0, len(z), 8)])
    pair_minutes = (time.monotonic() - start) / 60
    print(f"{args.pairs} teacher pairs in {pair_minutes:.1f} min", flush=True)
    student = Fixture(args.family)  # a fresh copy of the teacher's weights
    trained.FIXTURE_DIR = args.out  # where the student is written and read back from
    trained.trainable(student.model)
    kwargs, options = student.kwargs(args.batch), training_transformer_options(student.model)
    opt = torch.optim.AdamW(student.model.diffusion_model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    start, step, running, history = time.monotonic(), 0, None, []
    while (progress := step / args.steps if args.steps > 0 else (time.monotonic() - start) / (args.minutes * 60)) < 1:
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, args.lr)
        idx = torch.randint(len(z), (args.batch,), generator=gen)
        loss = reflow_loss(student, z[idx], x0[idx], sigmas(student.model, args.batch, args.on_grid, 4, gen), kwargs, options)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.model.diffusion_model.parameters(), 1.0)
        opt.step()
        step += 1
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 25 == 0:
            history.append((step, round(time.monotonic() - start, 1), round(running, 5)))
            print(f"step {step:5d}  {history[-1][1]:7.1f} s  loss {loss.item():.4f}  smoothed {running:.4f}", flush=True)
    minutes = (time.monotonic() - start) / 60
    student.model.eval()
    name = f"{args.family}_4step"
    header = tv.loader_metadata() if teacher.video else None
    weights = write_weights(args.out, name, student.model.diffusion_model, teacher.cond, header)
    teacher_names(weights, teacher.path, header)
    reloaded = Fixture(args.family, student=True)
    reloaded.positive = teacher.positive  # the same fixed conditioning, whichever folder --out names
    table = proof(teacher, reloaded)
    meta = {
        "family": name, "teacher": f"fixtures/{args.family}.safetensors", "student_of": args.family,
        "sampler": reloaded.sampler,
        "method": "reflow on the teacher's 20-step euler/simple couplings (bench/quality/distill_fixtures.py)",
        "distillation": {"pairs": args.pairs, "pair_seeds": [seeds[0], seeds[-1]], "pair_minutes": round(pair_minutes, 2),
                         "seed": args.seed, "batch": args.batch, "lr": args.lr, "on_grid": args.on_grid,
                         "steps": step, "minutes": round(minutes, 2), "final_loss_smoothed": round(running, 5),
                         "loss_history": history},
        "proof": table,
        "command": "COMFYUI_PATH=<ComfyUI> OMP_NUM_THREADS=1 python -m bench.quality.distill_fixtures " + " ".join(sys.argv[1:]),
        "versions": {"torch": torch.__version__, "comfyui": comfy_env.comfy_version(root)},
    }
    write_meta(args.out, name, meta, weights)


if __name__ == "__main__":
    main()
