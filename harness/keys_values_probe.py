"""What scope keys_values does to one self-attention, against the exact attention and against merging
the queries too, on the tiny random-weight model of every family (shared by
tests/integration/test_keys_values_rope.py and bench/tokens/roped_keys.py).

At the first self-attention ToMA merges (block 0: its input is the unpatched run's), with the plan M
(rows summing to 1), U = its unmerge and m the merged keys' masses that run used, from the unpatched
run's q, k, v (B, H, L, e) after the model's norms and rope, over the N image query rows:

    exact          O   = softmax(q k^T / sqrt(e)) v
    keys_values    O_kv = softmax(q K_m^T / sqrt(e) + log m) V_m        K_m, V_m: image keys merged
    queries too    O_q  = U softmax((M q) K_m^T / sqrt(e) + log m) V_m  (the block / attention scopes' side)

and reports ||O_kv - O|| / ||O||, the same without the log-mass, ||O_q - O|| / ||O||, and how far the
pack's own kernel inputs (the log-mass carried in one extra q / k channel) are from O_kv.

Positions: every family but SD3 and the UNet rotates q and k by rope before attention, so a merged
key is the average of rotated keys; its logit q . (M k) = sum_i M_i q . k_i is the M-weighted mean
of its tokens' own roped logits, exact per key (linear in the keys), and the error left is the spread
of those logits inside a cluster (docs/keys_values.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange

from . import tiny_dits, tiny_models, tiny_wan
from .metrics import relative_error
from .pack import pack_module

SETTINGS = {"ratio": 0.5, "tile_size": 4, "blocks": "all", "scope": "keys_values"}
"""ToMA settings of the probe: half the image keys, tiles of 4 x 4 tokens, every block."""


@dataclass(frozen=True)
class Case:
    """One family's tiny model: build() -> (ModelPatcher, latent shape, positive, negative), or None
    when this ComfyUI lacks the class; positions: how its attention sees token positions."""

    positions: str
    build: Callable[[], tuple[Any, tuple[int, ...], list, list] | None]


def _dit(builder: Callable[[], Any], family: str, latent: tuple[int, ...], text: int = 12) -> Callable[[], tuple | None]:
    def build() -> tuple | None:
        model = builder()
        if model is None:
            return None
        return model, latent, tiny_dits.conditioning(family, 1, text), tiny_dits.conditioning(family, 2, text)

    return build


def _unet(builder: Callable[[], Any]) -> Callable[[], tuple]:
    def build() -> tuple:
        model = builder()
        return model, (1, 4, 16, 16), tiny_models.make_conditioning(model, 1234), tiny_models.make_conditioning(model, 1235)

    return build


def _flux() -> tuple:
    model = tiny_models.build_flux(seed=0)
    return model, (1, 16, 16, 16), tiny_models.make_conditioning(model, 1234), tiny_models.make_conditioning(model, 1235)


def _wan() -> tuple:
    model = tiny_wan.build_wan("t2v")
    latent = (1, tiny_wan.latent_channels(model), 5, 12, 16)
    return model, latent, tiny_wan.conditioning(model, 1, latent), tiny_wan.conditioning(model, 2, latent)


FLUX_ROPE = "rope over 3 axes (reference image, row, column); text at position 0"
CASES: dict[str, Case] = {
    "Flux": Case(FLUX_ROPE, _flux),
    "Flux.2": Case("rope over 4 axes (reference image, row, column, text index)", _dit(lambda: tiny_dits.build_flux2(seed=0), "flux2", (1, 128, 8, 8))),
    "LongCat-Image": Case("Flux's rope, text on axes 1 and 2, image positions shifted past it", _dit(lambda: tiny_dits.build_longcat(seed=0), "flux", (1, 16, 16, 16))),
    "SD3": Case("no rope: a learned position embedding added to the tokens once", _dit(lambda: tiny_dits.build_sd3(seed=0), "sd3", (1, 16, 16, 16))),
    "Qwen-Image": Case("rope over 3 axes (frame, row, column), text on the diagonal after the image", _dit(lambda: tiny_dits.build_qwen(seed=0), "qwen", (1, 16, 1, 16, 16))),
    "Lumina2": Case("rope over 3 axes (caption index, row, column)", _dit(lambda: tiny_dits.build_lumina(seed=0), "lumina2", (1, 16, 16, 16))),
    "Z-Image": Case("Lumina2's rope; pad tokens at position 0", _dit(lambda: tiny_dits.build_zimage(seed=0), "lumina2", (1, 16, 24, 24))),
    "HiDream": Case("rope over 3 axes (0, row, column); text at position 0", _dit(lambda: tiny_dits.build_hidream(seed=0), "hidream", (1, 16, 16, 16))),
    "HunyuanVideo": Case("rope over 3 axes (frame, row, column); text at position 0", _dit(lambda: tiny_dits.build_hunyuan(seed=0), "hunyuan_video", (1, 16, 3, 16, 16))),
    "Wan": Case("rope over 3 axes (frame, row, column), self-attention on the video alone", _wan),
    "Kandinsky 5": Case("rope over 3 axes (frame, row, column), self-attention on the video alone", _dit(lambda: tiny_dits.build_kandinsky5(seed=0), "kandinsky5", (1, 16, 5, 16, 16))),
    "SDXL": Case("no rope: convolutions put positions in the tokens", _unet(lambda: tiny_models.build_sdxl(seed=0))),
    "SD1.5": Case("no rope: convolutions put positions in the tokens", _unet(lambda: tiny_models.build_sd15(seed=0))),
}


@dataclass(frozen=True)
class Probe:
    """The errors of one first merged self-attention (see the module docstring): N image tokens, D
    merged keys, rel. error of keys_values, of keys_values without the log-mass, of merging the
    queries too, and of the pack's kernel inputs against O_kv."""

    tokens: int
    kept: int
    keys_values: float
    no_mass: float
    queries_too: float
    kernel: float


def heads_first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, skip_reshape: bool) -> tuple[torch.Tensor, ...]:
    """q, k, v as (B, H, L, e) whatever layout the model hands its attention function."""
    if skip_reshape:
        return q, k, v
    return tuple((t if t.ndim == 4 else t.unflatten(-1, (heads, -1))).transpose(1, 2) for t in (q, k, v))


def attention_inputs(model: Any, latent: tuple[int, ...], pos: list, neg: list) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v) (B, H, L, e) of every attention call of a 1-step, cfg-1 run of `model`."""
    calls: list[tuple[torch.Tensor, ...]] = []

    def override(func, q, k, v, heads, *args, **kwargs):
        calls.append(tuple(t.detach().float().clone() for t in heads_first(q, k, v, heads, bool(kwargs.get("skip_reshape")))))
        return func(q, k, v, heads, *args, **kwargs)

    override.hands_on = True  # ComfyUI's own function runs: the kernel ToMA reads (nodes/machinery/kernel_choice.py)
    clone = model.clone()
    clone.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    tiny_models.sample(clone, latent, steps=1, cfg=1.0, positive=pos, negative=neg)
    return calls


@contextlib.contextmanager
def merges_seen() -> Iterator[list[tuple[Any, Any]]]:
    """The (plan, Keys) of every keys_values block run inside the block, in order (an observer
    around nodes/machinery/keys_values.py keys_values_options)."""
    module = pack_module("nodes.machinery.keys_values")
    original, seen = module.keys_values_options, []

    def observed(options, plan, keys, *rest):
        seen.append((plan, keys))
        return original(options, plan, keys, *rest)

    module.keys_values_options = observed
    try:
        yield seen
    finally:
        module.keys_values_options = original


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(e) + bias) v; q (B, H, L_q, e), k, v (B, H, L_k, e), bias (B, L_k)."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    return logits.softmax(-1) @ v


def merged(t: torch.Tensor, plan: Any, start: int) -> torch.Tensor:
    """(B, H, L, e) with rows [start, start + N) merged by the plan: (B, H, L - N + D, e)."""
    n = plan.num_tokens
    span = plan.merge(rearrange(t[:, :, start:start + n], "b h n e -> b n (h e)"))
    span = rearrange(span, "b d (h e) -> b h d e", h=t.shape[1])
    return torch.cat([t[:, :, :start], span, t[:, :, start + n:]], dim=2)


def keys_values_patch(model: Any) -> Any:
    """ToMA with SETTINGS on a clone of `model`, merging from the first step (patching.patch_model)."""
    settings = pack_module("nodes.settings")
    schedule = pack_module("toma_core").MergeSchedule(0.0, 1.0, 1)
    return pack_module("nodes.node.patching").patch_model(model, settings.ToMASettings(schedule=schedule, **SETTINGS))


def probe(case: Case) -> Probe | None:
    """The errors at the first merged self-attention of the case's tiny model (None: no such class
    in this ComfyUI)."""
    built = case.build()
    if built is None:
        return None
    model, latent, pos, neg = built
    plain = attention_inputs(model, latent, pos, neg)
    with merges_seen() as seen:
        patched = attention_inputs(keys_values_patch(model), latent, pos, neg)
    first = next(i for i, (p, m) in enumerate(zip(plain, patched)) if p[1].shape[2] != m[1].shape[2])
    (q, k, v), (q_k, k_k, v_k) = plain[first], patched[first]
    plan, keys = seen[0]
    start, n = keys.start, plan.num_tokens
    b = q.shape[0]
    k_m, v_m = merged(k.expand(b, -1, -1, -1), plan, start), merged(v.expand(b, -1, -1, -1), plan, start)
    bias = torch.nn.functional.pad(plan.size_bias(), (start, k_m.shape[2] - start - plan.num_kept))
    exact = attend(q, k, v)[:, :, start:start + n]
    kv = attend(q, k_m, v_m, bias)
    queries = attend(merged(q, plan, start)[:, :, start:start + plan.num_kept], k_m, v_m, bias)
    spread = rearrange(plan.unmerge(rearrange(queries, "b h d e -> b d (h e)")), "b n (h e) -> b h n e", h=q.shape[1])
    kernel = attend(q_k, k_k, v_k)[..., :q.shape[-1]]
    return Probe(
        tokens=n, kept=plan.num_kept,
        keys_values=relative_error(kv[:, :, start:start + n], exact),
        no_mass=relative_error(attend(q, k_m, v_m)[:, :, start:start + n], exact),
        queries_too=relative_error(spread, exact),
        kernel=relative_error(kernel, kv),
    )
