"""A random-weight ComfyUI model and one model call made as a sampler makes it: what the speed and
model-fidelity benches time. Import after ComfyUI is on sys.path (``cli.import_comfy``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from harness.pack import pack_module
from harness.tiny_models import init_weights, model_config

from .cli import DTYPES


def build_patcher(config_cls: type, unet_config: dict, args: argparse.Namespace) -> Any:
    """A ``comfy.supported_models`` model of --dtype with random weights (``tiny_models.init_weights``
    from torch's global RNG), in a ModelPatcher on --device."""
    import comfy.model_patcher

    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    model = model_config(config_cls, unet_config, dtype).get_model({}, device=device)
    init_weights(model.diffusion_model)
    model.to(device).eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def model_call(patcher: Any, x: torch.Tensor, sigmas: torch.Tensor, cond_or_uncond: list[int], uuids: list[str],
               **kwargs: Any) -> Callable[[], torch.Tensor]:
    """One model call at the first of `sigmas` as a sampler makes it: BaseModel.apply_model on `x`
    with the patcher's wrappers, `cond_or_uncond` and `uuids` in transformer_options and `kwargs`
    (conditioning), ToMA's run started as its OUTER_SAMPLE wrapper would. recompute_every=1: every
    call builds its plans."""
    import comfy.model_patcher
    import comfy.patcher_extension

    b = x.shape[0]
    options = comfy.model_patcher.create_model_options_clone(patcher.model_options)
    to = options.setdefault("transformer_options", {})
    to["wrappers"] = comfy.patcher_extension.copy_nested_dicts(patcher.wrappers)
    to.update(sample_sigmas=sigmas, sigmas=sigmas[:1], cond_or_uncond=cond_or_uncond, uuids=uuids)
    state = start_run(patcher, to)
    t = sigmas[:1].expand(b)

    def call() -> torch.Tensor:
        if state is not None:
            state.plans.clear()  # recompute_every=1: every step builds its plans
        with torch.no_grad():
            return patcher.model.apply_model(x, t, transformer_options=dict(to), **kwargs)

    return call


def start_run(patcher: Any, transformer_options: dict) -> Any:
    """What ToMA's OUTER_SAMPLE wrapper does for a run: a fresh RunState with its sigma window
    (None when the patcher has no ToMA)."""
    key = pack_module("nodes.settings").TOMA_KEY
    template = transformer_options.get(key)
    if template is None:
        return None
    state = template.fresh()
    state.begin_run(patcher.get_model_object("model_sampling").percent_to_sigma, transformer_options["sample_sigmas"])
    transformer_options[key] = state
    return state
