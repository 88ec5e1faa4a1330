"""Scope keys_values' override through ComfyUI's attention dispatch, comfy.ldm.modules.attention
`wrap_attn` (nodes/machinery/attention_interface.py):

- the newest ComfyUI's (Comfy-Org/ComfyUI@05080f6022b2572df36a0aa6bcba413209c3d265; no tree of it can
  be had here): `newest_wrap_attn` below is written from that commit's contract, not copied from it.
  The merged call and the calls after it run on the layer's preferred kernel (`preferred_attention`,
  which wrap_attn pops before it hands the call to an override); q / k / v in containers reach a
  chained override's container path as merged containers; the caller's `scale` is the merged
  attention's scale.
- ComfyUI 0.33's own wrap_attn with AttentionTensorContainer inputs, ToMA alone and chained over the
  override ModelPatcher.set_model_optimized_attention installs (skipped on 0.3.64, which has neither).

The merged keys are exact here: the tokens repeat within 2 x 1 pairs and the plan merges each pair, so
attention over the merged keys with their log-mass is attention over all N keys, and without the mass
attention over one key per pair.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from harness.pack import pack_module  # noqa: E402

core = pack_module("toma_core")
kv = pack_module("nodes.machinery.keys_values")
kv_core = pack_module("toma_core.keys_values")

HEADS, E, SIDE = 2, 16, 8
N = SIDE * SIDE
SCALE_IN_MASS_CHANNEL = "scale" in inspect.signature(kv_core.with_mass_channel).parameters
"""Whether the log-mass channel takes the caller's scale: toma_core/keys_values.py with_mass_channel's
`scale` keyword, built on branch h3/kvforms."""


class Box:
    """An attention tensor container as the newest ComfyUI defines it: single owner, `take()` once."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def take(self) -> torch.Tensor:
        tensor, self.tensor = self.tensor, None
        if tensor is None:
            raise RuntimeError("attention tensor container has already been consumed")
        return tensor


def newest_wrap_attn(func):
    """wrap_attn's contract at Comfy-Org/ComfyUI@05080f6 (comfy/ldm/modules/attention.py), written from
    it: pop `preferred_attention` first; q / k / v come all boxed or none; outside a dispatch (no
    `_inside_attn_wrapper` keyword, which it sets for the call) an override in transformer_options
    takes the call: its `container_function` with the containers where it has that attribute, else the
    override itself with the default kernel and the taken tensors; else the preferred module's
    `function` where set; else the kernel's own container path or the kernel on the taken tensors.
    ToMA finds this frame by upstream's local names `preferred_attention` and
    `optimized_attention_override`, which it keeps."""

    def wrapper(*args, **kwargs):
        preferred_attention = kwargs.pop("preferred_attention", None)
        boxed = isinstance(args[0], Box)
        taken = lambda: tuple(t.take() for t in args[:3]) + args[3:] if boxed else args  # noqa: E731
        if "_inside_attn_wrapper" in kwargs:
            return own_kernel(args, boxed, taken, kwargs)
        kwargs["_inside_attn_wrapper"] = True
        try:
            options = kwargs.get("transformer_options") or {}
            if "optimized_attention_override" in options:
                optimized_attention_override = options["optimized_attention_override"]
                if boxed and hasattr(optimized_attention_override, "container_function"):
                    return optimized_attention_override.container_function(*args, **kwargs)
                return optimized_attention_override(func, *taken(), **kwargs)
            if preferred_attention is not None and preferred_attention.function is not None:
                return preferred_attention.function(*args, **kwargs)
            return own_kernel(args, boxed, taken, kwargs)
        finally:
            del kwargs["_inside_attn_wrapper"]

    def own_kernel(args, boxed, taken, kwargs):
        if boxed and wrapper.container_function is not None:
            return wrapper.container_function(*args, **kwargs)
        return func(*taken(), **kwargs)

    wrapper.container_function = None
    return wrapper


def kernel(name: str, calls: list):
    """A ComfyUI-signature attention kernel (SDPA with the caller's scale) that records (name, key
    length, scale) per call."""

    def attention(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, boxed=False, **kwargs):
        calls.append((name + (" containers" if boxed else ""), k.shape[2] if skip_reshape else k.shape[1], kwargs.get("scale")))
        b = q.shape[0]
        q, k, v = (t if skip_reshape else t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=kwargs.get("scale"))
        return out if skip_output_reshape else out.transpose(1, 2).reshape(b, -1, heads * q.shape[-1])

    return attention


def with_container_path(name: str, calls: list, wrap=newest_wrap_attn):
    """A wrap_attn kernel with a container path, as ComfyUI's comfy-kitchen int8 kernel has one."""
    function = wrap(kernel(name, calls))

    def containers(q, k, v, heads, *args, **kwargs):
        return kernel(name, calls)(q.take(), k.take(), v.take(), heads, *args, boxed=True, **kwargs)

    function.container_function = containers
    return function


def inputs(seed: int = 0) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(plan, q, k, v): q / k / v (B, N, H e) whose image keys and values repeat within 2 x 1 pairs,
    the hard plan merging each pair."""
    gen = torch.Generator().manual_seed(seed)
    half = torch.randn(2, SIDE, SIDE // 2, 16, generator=gen)
    features = half.repeat_interleave(2, dim=2).flatten(1, 2)
    plan = core.make_plan(features, SIDE, SIDE, 0.5, 2, temperature=0.0)
    k, v = (features @ torch.randn(16, HEADS * E, generator=gen) for _ in range(2))
    return plan, torch.randn(2, N, HEADS * E, generator=gen), k, v


def exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mass: bool, scale: float | None = None) -> torch.Tensor:
    """The proportional attention over the merged keys: with the mass, attention over all N keys;
    without it, over one key of each pair."""
    heads_first = [t.unflatten(-1, (HEADS, E)).transpose(1, 2) for t in (q, k, v)]
    if not mass:
        heads_first[1:] = [t[:, :, ::2] for t in heads_first[1:]]
    return F.scaled_dot_product_attention(*heads_first, scale=scale).transpose(1, 2).flatten(2)


def override(plan: Any, inner: Any = None, mass: bool = True) -> Any:
    return kv.KeysValuesOverride(plan, kv.Keys(0, N), inner, mass)


@pytest.mark.parametrize("preferred", [True, False])
def test_newest_preferred_kernel_runs_the_merged_call(preferred: bool) -> None:
    """A layer with a preferred kernel: ToMA's merged self-attention and the cross-attention after it
    run on it, as the layer's calls do without ToMA; a layer without one runs ComfyUI's kernel."""
    calls: list = []
    layer = SimpleNamespace(function=newest_wrap_attn(kernel("preferred", calls)) if preferred else None)
    optimized_attention = newest_wrap_attn(kernel("default", calls))
    plan, q, k, v = inputs()
    options = {kv.OVERRIDE: override(plan, mass=False)}
    out = optimized_attention(Box(q), Box(k), Box(v), HEADS, preferred_attention=layer, transformer_options=options)
    text = torch.randn(2, 5, HEADS * E)
    optimized_attention(Box(q), Box(text), Box(text), HEADS, preferred_attention=layer, transformer_options=options)
    name = "preferred" if preferred else "default"
    assert calls == [(name, plan.num_kept, None), (name, 5, None)]
    torch.testing.assert_close(out, exact(q, k, v, mass=False), rtol=1e-5, atol=1e-5)


def test_newest_containers_reach_the_chained_override_merged() -> None:
    """Boxed q / k / v with an override installed by set_model_optimized_attention's recipe (the kernel
    as override, its container path copied over): ToMA's merged call reaches that container path with
    the merged keys, boxed; the caller's containers are consumed; the chained override is kept."""
    calls: list = []
    chosen = with_container_path("chosen", calls)

    def backend(_, *args, **kwargs):
        return chosen(*args, **kwargs)

    backend.container_function = chosen.container_function
    optimized_attention = newest_wrap_attn(kernel("default", calls))
    plan, q, k, v = inputs()
    boxes = [Box(t) for t in (q, k, v)]
    toma = override(plan, inner=backend)
    out = optimized_attention(*boxes, HEADS, transformer_options={kv.OVERRIDE: toma})
    assert calls == [("chosen containers", plan.num_kept, None)] and all(b.tensor is None for b in boxes)
    assert toma.inner is backend
    torch.testing.assert_close(out, exact(q, k, v, mass=True), rtol=1e-4, atol=1e-5)


def test_newest_scale_reaches_the_kernel() -> None:
    """The caller's scale reaches the kernel of the merged call; without the log-mass channel the
    output is the merged attention at that scale."""
    calls: list = []
    optimized_attention = newest_wrap_attn(kernel("default", calls))
    plan, q, k, v = inputs()
    out = optimized_attention(Box(q), Box(k), Box(v), HEADS, scale=0.3, transformer_options={kv.OVERRIDE: override(plan, mass=False)})
    assert calls == [("default", plan.num_kept, 0.3)]
    torch.testing.assert_close(out, exact(q, k, v, mass=False, scale=0.3), rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(not SCALE_IN_MASS_CHANNEL, strict=True, reason="the log-mass channel's scale keyword is built on branch h3/kvforms")
def test_newest_scale_in_the_mass_channel() -> None:
    """With the log-mass channel, the merged attention at the caller's scale is the attention over all
    N keys at that scale (the channel's key scaling must not assume 1 / sqrt(e))."""
    plan, q, k, v = inputs()
    optimized_attention = newest_wrap_attn(kernel("default", []))
    out = optimized_attention(Box(q), Box(k), Box(v), HEADS, scale=0.3, transformer_options={kv.OVERRIDE: override(plan)})
    torch.testing.assert_close(out, exact(q, k, v, mass=True, scale=0.3), rtol=1e-4, atol=1e-5)


@pytest.fixture
def comfy_attention(comfy: Any) -> Any:
    import comfy.ldm.modules.attention as attention

    if not hasattr(attention, "AttentionTensorContainer"):
        pytest.skip("ComfyUI 0.3.64 has no AttentionTensorContainer (it came with ComfyUI 0.33)")
    return attention


@pytest.mark.parametrize("chained", [False, True])
def test_comfy_wrap_attn_with_containers(comfy_attention: Any, tiny_flux: Any, chained: bool) -> None:
    """ComfyUI 0.33's wrap_attn, q / k / v in its AttentionTensorContainers: ToMA alone gets the
    tensors and runs the merged call on ComfyUI's kernel; chained over the override that
    ModelPatcher.set_model_optimized_attention installs, the merged call reaches that kernel's
    container path. Either way the output is the exact merged attention."""
    box, calls = comfy_attention.AttentionTensorContainer, []
    inner = None
    if chained:
        model = tiny_flux.clone()
        model.set_model_optimized_attention(with_container_path("chosen", calls, comfy_attention.wrap_attn))
        inner = model.model_options["transformer_options"][kv.OVERRIDE]
    optimized_attention = comfy_attention.wrap_attn(kernel("default", calls))
    plan, q, k, v = inputs(1)
    out = optimized_attention(box(q), box(k), box(v), HEADS, transformer_options={kv.OVERRIDE: override(plan, inner=inner)})
    assert calls == [("chosen containers" if chained else "default", plan.num_kept, None)]
    torch.testing.assert_close(out, exact(q, k, v, mass=True), rtol=1e-4, atol=1e-5)
