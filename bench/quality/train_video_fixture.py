"""Train the tiny Wan 2.1 T2V fixture on synthetic clips (pans, zooms, moving crops) of photographs.

    COMFYUI_PATH=/path/to/ComfyUI OMP_NUM_THREADS=1 python -m bench.quality.train_video_fixture --minutes 40 --threads 2

Writes fixtures/wan.safetensors (fp16 weights + the fp32 fixed context), fixtures/wan.json (config,
codec, provenance, the command) and fixtures/wan_samples.png (one row of frames per seed, 20-step
samples through comfy.sample.sample, decoded with the clip codec).

Model, codec, clips and conditioning: ``harness/trained_video.py``. Objective: rectified flow
with Wan's model sampling (``ModelSamplingDiscreteFlow``, shift 8 as ``WAN21_T2V`` sets it):
t ~ U(0, 1) (``--timesteps uniform``, the spacing of the sampler's "simple" steps; or
logit-normal), sigma = model_sampling.sigma(1000 t) = 8 t / (1 + 7 t), x_t = (1 - sigma) x0 +
sigma noise; the velocity (x_t - denoised) / sigma from ``BaseModel.apply_model`` (the inference
path) against noise - x0. ComfyUI's ``WanAttentionBlock.forward`` builds its outputs out of place
(``torch.addcmul``, ``x = x + ...``), so training runs the real blocks, with no training twins
(the Flux fixture needs them: ``bench/quality/train_fixtures.py``).

Curriculum: the first ``--crop-fraction`` of the budget trains on random 32 x 32 px windows of the
clips (the same window in every frame: 9 x 8 x 8 = 576 tokens, a tenth of a full clip's cost, so
eight clips a step), the rest on full 64 px clips. Wan has no absolute positions (rope only, a
patch conv without padding), so a window is a smaller clip of the same statistics and motion; the
full-size phase teaches the longer offsets.

Initialisation: seeded N(0, 1/fan_in) matrices (``tiny_models.init_weights``), then every block's
self-attention, cross-attention and FFN output projections and the head zeroed, so each block
starts as the identity, and a local self-attention start (``local_attention_init``). AdamW, warm-up
then cosine decay over the budget, gradient clipping, EMA; the shipped weights are whichever of EMA
and raw has the lower loss on a fixed held-out batch.

Why the curriculum and the local start: 36 minutes on full clips from a plain start (663 steps)
gave a model whose samples did not correlate from frame to frame. An 8-minute run with the
curriculum alone still gave 0.00; with the local start too, 0.05-0.17 (fixtures/README.md has the
shipped run's figures).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness import tiny_models, trained
from harness import trained_video as tv

from .train_fixtures import (
    ema_update,
    flow_times,
    import_comfy,
    load_photos,
    lr_at,
    provenance,
    write_meta,
    write_weights,
)

ZEROED = ("self_attn.o.weight", "cross_attn.o.weight", "ffn.2.weight", "head.head.weight")


def zero_init_outputs(model: Any) -> None:
    with torch.no_grad():
        for name, param in model.diffusion_model.named_parameters():
            if name.endswith(ZEROED):
                param.zero_()


def rope_high_pairs(head_dim: int, per_axis: int = 2) -> list[int]:
    """Head dims of the `per_axis` highest-frequency rope pairs of each axis (t, h, w).
    ``WanModel.rope_embedder`` is ``EmbedND`` with axes [d - 4 (d // 6), 2 (d // 6), 2 (d // 6)]
    concatenated along the pair axis, pairs (2i, 2i + 1), frequencies falling within each axis
    (``comfy.ldm.flux.math.rope``)."""
    axes = [head_dim - 4 * (head_dim // 6), 2 * (head_dim // 6), 2 * (head_dim // 6)]
    starts = [0, axes[0], axes[0] + axes[1]]
    return [start + d for start in starts for d in range(2 * per_axis)]


def local_attention_init(model: Any, strength: float) -> None:
    """Give every self-attention block a content-free local pattern to start from: the same bias on
    q and k, placed on the even dim of each high-frequency rope pair, so that after rope q.k is largest
    at zero offset in time and space and falls off within a few tokens. Without it, attention starts
    uniform over all tokens, and within the CPU budget the frames of the model's samples did not
    correlate (the module docstring). 0 leaves the biases as initialised."""
    if strength <= 0:
        return
    net = model.diffusion_model
    pattern = torch.zeros(net.dim // net.num_heads)
    pattern[rope_high_pairs(pattern.numel())[::2]] = strength
    with torch.no_grad():
        for block in net.blocks:
            for linear in (block.self_attn.q, block.self_attn.k):
                linear.bias.copy_(pattern.repeat(net.num_heads))


def model_kwargs(model: Any, cond: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
    """apply_model's conditioning kwargs, as the sampler builds them (extra_conds + process_cond)."""
    conds = model.extra_conds(cross_attn=cond["context"], noise=torch.zeros(tv.latent_shape(batch)))
    return {k: c.process_cond(batch_size=batch, area=None).cond for k, c in conds.items()}


def flow_loss(model: Any, x0: torch.Tensor, kwargs: dict, gen: torch.Generator, timesteps: str) -> torch.Tensor:
    """Velocity MSE on model-space latents x0 (B, C, F, h, w); see the module docstring."""
    ms = model.model_sampling
    noise = torch.randn(x0.shape, generator=gen)
    b = x0.shape[0]
    sigma = ms.sigma(flow_times(b, timesteps, gen) * ms.multiplier)
    s = sigma.view(b, 1, 1, 1, 1)
    x_t = (1 - s) * x0 + s * noise
    with trained.comfy_training():
        denoised = model.apply_model(x_t, sigma, **kwargs)
    return F.mse_loss((x_t - denoised) / s, noise - x0)


@torch.no_grad()
def heldout_loss(model: Any, x0: torch.Tensor, kwargs: dict, seed: int, timesteps: str) -> float:
    gen = torch.Generator().manual_seed(seed)
    return float(sum(flow_loss(model, x0, kwargs, gen, timesteps) for _ in range(2)) / 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=35.0, help="wall-time budget of the training loop")
    p.add_argument("--steps", type=int, default=0, help="step budget instead of --minutes (exactly reproducible)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=2, help="clips per step at the full 64 px")
    p.add_argument("--crop-fraction", type=float, default=0.7,
                   help="share of the budget trained on --crop px windows of the clips, before the full size")
    p.add_argument("--crop", type=int, default=32, help="window side in px of the first phase (9 x 8 x 8 tokens at 32)")
    p.add_argument("--crop-batch", type=int, default=8, help="clips per step in the crop phase")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--local-init", type=float, default=3.0,
                   help="strength of the local self-attention start (local_attention_init; 0: off)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.99)
    p.add_argument("--timesteps", default="uniform", choices=["logit-normal", "uniform"])
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between fixtures/wan.safetensors writes")
    p.add_argument("--out", type=Path, default=trained.FIXTURE_DIR)
    p.add_argument("--samples", type=int, default=4, help="seeds in the samples PNG")
    args = p.parse_args(argv)
    if args.minutes <= 0 and args.steps <= 0:
        p.error(f"--minutes ({args.minutes}) or --steps ({args.steps}) must be > 0")
    if not 0 <= args.crop_fraction < 1:
        p.error(f"--crop-fraction ({args.crop_fraction}) must be in [0, 1)")
    return args


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The training loop; returns the provenance record (the chosen weights in record['model'])."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = tv.build_model()
    tiny_models.init_weights(model.diffusion_model, args.seed)
    zero_init_outputs(model)
    local_attention_init(model, args.local_init)
    trained.trainable(model)
    ema = copy.deepcopy(model.diffusion_model).eval().requires_grad_(False)
    cond = tv.default_conditioning_tensors(args.seed)
    photos = load_photos()
    kwargs = {False: model_kwargs(model, cond, args.batch), True: model_kwargs(model, cond, args.crop_batch)}
    opt = torch.optim.AdamW(model.diffusion_model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    start, step, running, history = time.monotonic(), 0, None, []
    while True:
        elapsed = time.monotonic() - start
        progress = step / args.steps if args.steps > 0 else elapsed / (args.minutes * 60)
        if progress >= 1:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, args.lr)
        cropped = progress < args.crop_fraction
        clips = tv.random_clips(photos, args.crop_batch, gen, crop=args.crop) if cropped else \
            tv.random_clips(photos, args.batch, gen)
        loss = flow_loss(model, tv.to_model_space(clips), kwargs[cropped], gen, args.timesteps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.diffusion_model.parameters(), 1.0)
        opt.step()
        ema_update(ema, model.diffusion_model, step, args.ema)
        step += 1
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % args.log_every == 0:
            history.append((step, round(elapsed, 1), round(running, 5)))
            print(f"step {step:6d}  {elapsed:7.1f} s  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"loss {loss.item():.4f}  smoothed {running:.4f}", flush=True)
        if step % args.checkpoint_every == 0:
            write_weights(args.out, tv.FAMILY, ema, cond)
    model.eval()
    x_held = tv.to_model_space(tv.random_clips(photos, 8, torch.Generator().manual_seed(10_000 + args.seed)))
    held_kwargs = model_kwargs(model, cond, 8)
    raw_loss = heldout_loss(model, x_held, held_kwargs, args.seed, args.timesteps)
    raw_state = copy.deepcopy(model.diffusion_model.state_dict())
    model.diffusion_model.load_state_dict(ema.state_dict())
    ema_loss = heldout_loss(model, x_held, held_kwargs, args.seed, args.timesteps)
    use_ema = ema_loss <= raw_loss
    if not use_ema:
        model.diffusion_model.load_state_dict(raw_state)
    print(f"held-out loss: raw {raw_loss:.4f}, EMA {ema_loss:.4f} -> shipping {'EMA' if use_ema else 'raw'}")
    return {"model": model, "cond": cond, "steps": step, "minutes": round((time.monotonic() - start) / 60, 2),
            "final_loss_smoothed": running, "heldout_loss_raw": raw_loss, "heldout_loss_ema": ema_loss,
            "shipped": "ema" if use_ema else "raw", "loss_history": history}


def save(args: argparse.Namespace, record: dict[str, Any], comfy_root: Path) -> dict[str, Any]:
    """Write the safetensors and the json; returns the json dict."""
    weights = write_weights(args.out, tv.FAMILY, record["model"].diffusion_model, record["cond"], tv.loader_metadata())
    meta = {
        "family": tv.FAMILY,
        "comfy_class": "comfy.supported_models.WAN21_T2V -> comfy.model_base.WAN21 -> comfy.ldm.wan.model.WanModel",
        "unet_config": tv.WAN_CONFIG,
        "parameters": sum(p.numel() for p in record["model"].diffusion_model.parameters()),
        "clip_size": [tv.FRAMES, tv.PIXELS, tv.PIXELS],
        "latent_shape": list(tv.latent_shape()),
        "video_tokens": tv.FRAMES * (tv.PIXELS // 4) ** 2,
        "codec": f"x = {tv.CODEC_GAIN} * (2 * frame - 1); per frame pixel_unshuffle({tv.UNSHUFFLE}) -> 12 channels; "
                 "z = H[:, :12] / 4 @ x (Sylvester-Hadamard order 16, orthonormal columns); "
                 "latent = Wan21.process_out(z); one latent frame per video frame",
        "clips": "pans (half; 0-8 px/frame, random direction), zooms (a quarter; up to 1.6x in or out), still "
                 "background with a moving 16-32 px crop of another photograph (a quarter); random flips",
        "conditioning": f"fixed context (1, {tv.TEXT_LEN}, {tv.TEXT_DIM}) ~ N(0, 1) from seed {args.seed}, "
                        f"stored under '{trained.COND_PREFIX}'",
        "sampler": tv.SAMPLER,
        "curriculum": f"first {args.crop_fraction:g} of the budget: {args.crop_batch} clips a step, each cut to a "
                      f"random {args.crop} x {args.crop} px window (the same in every frame); then {args.batch} "
                      f"full {tv.PIXELS} px clips a step",
        "init": "tiny_models.init_weights, output projections and head zeroed (zero_init_outputs), "
                f"local self-attention start of strength {args.local_init:g} (local_attention_init)",
    } | provenance(args, record, "bench.quality.train_video_fixture", comfy_root)
    write_meta(args.out, tv.FAMILY, meta, weights)
    return meta


def sample_clips(seeds: int, steps: int | None = None) -> torch.Tensor:
    """(seeds, 3, F, H, W): the shipped fixture's samples of seeds 0.. through comfy.sample.sample."""
    import comfy.sample

    patcher = tv.load_model()
    positive, negative = tv.conditioning()
    s = tv.SAMPLER
    clips = []
    for seed in range(seeds):
        latent = torch.zeros(tv.latent_shape())
        noise = comfy.sample.prepare_noise(latent, seed)
        result = comfy.sample.sample(patcher, noise, steps or s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
                                     positive, negative, latent, seed=seed, disable_pbar=True)
        clips.append(tv.decode(result)[0])
    return torch.stack(clips)


def save_frames_png(clips: torch.Tensor, path: Path) -> Path:
    """A PNG with one row per clip (B, 3, F, H, W), its frames left to right."""
    from PIL import Image

    rows = [torch.cat(list(clip.unbind(1)), dim=2) for clip in clips]
    grid = torch.cat(rows, dim=1)
    Image.fromarray((grid.permute(1, 2, 0) * 255).round().byte().numpy()).save(path)
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = import_comfy()
    if args.out.resolve() != trained.FIXTURE_DIR.resolve():
        trained.FIXTURE_DIR = args.out
    record = train(args)
    save(args, record, root)
    print(f"wrote {save_frames_png(sample_clips(args.samples), args.out / 'wan_samples.png')}")


if __name__ == "__main__":
    main()
