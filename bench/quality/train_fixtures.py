"""Train a tiny fixture model of a ComfyUI class on crops of scikit-image's bundled photographs.

    COMFYUI_PATH=/path/to/ComfyUI OMP_NUM_THREADS=1 python -m bench.quality.train_fixtures --family flux --minutes 20

Writes fixtures/<family>.safetensors (fp16 weights + the fp32 fixed conditioning),
fixtures/<family>.json (config, codec, provenance) and fixtures/<family>_samples.png (20-step samples
of the shipped weights through comfy.sample.sample, decoded with the codec).

Model, codec and conditioning come from ``harness/trained.py``. Objectives are what ComfyUI's model
sampling expects for the class; the model is called through ``BaseModel.apply_model`` (input scaling,
timestep mapping and the denoised output exactly as at inference):

* Flux (CONST, ModelSamplingFlux): u = sigmoid(N(0, 1)) (``--timesteps logit-normal``, as SD3 / Flux
  train) or u ~ U(0, 1) (``uniform``: the spacing of the sampler's "simple" steps), then
  sigma = model_sampling.sigma(u) (the shift 1.15 the sampler uses), x_t = (1 - sigma) x0 + sigma noise; velocity v = (x_t - denoised) / sigma,
  loss |v - (noise - x0)|^2.
* UNet (EPS, discrete DDPM schedule): t ~ U{0..999}, sigma = model_sampling.sigmas[t],
  x_t = x0 + sigma noise; eps = (x_t - denoised) / sigma, loss |eps - noise|^2.

ComfyUI's Flux blocks add into their inputs in place (``txt +=``, ``x +=``), which autograd rejects
(LayerNorm saved those tensors). Training passes ``patches_replace`` entries for every block that
recompute the block out of place from the block's own submodules (``double_block_out_of_place``,
``single_block_out_of_place``); inference never sees them and runs ComfyUI's real blocks.

Data: random square crops (side log-uniform between the training size and the photo's short side,
resized with antialiasing, random horizontal flip) of the colour photographs astronaut, coffee,
chelsea and rocket and the greyscale camera, grass, gravel and brick repeated to RGB, all loaded
from the package (``skimage.data``, nothing downloaded; public domain or CC0 per their docstrings).
AdamW, linear warm-up then cosine decay over the time (or step) budget, gradient clipping, EMA of
the weights; the shipped weights are whichever of EMA and raw has the lower loss on a fixed
held-out batch.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness import trained
from harness.tiny_models import init_weights

from .. import cli

COLOUR_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
GREY_PHOTOS = ("camera", "grass", "gravel", "brick")


# ---- training-only out-of-place Flux blocks ---------------------------------------------------

def _heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, L, 3 * heads * d) -> q, k, v each (B, heads, L, d), the layout ComfyUI's Flux attention takes."""
    q, k, v = qkv.unflatten(-1, (3, num_heads, -1)).permute(2, 0, 3, 1, 4)
    return q, k, v


def _modulate(x: torch.Tensor, norm: torch.nn.Module, mod: Any) -> torch.Tensor:
    return norm(x) * (1 + mod.scale) + mod.shift


def double_block_out_of_place(block: torch.nn.Module, img: torch.Tensor, txt: torch.Tensor, vec: torch.Tensor,
                              pe: torch.Tensor, attn_mask: torch.Tensor | None = None,
                              transformer_options: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``DoubleStreamBlock``'s output (img (B, N, C), txt (B, T, C)) computed without writing into any
    tensor: the block's submodules, ComfyUI's attention function, text tokens first."""
    from comfy.ldm.flux.math import attention

    img_mod1, img_mod2 = block.img_mod(vec)
    txt_mod1, txt_mod2 = block.txt_mod(vec)
    img_q, img_k, img_v = _heads(block.img_attn.qkv(_modulate(img, block.img_norm1, img_mod1)), block.num_heads)
    img_q, img_k = block.img_attn.norm(img_q, img_k, img_v)
    txt_q, txt_k, txt_v = _heads(block.txt_attn.qkv(_modulate(txt, block.txt_norm1, txt_mod1)), block.num_heads)
    txt_q, txt_k = block.txt_attn.norm(txt_q, txt_k, txt_v)
    attn = attention(torch.cat((txt_q, img_q), 2), torch.cat((txt_k, img_k), 2), torch.cat((txt_v, img_v), 2),
                     pe=pe, mask=attn_mask, transformer_options=transformer_options or {})
    txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1]:]
    img = img + block.img_attn.proj(img_attn) * img_mod1.gate
    img = img + block.img_mlp(_modulate(img, block.img_norm2, img_mod2)) * img_mod2.gate
    txt = txt + block.txt_attn.proj(txt_attn) * txt_mod1.gate
    txt = txt + block.txt_mlp(_modulate(txt, block.txt_norm2, txt_mod2)) * txt_mod2.gate
    return img, txt


def single_block_out_of_place(block: torch.nn.Module, x: torch.Tensor, vec: torch.Tensor, pe: torch.Tensor,
                              attn_mask: torch.Tensor | None = None,
                              transformer_options: dict | None = None) -> torch.Tensor:
    """A ``SingleStreamBlock``'s output (B, T + N, C) computed without writing into any tensor."""
    from comfy.ldm.flux.math import attention

    mod, _ = block.modulation(vec)
    qkv, mlp = torch.split(block.linear1(_modulate(x, block.pre_norm, mod)),
                           [3 * block.hidden_size, block.mlp_hidden_dim], dim=-1)
    q, k, v = _heads(qkv, block.num_heads)
    q, k = block.norm(q, k, v)
    attn = attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options or {})
    return x + block.linear2(torch.cat((attn, block.mlp_act(mlp)), 2)) * mod.gate


def _double_replace(block: torch.nn.Module, args: dict, extra: dict) -> dict:
    img, txt = double_block_out_of_place(block, args["img"], args["txt"], args["vec"], args["pe"],
                                         args.get("attn_mask"), args.get("transformer_options"))
    return {"img": img, "txt": txt}


def _single_replace(block: torch.nn.Module, args: dict, extra: dict) -> dict:
    return {"img": single_block_out_of_place(block, args["img"], args["vec"], args["pe"], args.get("attn_mask"),
                                             args.get("transformer_options"))}


def training_transformer_options(model: Any) -> dict:
    """transformer_options that route every Flux block through its out-of-place twin ({} for UNets)."""
    import comfy.model_base

    if not isinstance(model, comfy.model_base.Flux):
        return {}
    dm = model.diffusion_model
    replace = {("double_block", i): functools.partial(_double_replace, b) for i, b in enumerate(dm.double_blocks)}
    replace |= {("single_block", i): functools.partial(_single_replace, b) for i, b in enumerate(dm.single_blocks)}
    return {"patches_replace": {"dit": replace}}


# ---- data --------------------------------------------------------------------------------------

def load_photos() -> list[torch.Tensor]:
    """The bundled photographs as (3, H, W) float tensors in [0, 1] (greyscale ones repeated to RGB)."""
    import skimage.data

    photos = [torch.from_numpy(getattr(skimage.data, name)()).permute(2, 0, 1) for name in COLOUR_PHOTOS]
    photos += [torch.from_numpy(getattr(skimage.data, name)())[None].expand(3, -1, -1) for name in GREY_PHOTOS]
    return [p.float() / 255 for p in photos]


def random_crops(photos: list[torch.Tensor], batch: int, size: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """(B, 3, H, W) crops: random photo, side log-uniform in [H, short side], antialiased resize, random flip."""
    out = []
    for _ in range(batch):
        photo = photos[int(torch.randint(len(photos), (1,), generator=gen))]
        short = min(photo.shape[1:])
        lo, hi = math.log(size[0]), math.log(short)
        side = int(round(math.exp(lo + (hi - lo) * float(torch.rand((), generator=gen)))))
        top = int(torch.randint(photo.shape[1] - side + 1, (1,), generator=gen))
        left = int(torch.randint(photo.shape[2] - side + 1, (1,), generator=gen))
        crop = photo[None, :, top:top + side, left:left + side]
        crop = F.interpolate(crop, size=size, mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
        if float(torch.rand((), generator=gen)) < 0.5:
            crop = crop.flip(-1)
        out.append(crop)
    return torch.cat(out)


# ---- model, objective --------------------------------------------------------------------------

def zero_init_outputs(model: Any) -> None:
    """adaLN-zero for Flux (modulations, final layer) and zeroed output convs / proj_out for UNets, so
    every block starts as the identity (standard DiT / LDM initialisation)."""
    suffixes = ("mod.lin.weight", "modulation.lin.weight", "adaLN_modulation.1.weight", "final_layer.linear.weight",
                "out_layers.3.weight", "proj_out.weight", "out.2.weight")
    with torch.no_grad():
        for name, param in model.diffusion_model.named_parameters():
            if name.endswith(suffixes):
                param.zero_()


def model_kwargs(model: Any, family: str, cond: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
    """apply_model's conditioning kwargs, built as the sampler builds them (``extra_conds`` + process_cond)."""
    context, extras = trained.conditioning_extras(family, cond, 1)
    conds = model.extra_conds(cross_attn=context, **extras)
    return {k: c.process_cond(batch_size=batch, area=None).cond for k, c in conds.items()}


def flow_times(b: int, timesteps: str, gen: torch.Generator) -> torch.Tensor:
    """(B,) flow times u in [1e-3, 1] before the shift: logit-normal or uniform."""
    u = torch.sigmoid(torch.randn((b,), generator=gen)) if timesteps == "logit-normal" else torch.rand((b,), generator=gen)
    return u.clamp(1e-3, 1.0)


def diffusion_loss(model: Any, family: str, x0: torch.Tensor, kwargs: dict, options: dict,
                   gen: torch.Generator, timesteps: str = "logit-normal") -> torch.Tensor:
    """The class's training objective on model-space latents x0 (B, C, h, w); see the module docstring."""
    import comfy.model_sampling

    ms = model.model_sampling
    noise = torch.randn(x0.shape, generator=gen)
    b = x0.shape[0]
    if isinstance(ms, comfy.model_sampling.CONST):
        sigma = ms.sigma(flow_times(b, timesteps, gen))
        s = sigma.view(b, 1, 1, 1)
        x_t, target = (1 - s) * x0 + s * noise, noise - x0
    else:
        sigma = ms.sigmas[torch.randint(len(ms.sigmas), (b,), generator=gen)]
        s = sigma.view(b, 1, 1, 1)
        x_t, target = x0 + s * noise, noise
    with trained.comfy_training():
        denoised = model.apply_model(x_t, sigma, transformer_options=options, **kwargs)
    return F.mse_loss((x_t - denoised) / s, target)


def lr_at(progress: float, peak: float, warmup: float = 0.03) -> float:
    """Linear warm-up over the first `warmup` of the budget, then cosine decay to 5% of `peak`."""
    if progress < warmup:
        return peak * progress / warmup
    p = min(1.0, (progress - warmup) / (1 - warmup))
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, step: int, decay: float) -> None:
    d = min(decay, (1 + step) / (10 + step))
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1 - d)


@torch.no_grad()
def heldout_loss(model: Any, family: str, x0: torch.Tensor, kwargs: dict, options: dict, seed: int) -> float:
    """Mean objective on a fixed batch with fixed noise/timesteps (compares raw and EMA weights)."""
    gen = torch.Generator().manual_seed(seed)
    return float(sum(diffusion_loss(model, family, x0, kwargs, options, gen) for _ in range(4)) / 4)


# ---- main --------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", required=True, choices=trained.FAMILIES)
    p.add_argument("--minutes", type=float, default=20.0, help="wall-time budget of the training loop")
    p.add_argument("--steps", type=int, default=0, help="step budget instead of --minutes (exactly reproducible)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.99)
    p.add_argument("--timesteps", default="logit-normal", choices=["logit-normal", "uniform"],
                   help="Flux: distribution of the flow time before the shift")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--out", type=Path, default=trained.FIXTURE_DIR)
    p.add_argument("--samples", type=int, default=8, help="seeds in the sample grid PNG")
    args = p.parse_args(argv)
    if args.minutes <= 0 and args.steps <= 0:
        p.error(f"--minutes ({args.minutes}) or --steps ({args.steps}) must be > 0")
    return args


def import_comfy() -> Path:
    """ComfyUI in cpu mode with PyTorch SDPA attention (differentiable; what GPUs use)."""
    return cli.import_comfy(argparse.Namespace(attention="pytorch", device="cpu"))


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The training loop; returns the provenance record (and leaves the chosen weights in record['model'])."""
    family = args.family
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = trained.build_model(family)
    init_weights(model.diffusion_model, args.seed)
    zero_init_outputs(model)
    trained.trainable(model)
    ema = copy.deepcopy(model.diffusion_model).eval().requires_grad_(False)
    cond = trained.default_conditioning_tensors(family, args.seed)
    photos = load_photos()
    size = trained.pixel_size(family)
    kwargs = model_kwargs(model, family, cond, args.batch)
    options = training_transformer_options(model)
    opt = torch.optim.AdamW(model.diffusion_model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)

    start, step, running, history = time.monotonic(), 0, None, []
    budget_s = args.minutes * 60
    while True:
        elapsed = time.monotonic() - start
        progress = step / args.steps if args.steps > 0 else elapsed / budget_s
        if progress >= 1:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, args.lr)
        x0 = trained.to_model_space(family, random_crops(photos, args.batch, size, gen))
        loss = diffusion_loss(model, family, x0, kwargs, options, gen, args.timesteps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.diffusion_model.parameters(), 1.0)
        opt.step()
        ema_update(ema, model.diffusion_model, step, args.ema)
        step += 1
        value = loss.item()
        running = value if running is None else 0.98 * running + 0.02 * value
        if step % args.log_every == 0:
            history.append((step, round(elapsed, 1), round(running, 5)))
            print(f"step {step:6d}  {elapsed:7.1f} s  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"loss {value:.4f}  smoothed {running:.4f}", flush=True)

    model.eval()
    heldout_gen = torch.Generator().manual_seed(10_000 + args.seed)
    x_held = trained.to_model_space(family, random_crops(photos, 16, size, heldout_gen))
    held_kwargs = model_kwargs(model, family, cond, 16)
    raw_loss = heldout_loss(model, family, x_held, held_kwargs, {}, args.seed)
    raw_state = copy.deepcopy(model.diffusion_model.state_dict())
    model.diffusion_model.load_state_dict(ema.state_dict())
    ema_loss = heldout_loss(model, family, x_held, held_kwargs, {}, args.seed)
    use_ema = ema_loss <= raw_loss
    if not use_ema:
        model.diffusion_model.load_state_dict(raw_state)
    print(f"held-out loss: raw {raw_loss:.4f}, EMA {ema_loss:.4f} -> shipping {'EMA' if use_ema else 'raw'}")
    return {
        "model": model, "cond": cond, "steps": step, "minutes": round((time.monotonic() - start) / 60, 2),
        "final_loss_smoothed": running, "heldout_loss_raw": raw_loss, "heldout_loss_ema": ema_loss,
        "shipped": "ema" if use_ema else "raw", "loss_history": history,
    }


def write_weights(out: Path, family: str, module: torch.nn.Module, cond: dict[str, torch.Tensor],
                  metadata: dict[str, str] | None = None) -> Path:
    """out/<family>.safetensors: fp16 weights and the fp32 fixed conditioning (under COND_PREFIX), with
    `metadata` (what ComfyUI's loader reads, e.g. ``trained_video.loader_metadata``) in its header."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    tensors |= {trained.COND_PREFIX + k: v.float().contiguous() for k, v in cond.items()}
    path = out / f"{family}.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


def provenance(args: argparse.Namespace, record: dict[str, Any], script: str, comfy_root: Path) -> dict[str, Any]:
    """The json's "training", "command" and "versions" entries of a training run of `script` (a module name)."""
    from harness import comfy_env

    return {
        "training": {
            "seed": args.seed, "batch": args.batch, "lr": args.lr, "ema": args.ema, "timesteps": args.timesteps,
            "steps": record["steps"], "minutes": record["minutes"],
            "final_loss_smoothed": round(record["final_loss_smoothed"], 5),
            "heldout_loss_raw": round(record["heldout_loss_raw"], 5),
            "heldout_loss_ema": round(record["heldout_loss_ema"], 5), "shipped": record["shipped"],
            "images": "skimage.data: " + ", ".join(COLOUR_PHOTOS + GREY_PHOTOS),
            "loss_history": record["loss_history"],
        },
        "command": "COMFYUI_PATH=<ComfyUI> OMP_NUM_THREADS=1 python " + " ".join(["-m", script] + sys.argv[1:]),
        "versions": {"torch": torch.__version__, "comfyui": comfy_env.comfy_version(comfy_root),
                     "python": platform.python_version()},
    }


def write_meta(out: Path, family: str, meta: dict[str, Any], weights: Path) -> None:
    """out/<family>.json, with the weights file's ``trained.tensors_digest``."""
    meta_file = out / f"{family}.json"
    meta = meta | {"tensors_sha256": trained.tensors_digest(weights)}
    meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {weights} ({weights.stat().st_size / 1e6:.2f} MB) and {meta_file}")


def save(args: argparse.Namespace, record: dict[str, Any], comfy_root: Path) -> dict[str, Any]:
    """Write the safetensors (fp16 weights, fp32 conditioning) and the json; returns the json dict."""
    family = args.family
    weights = write_weights(args.out, family, record["model"].diffusion_model, record["cond"])
    s = trained.spec(family)
    meta = {
        "family": family,
        "comfy_class": f"comfy.supported_models.{s.config_class} -> {type(record['model']).__module__}."
                       f"{type(record['model']).__name__}",
        "unet_config": s.unet_config,
        "parameters": sum(p.numel() for p in record["model"].diffusion_model.parameters()),
        "pixel_size": list(s.pixels),
        "latent_shape": list(trained.latent_shape(family)),
        "codec": f"x = {trained.CODEC_GAIN} * (2 * image - 1); pixel_unshuffle({s.unshuffle}) -> {3 * s.unshuffle ** 2} channels; "
                 f"z = H[:, :{3 * s.unshuffle ** 2}] / sqrt({trained.latent_channels(family)}) @ x "
                 f"(Sylvester-Hadamard, orthonormal columns); latent = latent_format.process_out(z)",
        "conditioning": f"fixed: context (1, {s.text_len}, {s.context_dim}) and pooled (1, {s.pooled_dim}) "
                        f"~ N(0, 1) from seed {args.seed}, stored under '{trained.COND_PREFIX}'; extras {s.extras}",
        "sampler": s.sampler,
    } | provenance(args, record, "bench.quality.train_fixtures", comfy_root)
    write_meta(args.out, family, meta, weights)
    return meta


def sample_grid(family: str, seeds: int, out: Path) -> Path:
    """Sample the shipped fixture (trained.load_model) with trained.SAMPLER for `seeds` seeds; save a PNG row."""
    import comfy.sample
    from PIL import Image

    patcher = trained.load_model(family)
    positive, negative = trained.conditioning(family)
    s = trained.SAMPLER[family]
    images = []
    for seed in range(seeds):
        latent = torch.zeros(trained.latent_shape(family))
        noise = comfy.sample.prepare_noise(latent, seed)
        result = comfy.sample.sample(patcher, noise, s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
                                     positive, negative, latent, seed=seed, disable_pbar=True)
        images.append(trained.decode(family, result)[0])
    grid = torch.cat(images, dim=2)
    path = out / f"{family}_samples.png"
    Image.fromarray((grid.permute(1, 2, 0) * 255).round().byte().numpy()).save(path)
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    root = import_comfy()
    if args.out.resolve() != trained.FIXTURE_DIR.resolve():
        trained.FIXTURE_DIR = args.out
    record = train(args)
    save(args, record, root)
    sample_grid(args.family, args.samples, args.out)


if __name__ == "__main__":
    main()
