"""`patch_model`: the single entry point the nodes call.

Clones the model, finds its family in the registry (registry.py), lets the family's
adapter install its block hooks (`apply(model_clone, settings) -> FamilyAdapter`), reads the cost
model's view of it (the family's CostModel, run/prediction.py; `scope` auto's keys_values falls back to the block
merge on a kernel where it does not pay, prediction.CostProfile.keys_values_pays), says once what it changes in the settings, and installs
the shared runtime: the per-run state template at transformer_options[TOMA_KEY] and the
OUTER_SAMPLE / APPLY_MODEL wrappers under TOMA_KEY. Re-applying ToMA to a ToMA-patched model replaces the earlier patch, never stacks
on it; the input model is never modified. Under ComfyUI's MultiGPU CFG Split and Select Model Device
each device's model copy gets the family's hooks bound to its own blocks (`install_device_clones`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ..families.registry import Family, apply_family, detect_family
from ..machinery.kernel_choice import run_kernel
from ..run.config import ToMAConfig
from ..run.runtime import RunState
from ..run.wrappers import apply_model_wrapper, outer_sample_wrapper
from ..settings import AUTO_SCOPE, KEYS_VALUES, TOMA_KEY, ToMASettings

log = logging.getLogger(__name__)


def patch_model(model, settings: ToMASettings):
    """Return a clone of `model` (a ModelPatcher) that runs ToMA with `settings`.

    Raises ValueError for an unsupported model class or settings the family cannot honour.
    """
    family = detect_family(model)
    patched, adapter, cost, resolved = _patched(model, family, family.resolve(settings))
    if settings.scope == AUTO_SCOPE and resolved.scope == KEYS_VALUES:
        kernel, name = run_kernel(model.model_options.get("transformer_options"), model.load_device.type)
        pays, predicted = cost.keys_values_pays(kernel, model.load_device.type)
        if not pays:
            log.info("ToMA: scope auto runs block on %s: keys_values predicted %.2fx there", name, predicted)
            patched, adapter, cost, resolved = _patched(model, family, replace(resolved, scope="block"))
    settings = resolved
    install_runtime(patched, ToMAConfig(settings, adapter, cost, run_kernel))
    install_device_clones(patched, family, settings)
    for note in settings.notes():
        log.warning("ToMA: %s", note)
    log.debug("ToMA patch installed: %s, %s", family.name, settings.describe())
    return patched


def _patched(model, family: Family, settings: ToMASettings):
    """A clone of `model` with the family's hooks for `settings`, its adapter, its CostProfile, and `settings`."""
    patched = model.clone()
    adapter = apply_family(family, patched, settings)
    cost = family.cost.profile(patched.get_model_object("diffusion_model"), adapter.num_blocks, settings, family.video)
    return patched, adapter, cost, settings


def install_runtime(model, config: ToMAConfig) -> None:
    """Put the per-run state template and the two runtime wrappers on `model` (a clone).

    Earlier ToMA wrappers on the model are removed first, so re-applying replaces.
    """
    import comfy.patcher_extension

    wrappers = comfy.patcher_extension.WrappersMP
    for kind in (wrappers.OUTER_SAMPLE, wrappers.APPLY_MODEL, wrappers.DIFFUSION_MODEL):
        model.remove_wrappers_with_key(kind, TOMA_KEY)
    model.model_options.setdefault("transformer_options", {})[TOMA_KEY] = RunState(config)
    model.add_wrapper_with_key(wrappers.OUTER_SAMPLE, TOMA_KEY, outer_sample_wrapper)
    model.add_wrapper_with_key(wrappers.APPLY_MODEL, TOMA_KEY, apply_model_wrapper)


DEVICE_COPY_CALLBACKS = ("ON_MATCH_MULTIGPU_CLONES", "ON_DEEPCLONE_MULTIGPU")
"""comfy.patcher_extension.CallbacksMP names fired, (source patcher, new patcher), when ComfyUI 0.33
makes a patcher around another copy of the model (comfy/model_patcher.py `match_multigpu_clones`,
`deepclone_multigpu`)."""


def install_device_clones(model, family: Family, settings: ToMASettings) -> None:
    """Re-apply the family's hooks to every patcher ComfyUI 0.33 makes around another model copy.

    Each such patcher is a clone of this one around its own model: it copies this patcher's object
    patches, which families with forward patches (the UNet, Lumina2 / Z-Image, HiDream, Kandinsky 5,
    Qwen-Image, Flux.2) bind to this model's block modules, so without re-binding it would run this
    model's blocks (on two GPUs, weights on another device than the call's tokens). Two ComfyUI
    paths make one: comfy/model_patcher.py `ModelPatcher.match_multigpu_clones` (MultiGPU CFG Split,
    and again every sampling run, comfy/sampler_helpers.py `_prepare_sampling`) fires
    ON_MATCH_MULTIGPU_CLONES; `deepclone_multigpu` alone (Select Model Device on another GPU,
    comfy_extras/nodes_multigpu.py `_retarget_patcher`, a fresh model from the loader's factory)
    fires ON_DEEPCLONE_MULTIGPU. Both callbacks get the new patcher before it loads; re-applying the
    family there (idempotent: it replaces ToMA's own patches) binds them to that copy's blocks.
    ComfyUI without them (0.3.64) has no model copies, and nothing to do.
    """
    import comfy.patcher_extension

    def rebind(_source, device_copy) -> None:
        apply_family(family, device_copy, settings)

    for name in DEVICE_COPY_CALLBACKS:
        kind = getattr(comfy.patcher_extension.CallbacksMP, name, None)
        if kind is not None:
            model.remove_callbacks_with_key(kind, TOMA_KEY)
            model.add_callback_with_key(kind, TOMA_KEY, rebind)
