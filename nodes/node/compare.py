"""The "ToMA Compare" node: is ToMA worth it for this model, on this GPU, at these settings?

One queue samples the same seed, prompt and latent three times through ComfyUI's own sampler
(`comfy.sample.sample`, so every patch on each model applies): the unpatched model at the full
steps, the ToMA-patched model (the user's ToMA Patch settings) at the full steps, and the unpatched
model at the fewer steps that take ToMA's time (compare_report.fewer_steps); a step-cache-patched
model at the full steps when one is connected. Each contender is timed as the median of `repeats`
interleaved runs (compare_timing). The decoded images are compared with the unpatched ones
(compare_metrics: PSNR / SSIM), drawn side by side with their captions (compare_grid), and the
report ends in one verdict line (compare_report.verdict): first what ToMA did not merge, with the
run line's reason and the change on the user's node that makes it merge (compare_truth), then
whether the timings' spreads can tell the runs apart, then which of ToMA and fewer steps won at
equal time. The input models are never changed: each run samples the model as connected, as a
KSampler would.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from comfy_api.latest import io
from einops import rearrange

from ..settings import TOMA_KEY
from .compare_grid import comparison_picture
from .compare_metrics import psnr, ssim
from .compare_report import DEFAULT_REPEATS, REPEATS_RANGE, Merged, TimedRun, check_repeats, fewer_steps, report, run_text, verdict
from .compare_timing import Contender, interleaved
from .compare_truth import merged, toma_node
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


def compare(sampling: Sampling, vae, steps: int, model, toma_model, step_cache_model=None, repeats: int = DEFAULT_REPEATS,
            node: str | None = None) -> Comparison:
    """Sample, time, decode and compare the runs (module docstring); the picture, report and images.
    node: the type of the ToMA node that made toma_model (compare_truth.toma_node), for the advice."""
    sampling.prepare(model)
    contenders = sample_runs(sampling, steps, model, toma_model, step_cache_model, repeats)
    clips = [clip_frames(vae.decode(contender.samples)) for contender in contenders]
    flat = [rearrange(clip, "b f h w c -> (b f) h w c") for clip in clips]
    ran = _merged(contenders[1], toma_model, node)
    runs = timed_runs(contenders, flat, ran)
    conclusion = verdict(*runs[:3], ran)
    unsteady = _repeats_note(contenders[1])
    timing = _timing(contenders[0].how, repeats, contenders) + (f" {unsteady}" if unsteady else "")
    lines = contenders[1].lines[0] if contenders[1].lines else []
    text = report(runs, _setup(sampling, steps, clips[0]), timing, lines, conclusion)
    header = [line for line in (ran.text() if ran is not None else None, unsteady) if line]
    picture = comparison_picture([(clip[0], run_text(run, runs[0])) for clip, run in zip(clips, runs)], [conclusion, timing], header)
    return Comparison(picture, text, flat)


def sample_runs(sampling: Sampling, steps: int, model, toma_model, step_cache_model=None, repeats: int = DEFAULT_REPEATS) -> list[Contender]:
    """The contenders, timed in interleaved rounds (compare_timing.interleaved): unpatched, ToMA, the
    fewer steps that take ToMA's median time in the first rounds (the unpatched run itself when ToMA
    saved less than a step or merged nothing), and the step cache when given."""
    import comfy.utils

    contenders = [Contender("unpatched", model, steps), Contender("ToMA", toma_model, steps)]
    if step_cache_model is not None:
        contenders.append(Contender("step cache", step_cache_model, steps))
    progress = comfy.utils.ProgressBar(steps * repeats * (2 * len(contenders) + 1))

    def step(*_) -> None:  # comfy.sample's per-step callback (step, x0, x, total_steps)
        progress.update(1)

    def fewer(unpatched: Contender, toma: Contender) -> Contender:
        records = toma.records[0]
        nothing = bool(records) and all(record.steps_merged == 0 for record in records)
        count = steps if nothing else fewer_steps(steps, statistics.median(unpatched.times), statistics.median(toma.times))
        return unpatched if count >= steps else Contender("fewer steps", model, count)

    runs = interleaved(sampling, repeats, contenders, fewer, step)
    progress.update_absolute(progress.total)
    return runs


def timed_runs(contenders: list[Contender], flat: list[torch.Tensor], ran: Merged | None) -> list[TimedRun]:
    """The report's runs: each contender's times and its likeness to the unpatched images, the ToMA
    run that merged nothing and a fewer-steps run that drops no step marked as no contenders."""
    unpatched, toma, short = contenders[:3]
    runs = [TimedRun(unpatched.label, unpatched.steps, tuple(unpatched.times))]
    for index, (contender, images) in enumerate(zip(contenders[1:], flat[1:]), start=1):
        out = None
        if index == 1 and ran is not None and ran.nothing:
            out = "it merged nothing, so it ran the unpatched model (its time differs by the clock's noise alone)"
        elif index == 2 and contender is unpatched:
            saved = "ToMA merged nothing" if ran is not None and ran.nothing else f"ToMA saved less than one of {unpatched.steps} steps"
            out = f"no step to drop ({saved}): the unpatched run"
        label = "fewer steps" if index == 2 else contender.label
        runs.append(TimedRun(label, contender.steps, tuple(contender.times), psnr(flat[0], images), ssim(flat[0], images), out))
    return runs


def _merged(toma: Contender, toma_model, node: str | None) -> Merged | None:
    """What ToMA merged in its first timed run (its last run line), None when no run line was logged."""
    records = toma.records[0] if toma.records else []
    if not records:
        return None
    settings = toma_model.model_options["transformer_options"][TOMA_KEY].config.settings
    return merged(records[-1], settings, node)


def _repeats_note(toma: Contender) -> str:
    """Said where ToMA's timed runs merged different numbers of steps (min_tokens auto decides by timing)."""
    counts = [sum(record.steps_merged for record in records) for records in toma.records]
    if len(set(counts)) < 2:
        return ""
    return (f"ToMA's timed runs merged different steps ({', '.join(map(str, counts))}: min_tokens auto decides by "
            "timing in each run), so its time mixes them; its image and run line are the first run's.")


def _setup(sampling: Sampling, steps: int, clip: torch.Tensor) -> str:
    batch, frames, height, width = clip.shape[:4]
    size = f"{width} x {height} px, {frames} frames" if frames > 1 else f"{width} x {height} px"
    pooled = " (mean over frames)" if frames > 1 else ""
    return (f"ToMA Compare: seed {sampling.seed}, {sampling.sampler_name} / {sampling.scheduler}, {steps} steps, "
            f"cfg {sampling.cfg:g}, {size}, batch {batch}; PSNR / SSIM of the decoded images against the unpatched run{pooled}.")


def _timing(how: str, repeats: int, contenders: list[Contender]) -> str:
    """How the runs were timed; `contenders` as compare_timing.interleaved returns them."""
    rounds = f"{repeats} rounds of the unpatched and ToMA runs, one of each in turn"
    if len(contenders[0].times) > repeats:
        rounds += f", whose medians set the fewer steps, then {repeats} rounds of every run"
    return (f"Timing: sampling only (not decoding); each time is the median of a run's repeats, the spread the fastest to "
            f"the slowest: {rounds}; each run after a one-step warm-up of the same model that is not counted (model "
            f"loading, first-call set-up); {how}.")


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
                "that take ToMA's time (and with a step cache, if connected), times each run on this machine (the "
                "median of interleaved repeats), and shows the images side by side with each run's seconds and their "
                "spread, speed-up and PSNR / SSIM against the unpatched image, and which won at equal time (or that "
                "the timings are too close to call, or that ToMA merged nothing, and which input makes it merge)."
            ),
            inputs=[
                io.Model.Input("model", tooltip="The model without ToMA (the loader's, after any LoRA): the reference run and the fewer-steps run."),
                io.Model.Input("toma_model", tooltip="The same model through ToMA Patch (or ToMA Patch (Advanced)): its settings are the ones compared."),
                io.Conditioning.Input("positive", tooltip="The positive conditioning of every run."),
                io.Conditioning.Input("negative", tooltip="The negative conditioning of every run (unused at cfg 1)."),
                io.Latent.Input("latent_image", tooltip="The latent every run starts from (an empty latent: the image or video size)."),
                io.Vae.Input("vae", tooltip="Decodes every run's latent, for the pictures and PSNR / SSIM (decoding is not timed)."),
                *_sampler_inputs(),
                io.Int.Input("repeats", default=DEFAULT_REPEATS, min=REPEATS_RANGE[0], max=REPEATS_RANGE[1],
                             tooltip=f"Timed runs of each contender, interleaved (one of each in turn per round); each "
                             f"time is the median, its spread (fastest - slowest) shown, and a difference within the "
                             f"spread is called too close to call. {DEFAULT_REPEATS} by default, {REPEATS_RANGE[0]} - {REPEATS_RANGE[1]}; more "
                             "repeats settle a close call on a busy machine at the cost of longer comparisons."),
                io.Model.Input("step_cache_model", optional=True,
                               tooltip="Optional: the same model through a step cache (EasyCache, LazyCache, ...), run at the full steps as a fourth contender."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
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
                repeats=DEFAULT_REPEATS, step_cache_model=None) -> io.NodeOutput:
        check_models(model, toma_model, step_cache_model)
        repeats = check_repeats(int(repeats))
        sampling = Sampling(latent_image, positive, negative, int(seed), float(cfg), sampler_name, scheduler)
        hidden = cls.hidden  # None on a direct call; set by ComfyUI's executor (PREPARE_CLASS_CLONE)
        node = toma_node(hidden.prompt, hidden.unique_id) if hidden is not None else None
        result = compare(sampling, vae, int(steps), model, toma_model, step_cache_model, repeats, node)
        log.info("%s", result.report)
        return io.NodeOutput(result.picture, result.report, *result.images[:3])
