"""What the keys/values scope's log-mass buys: PSNR with and without it on the trained fixtures.

    COMFYUI_PATH=/path/to/ComfyUI OMP_NUM_THREADS=1 python -m bench.quality.key_mass
    python -m bench.quality.key_mass --families wan --ratios 0.75 --seeds 1 --steps 4        # a look

Scope keys_values weighs each merged key by the tokens it stands for: log(mass) added to its logits
through one extra query/key channel (toma_core/keys_values.py). `ToMASettings.key_mass=False` drops
that weight (every merged key counts once). The third column runs ComfyUI's attention under an override
that declares SageAttention 3 (nodes/machinery/kernel_choice.py `attention_kernel`), a kernel with no
room for the channel at any head size, so ToMA takes the form it takes on the GPU kernels at 64 / 128
(toma_core/keys_values.py choose_form: equal_mass where every key is a merged image key, Wan's and the
UNet's; plain beside Flux's text keys) at the same CPU arithmetic. Every row patches the fixture with the settings directly
(the node exposes no switch), samples the same seeds as the unpatched reference (the fixture's sampler,
every step merged, the blocks of --blocks, tile 4, min_tokens 0) and decodes with the fixture's codec; PSNR is
per image (over the whole clip for Wan), mean over seeds. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from harness import metrics

from .. import cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=["flux", "sdxl", "wan"], choices=["flux", "sdxl", "sd15", "wan"])
    p.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75, 0.9])
    p.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1")
    p.add_argument("--steps", type=int, default=0, help="steps (0: the fixture's sampler)")
    p.add_argument("--blocks", default="auto", help="the blocks setting of every row (auto: the node's default)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"])
    args = p.parse_args(argv)
    args.device = "cpu"
    return args


def fixture(name: str) -> tuple[Any, dict[str, Any], Any, Any, tuple[int, ...]]:
    """(model, sampler settings, decode, (pos, neg), latent shape) of one fixture."""
    if name == "wan":
        from harness import trained_video as tv

        return tv.load_model(), dict(tv.SAMPLER), tv.decode, tv.conditioning(), tv.latent_shape()
    from harness import trained

    return trained.load_model(name), dict(trained.SAMPLER[name]), lambda z: trained.decode(name, z), trained.conditioning(name), trained.latent_shape(name)


def sample(model: Any, sampler: dict[str, Any], conds: tuple, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    import comfy.sample

    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return comfy.sample.sample(
        model, noise, sampler["steps"], sampler["cfg"], sampler["sampler_name"], sampler["scheduler"], *conds,
        torch.zeros(shape), seed=seed, disable_pbar=True,
    )


def psnr(reference: torch.Tensor, image: torch.Tensor) -> float:
    """PSNR of a decoded image (or a whole clip) against the reference, values in [0, 1]."""
    return metrics.psnr(reference.float().numpy(), image.float().numpy())


def declared(model: Any, kernel: str) -> Any:
    """A clone whose attention override hands every call on to ComfyUI's function, declaring `kernel`."""
    from harness.pack import pack_module

    def override(func, *args, **kwargs):
        return func(*args, **kwargs)

    override.attention_kernel = pack_module("toma_core.kernels").KERNELS[kernel]
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    return clone


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.import_comfy(args)
    torch.set_num_threads(args.threads)
    from harness.pack import pack_module

    core, patching, settings = (pack_module(m) for m in ("toma_core", "nodes.node.patching", "nodes.settings"))
    print("| fixture | steps | ratio | PSNR with log-mass (dB) | PSNR without (dB) | PSNR equal mass / plain (dB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.families:
        model, sampler, decode, conds, shape = fixture(name)
        if args.steps:
            sampler["steps"] = args.steps
        refs = [decode(sample(model, sampler, conds, shape, s)) for s in range(args.seeds)]
        for ratio in args.ratios:
            row = []
            for mass, kernel in ((True, None), (False, None), (True, "sage3")):
                toma = settings.ToMASettings(
                    ratio=ratio, tile_size=4, schedule=core.MergeSchedule(0.0, 1.0), blocks=args.blocks, scope="keys_values",
                    key_mass=mass,
                )
                patched = patching.patch_model(model if kernel is None else declared(model, kernel), toma)
                row.append(sum(psnr(r, decode(sample(patched, sampler, conds, shape, s))) for s, r in enumerate(refs)) / len(refs))
            print(f"| {name} | {sampler['steps']} | {ratio:g} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
