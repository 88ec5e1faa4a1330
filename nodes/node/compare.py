"""The "ToMA Compare" node: is ToMA worth it for this model, on this GPU, at these settings?

One queue samples the same seed, prompt and latent three times through ComfyUI's own sampler
(`comfy.sample.sample`, so every patch on each model applies): the unpatched model at the full
steps, the ToMA-patched model (the user's ToMA Patch settings) at the full steps, and the unpatched
model at the fewer steps that take ToMA's time (compare_report.fewer_steps); a step-cache-patched
model at the full steps when one is connected. Each run is timed honestly: after a one-step warm-up
of the same model that is not counted (loading the weights, switching patches, first-call set-up),
with the device synchronised before and after. The decoded images are compared with the unpatched
ones (compare_metrics: PSNR / SSIM), drawn side by side with their captions (compare_grid), and the
report ends in one verdict line: which of ToMA and fewer steps won at equal time. The input models
are never changed: each run samples the model as connected, as a KSampler would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from comfy_api.latest import io
from einops import rearrange

from ..run import wrappers
from ..run.report import TOMA_RUN
from ..settings import TOMA_KEY
from .compare_grid import comparison_picture
from .compare_metrics import psnr, ssim
from .compare_report import TimedRun, fewer_steps, report, run_text, verdict
from .toma_nodes import CATEGORY

log = logging.getLogger(__name__)

LATENT_RATIOS = ("downscale_ratio_spacial", "downscale_ratio_temporal")
"""Keys of a ComfyUI 0.33 latent that `comfy.sample.fix_empty_latent_channels` takes (0.3.64 has neither)."""


@dataclass
class Sampling:
    """What every run shares: the latent with its channels fixed for this model and its noise (made
    once, outside the timed runs), the conditioning, seed, cfg, sampler and scheduler."""

    latent: dict
    positive: Any
    negative: Any
    seed: int
    cfg: float
    sampler_name: str
    scheduler: str
    samples: torch.Tensor | None = None
    noise: torch.Tensor | None = None

    def prepare(self, model) -> None:
        import comfy.sample

        ratios = {key: self.latent[key] for key in LATENT_RATIOS if key in self.latent}
        self.samples = comfy.sample.fix_empty_latent_channels(model, self.latent["samples"], **ratios)
        self.noise = comfy.sample.prepare_noise(self.samples, self.seed, self.latent.get("batch_index"))

    def run(self, model, steps: int, start_step: int | None = None, callback: Callable | None = None) -> torch.Tensor:
        """`model` sampled for `steps` steps (from `start_step` on, when given); the latent samples."""
        import comfy.sample
        import comfy.utils

        return comfy.sample.sample(
            model, self.noise, steps, self.cfg, self.sampler_name, self.scheduler, self.positive, self.negative,
            self.samples, start_step=start_step, noise_mask=self.latent.get("noise_mask"), callback=callback,
            disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED, seed=self.seed,
        )


@dataclass
class Sampled:
    """One timed run before decoding: label, steps, latent samples, seconds, how the clock was
    synchronised, and the ToMA run lines it logged."""

    label: str
    steps: int
    samples: torch.Tensor
    seconds: float
    how: str
    run_lines: list[str]


def synchronize(device: torch.device) -> str:
    """Wait until `device` has finished its queued work (CUDA, XPU and MPS run kernels
    asynchronously: a clock read without waiting times the launches, not the work); how, in words."""
    if device.type in ("cuda", "xpu"):
        getattr(torch, device.type).synchronize(device)
        return f"the clock read after torch.{device.type}.synchronize on {device}"
    if device.type == "mps":
        torch.mps.synchronize()
        return "the clock read after torch.mps.synchronize"
    if device.type == "cpu":
        return "on the CPU (nothing queued to wait for)"
    return f"on {device}, which torch cannot synchronise: each time ends when comfy.sample has copied the result off it"


def timed(sampling: Sampling, label: str, model, steps: int, callback: Callable) -> Sampled:
    """One run of `model`, timed after its warm-up: the run's last step alone, which loads the model
    with its patches and runs a call of this size (the last step lies inside a ToMA window that ends
    at 1, so merged calls warm up too). The warm-up logs no run line: the timed run's is the run's."""
    with wrappers.unlogged_runs():
        sampling.run(model, steps, start_step=steps - 1)
    with toma_run_lines() as lines:
        how = synchronize(model.load_device)
        start = time.perf_counter()
        samples = sampling.run(model, steps, callback=callback)
        synchronize(model.load_device)
        seconds = time.perf_counter() - start
    return Sampled(label, steps, samples, seconds, how, lines)


class _RunLines(logging.Handler):
    """Collects ToMA's run lines (log records carrying report.TOMA_RUN) while installed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, TOMA_RUN, None) is not None:
            self.lines.append(record.getMessage())


@contextmanager
def toma_run_lines() -> Iterator[list[str]]:
    """The run lines ToMA logs inside the block (what it merged, and why not), as a list filled in place."""
    handler = _RunLines()
    logger = logging.getLogger(wrappers.__name__)
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def clip_frames(images: torch.Tensor) -> torch.Tensor:
    """A VAE's decoded images as (B, F, H, W, C): an image batch gets F = 1, a video keeps its frames."""
    return images if images.dim() == 5 else images[:, None]


@dataclass
class Comparison:
    picture: torch.Tensor
    """(1, H', W', C): the runs side by side with their captions, the verdict underneath."""
    report: str
    images: list[torch.Tensor]
    """Each run's decoded images (B F, H, W, C), in the order of the report's runs."""


def compare(sampling: Sampling, vae, steps: int, model, toma_model, step_cache_model=None) -> Comparison:
    """Sample, time, decode and compare the runs (module docstring); the picture, report and images."""
    sampling.prepare(model)
    sampled = sample_runs(sampling, steps, model, toma_model, step_cache_model)
    clips = [clip_frames(vae.decode(run.samples)) for run in sampled]
    flat = [rearrange(clip, "b f h w c -> (b f) h w c") for clip in clips]
    runs = [TimedRun(sampled[0].label, steps, sampled[0].seconds)]
    runs += [TimedRun(run.label, run.steps, run.seconds, psnr(flat[0], images), ssim(flat[0], images)) for run, images in zip(sampled[1:], flat[1:])]
    conclusion = verdict(*runs[:3])
    timing = _timing(sampled[0].how)
    text = report(runs, _setup(sampling, steps, clips[0]), timing, sampled[1].run_lines, conclusion)
    picture = comparison_picture([(clip[0], run_text(run, runs[0])) for clip, run in zip(clips, runs)], [conclusion, timing])
    return Comparison(picture, text, flat)


def sample_runs(sampling: Sampling, steps: int, model, toma_model, step_cache_model=None) -> list[Sampled]:
    """The timed runs: unpatched, ToMA, the fewer steps that take ToMA's time (the unpatched run
    itself when ToMA saved less than a step), and the step cache when given."""
    import comfy.utils

    progress = comfy.utils.ProgressBar(steps * (4 if step_cache_model is not None else 3))

    def step(*_) -> None:  # comfy.sample's per-step callback (step, x0, x, total_steps)
        progress.update(1)

    unpatched = timed(sampling, "unpatched", model, steps, step)
    toma = timed(sampling, "ToMA", toma_model, steps, step)
    fewer = fewer_steps(steps, unpatched.seconds, toma.seconds)
    runs = [unpatched, toma, timed(sampling, "fewer steps", model, fewer, step) if fewer < steps else replace(unpatched, label="fewer steps")]
    if step_cache_model is not None:
        runs.append(timed(sampling, "step cache", step_cache_model, steps, step))
    progress.update_absolute(progress.total)
    return runs


def _setup(sampling: Sampling, steps: int, clip: torch.Tensor) -> str:
    batch, frames, height, width = clip.shape[:4]
    size = f"{width} x {height} px, {frames} frames" if frames > 1 else f"{width} x {height} px"
    pooled = " (mean over frames)" if frames > 1 else ""
    return (f"ToMA Compare: seed {sampling.seed}, {sampling.sampler_name} / {sampling.scheduler}, {steps} steps, "
            f"cfg {sampling.cfg:g}, {size}, batch {batch}; PSNR / SSIM of the decoded images against the unpatched run{pooled}.")


def _timing(how: str) -> str:
    return ("Timing: sampling only (not decoding), one run each after a one-step warm-up of the same model that is "
            f"not counted (model loading, first-call set-up); {how}.")


def check_models(model, toma_model, step_cache_model=None) -> None:
    """ValueError unless `model` is unpatched by ToMA, `toma_model` carries a ToMA patch, and both
    it and the step-cache model are patched copies of `model` (the same weights, `ModelPatcher.is_clone`)."""
    if _has_toma(model):
        raise ValueError("model carries a ToMA patch: connect the model from before ToMA Patch (the unpatched one)")
    if not _has_toma(toma_model):
        raise ValueError("toma_model carries no ToMA patch: connect the output of ToMA Patch (or ToMA Patch (Advanced))")
    for name, other in (("toma_model", toma_model), ("step_cache_model", step_cache_model)):
        if other is not None and not other.is_clone(model):
            raise ValueError(f"{name} is not a patched copy of model (other weights): connect it from the same loader through the patch nodes")


def _has_toma(model) -> bool:
    return TOMA_KEY in model.model_options.get("transformer_options", {})


def _sampler_inputs() -> list:
    """seed, steps, cfg, sampler and scheduler, as KSampler offers them."""
    import comfy.samplers

    return [
        io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                     tooltip="The noise seed, the same for every run."),
        io.Int.Input("steps", default=20, min=1, max=10000,
                     tooltip="Steps of the unpatched, ToMA and step-cache runs; the fewer-steps run takes as many as fit in ToMA's time."),
        io.Float.Input("cfg", default=8.0, min=0.0, max=100.0, step=0.1, round=0.01,
                       tooltip="Classifier-free guidance scale, as on KSampler (1 for Flux, Flux.2 Klein, Z-Image Turbo)."),
        io.Combo.Input("sampler_name", options=list(comfy.samplers.KSampler.SAMPLERS), default="euler",
                       tooltip="The sampler of every run, as on KSampler."),
        io.Combo.Input("scheduler", options=list(comfy.samplers.KSampler.SCHEDULERS), default="simple",
                       tooltip="The scheduler of every run, as on KSampler."),
    ]


class ToMACompare(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ToMACompare",
            display_name="ToMA Compare",
            category=CATEGORY,
            description=(
                "Is ToMA worth it here? Samples the same seed and prompt unpatched, with ToMA and with the fewer steps "
                "that take ToMA's time (and with a step cache, if connected), times each run on this machine, and "
                "shows the images side by side with each run's seconds, speed-up and PSNR / SSIM against the "
                "unpatched image, and which won at equal time."
            ),
            inputs=[
                io.Model.Input("model", tooltip="The model without ToMA (the loader's, after any LoRA): the reference run and the fewer-steps run."),
                io.Model.Input("toma_model", tooltip="The same model through ToMA Patch (or ToMA Patch (Advanced)): its settings are the ones compared."),
                io.Conditioning.Input("positive", tooltip="The positive conditioning of every run."),
                io.Conditioning.Input("negative", tooltip="The negative conditioning of every run (unused at cfg 1)."),
                io.Latent.Input("latent_image", tooltip="The latent every run starts from (an empty latent: the image or video size)."),
                io.Vae.Input("vae", tooltip="Decodes every run's latent, for the pictures and PSNR / SSIM (decoding is not timed)."),
                *_sampler_inputs(),
                io.Model.Input("step_cache_model", optional=True,
                               tooltip="Optional: the same model through a step cache (EasyCache, LazyCache, ...), run at the full steps as a fourth contender."),
            ],
            outputs=[
                io.Image.Output("comparison", display_name="comparison",
                                tooltip="The runs side by side (a video: a strip of frames per run) with their seconds, speed-up and PSNR / SSIM, and the verdict."),
                io.String.Output("report", display_name="report",
                                 tooltip="The same as text: each run's steps, seconds, speed-up and PSNR / SSIM, ToMA's run line, how it was timed, and one verdict line."),
                io.Image.Output("unpatched", display_name="unpatched", tooltip="The unpatched run's decoded images (video frames)."),
                io.Image.Output("toma", display_name="toma", tooltip="The ToMA run's decoded images (video frames)."),
                io.Image.Output("fewer_steps", display_name="fewer_steps", tooltip="The fewer-steps run's decoded images (video frames)."),
            ],
        )

    @classmethod
    def execute(cls, model, toma_model, positive, negative, latent_image, vae, seed, steps, cfg, sampler_name, scheduler,
                step_cache_model=None) -> io.NodeOutput:
        check_models(model, toma_model, step_cache_model)
        sampling = Sampling(latent_image, positive, negative, int(seed), float(cfg), sampler_name, scheduler)
        result = compare(sampling, vae, int(steps), model, toma_model, step_cache_model)
        log.info("%s", result.report)
        return io.NodeOutput(result.picture, result.report, *result.images[:3])
