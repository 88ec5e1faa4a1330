"""Scope keys_values on the attention kernels users select (stand-ins from each kernel's contract:
kernel_standins.py), in real ComfyUI on tiny models of each family's attention shape: a 128-head
DiT whose self-attention is the image alone (Wan), a 128-head joint attention (Flux: text keys
beside the image's) and the 64-head UNet attn1 (SDXL topology).

For every kernel x family: nothing fails and nothing is logged at ERROR (ComfyUI's fallbacks log
there), the merged call reaches the kernel (not a fallback) at a bucket no dearer than the unmerged
call's, the run line names the kernel and the form, and the merged attention's output is the
proportional-attention formula written out here, softmax(q K_m^T / sqrt(e) + log m) V_m, with the
plan ToMA used (toma_core/keys_values.py: equal_mass, where the balanced plan's m is one constant;
the channel, where the kernel takes the wider head at no dearer bucket) or, for the plain form of
joint attention on a kernel with no room for the channel, the same without log m."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import kernel_standins as ks  # noqa: E402
from compat_support import RUNTIME_LOGGER, run_records  # noqa: E402

from harness import keys_values_probe as kvp  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402

FAMILIES = ("wan", "flux", "sdxl")


def build(name: str, tiny: Any) -> tuple[Any, tuple[int, ...], list, list]:
    """(model, latent, positive, negative) of the family's attention shape: full 4 x 4 tiles only,
    so every merged key of the balanced plan stands for the same number of tokens."""
    from harness import tiny_wan

    if name == "wan":
        model = tiny_wan.build_wan("t2v", dim=128, num_heads=1, ffn_dim=256, num_layers=2)
        latent = (1, tiny_wan.latent_channels(model), 1, 16, 16)
        return model, latent, tiny_wan.conditioning(model, 1, latent), tiny_wan.conditioning(model, 2, latent)
    if name == "flux":
        model = tiny.build_flux(seed=0, hidden_size=128, num_heads=1, axes_dim=[16, 56, 56])
        latent = (1, 16, 16, 16)
    else:
        model = tiny.build_sdxl(seed=0, model_channels=64, num_head_channels=64)
        latent = (1, 4, 32, 32)
    return model, latent, tiny.make_conditioning(model, 1234), tiny.make_conditioning(model, 1235)


@pytest.fixture(scope="module")
def models(tiny: Any) -> dict[str, tuple]:
    return {name: build(name, tiny) for name in FAMILIES}


KERNELS = {
    "sage2": ks.sage2,
    "sage1": ks.sage1,
    "flash2.7": lambda: ks.flash("2.7"),
    "flash2.8": lambda: ks.flash("2.8"),
    "kitchen_int8": ks.kitchen,
}
"""Installed by ComfyUI's own flag (kernel_standins.install_flag)."""

KJNODES = {"sage2 auto": ("auto", ks.sage2), "sage3": ("sageattn3", ks.sage3)}
"""Installed by KJNodes' Patch Sage Attention KJ in these modes."""


def expected_form(kernel: ks.StandIn, head: int, family: str) -> str:
    """The channel where the kernel runs the wider head e' = e + 8 in e's own bucket; else equal
    mass where every key is a merged image key and the family balances (the UNet's attn1,
    keys_values.py Keys.balance); else plain (Flux, Wan)."""
    try:
        free = kernel.bucket(head + 8) == kernel.bucket(head)
    except ValueError:
        free = False
    return "channel" if free else "equal_mass" if family == "sdxl" else "plain"


def check(family: str, model: Any, patched: Any, kernel: ks.StandIn, models: dict, tiny: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Run the plain model (its first self-attention's inputs) and ToMA's on `kernel`; check the
    module docstring's claims on the first merged call."""
    _, latent, pos, neg = models[family]
    plain = kvp.attention_inputs(model, latent, pos, neg)
    q, k, v = plain[0]
    kernel.calls.clear()
    caplog.set_level(logging.INFO)
    with kvp.merges_seen() as seen:
        out = tiny.sample(patched, latent, steps=1, cfg=1.0, positive=pos, negative=neg)
    assert torch.isfinite(out).all()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    run = run_records(caplog)[-1]
    merged = [c for c in kernel.calls if c["keys"] < c["queries"]]
    assert merged and run.block_runs_merged > 0 and not run.unmerged_blocks, run
    head = q.shape[-1]
    assert all(c["bucket"] <= kernel.bucket(head) for c in kernel.calls)
    form = expected_form(kernel, head, family)
    assert run.attention and all(what.endswith(f" as {form}") for what in run.attention), run
    plan, keys = seen[0]
    plan = plan.balanced() if form == "equal_mass" else plan
    start, kept = keys.start, plan.num_kept
    k_m, v_m = kvp.merged(k.expand(q.shape[0], -1, -1, -1), plan, start), kvp.merged(v.expand(q.shape[0], -1, -1, -1), plan, start)
    mass = torch.nn.functional.pad(plan.cluster_sizes(), (start, k_m.shape[2] - start - kept), value=1.0)
    if form == "equal_mass":
        assert float(mass.max() - mass.min()) < 1e-4 * float(mass.max())
    logits = q @ k_m.transpose(-1, -2) / math.sqrt(head) + (0 if form == "plain" else mass.log()[:, None, None, :])
    formula = logits.softmax(-1) @ v_m
    got = merged[0]["out"][..., :head].float()
    assert rel(got, formula) < (2e-3 if got.dtype == torch.float16 or merged[0]["out"].dtype == torch.float16 else 1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", list(KERNELS))
def test_comfyui_flag(kind: str, family: str, models: dict, tiny: Any, toma: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    kernel = KERNELS[kind]()
    ks.install_flag(kind, kernel, monkeypatch)
    model = models[family][0]
    check(family, model, toma.patch(model, ratio=0.5, tile_size=4, scope="keys_values"), kernel, models, tiny, caplog)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("order", ["toma_first", "toma_last"])
@pytest.mark.parametrize("mode", list(KJNODES))
def test_kjnodes_override(mode: str, order: str, family: str, models: dict, tiny: Any, toma: Any, monkeypatch: pytest.MonkeyPatch,
                          caplog: pytest.LogCaptureFixture) -> None:
    option, make = KJNODES[mode]
    kernel = make()
    model = models[family][0]
    settings = {"ratio": 0.5, "tile_size": 4, "scope": "keys_values"}
    if order == "toma_first":
        patched = ks.install_kjnodes(option, kernel, toma.patch(model, **settings), monkeypatch)
    else:
        patched = toma.patch(ks.install_kjnodes(option, kernel, model, monkeypatch), **settings)
    check(family, model, patched, kernel, models, tiny, caplog)


def test_run_kernel_reads_the_override_chain(tiny_flux: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """nodes/machinery/kernel_choice.py: ComfyUI's selection (attention_pytorch on a CPU: the matmul
    kernel; attention_sage: SageAttention 2), ComfyUI's set_model_optimized_attention, an override that
    hands on or declares its kernel, and an unknown override (None, named by its qualified name)."""
    from harness.pack import pack_module

    choice = pack_module("nodes.machinery.kernel_choice")
    kernels = pack_module("toma_core.kernels").KERNELS
    import comfy.ldm.modules.attention as attention

    monkeypatch.setattr(attention, "optimized_attention", attention.attention_pytorch)
    assert choice.run_kernel(None, "cpu")[0] is kernels["matmul"] and choice.run_kernel({}, "cuda")[0] is kernels["sdpa"]

    def unknown(func, *args, **kwargs):
        return func(*args, **kwargs)

    kernel, name = choice.run_kernel({"optimized_attention_override": unknown}, "cpu")
    assert kernel is None and name.startswith("unknown override ") and "unknown" in name
    unknown.hands_on = True
    assert choice.run_kernel({"optimized_attention_override": unknown}, "cpu")[0] is kernels["matmul"]
    unknown.attention_kernel = kernels["flash3"]
    assert choice.run_kernel({"optimized_attention_override": unknown}, "cpu")[0] is kernels["flash3"]
    if hasattr(tiny_flux, "set_model_optimized_attention"):
        clone = tiny_flux.clone()
        clone.set_model_optimized_attention(attention.attention_pytorch)
        assert choice.run_kernel(clone.model_options["transformer_options"], "cuda")[0] is kernels["sdpa"]
    ks.install_flag("sage2", ks.sage2(), monkeypatch)
    assert choice.run_kernel(None, "cuda") == (kernels["sage2"], "sage2 (ComfyUI --use-sage-attention)")
