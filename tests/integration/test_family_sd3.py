"""ToMA on SD3 / SD3.5 (MMDiT) in real ComfyUI: a tiny random-weight `OpenAISignatureMMDITWrapper`
sampled through `comfy.sample.sample`. Traps (comfy/ldm/modules/diffusionmodules/mmdit.py): no
rope, the last block returns no text, an image-only self-attention in SD3.5-Medium blocks, the
grid from the APPLY_MODEL wrapper (MMDiT has no DIFFUSION_MODEL executor)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402

LATENT = (1, 16, 16, 16)
"""An 8 x 8 token grid."""
TEXT = 12


@pytest.fixture(scope="module")
def sd3(tiny: Any) -> Any:
    return tiny_dits.build_sd3(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("sd3", 1, TEXT), tiny_dits.conditioning("sd3", 2, TEXT)


def test_ratio_zero_is_bit_identical(sd3: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, sd3, LATENT, *conds)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_every_block_runs_on_merged_tokens(sd3: Any, tiny: Any, toma: Any, conds: tuple, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    """3 joint blocks: joint attention T + N -> T + D; block 0's image-only attention N -> D. The
    last (pre-only) block merges too, so its None text stream went through."""
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, sd3, LATENT, *conds, scope=scope)
    assert plain == [TEXT + 64, 64, TEXT + 64, TEXT + 64]  # one batched cond+uncond call
    assert merged == [TEXT + 32, 32, TEXT + 32, TEXT + 32]
    assert rel(out, base) > 1e-3
    run = fc.summary(caplog)
    assert run.block_runs_merged == 3 and run.tokens.get((8, 8)) == (64, 32)


def test_unpatched_model_unchanged(sd3: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, sd3, LATENT, *conds)


def test_per_sample_plans_under_cfg(sd3: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, sd3, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 17, 23), (1, 16, 2, 30), (1, 16, 10, 26)])
def test_odd_sizes(sd3: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[2] // 2) * -(-shape[3] // 2)
    fc.check_odd_size(tiny, toma, sd3, shape, *conds, full_length=TEXT + n)


def test_refuses_what_it_cannot_honour(sd3: Any, toma: Any) -> None:
    with pytest.raises(ValueError, match="scope='attention' is available for Flux-family and UNet models only; SD3"):
        patch(toma, sd3, scope="attention")
    with pytest.raises(ValueError, match="proportional_attention=True"):
        patch(toma, sd3, proportional_attention=True)
    with pytest.raises(ValueError, match="double range 0-5 is outside this model.s double blocks 0-2"):
        patch(toma, sd3, blocks="double:0-5")


@pytest.mark.parametrize("blocks", ["all", "double:1", "double:2"])
def test_text_rows_pass_through_exactly(sd3: Any, tiny: Any, toma: Any, conds: tuple, blocks: str) -> None:
    """Which rows merged: the T text rows ([context; x] in `_block_mixing`'s joint attention) reach
    the first merged block's joint attention exactly as unpatched, the N image rows lose N - D. Block 0
    (all) has SD3.5-Medium's x_block_self_attn, block 1 is a plain SD3 block, block 2 the last one
    (pre-only context block)."""
    fc.check_passthrough_rows(tiny, toma, sd3, LATENT, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=32, blocks=blocks)
    fc.check_keys_values_rows(tiny, toma, sd3, LATENT, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=32, blocks=blocks)


def test_x_block_self_attention_holds_only_merged_image_tokens(sd3: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """SD3.5-Medium's x_block_self_attn (block 0's image-only second attention) runs on exactly the
    D merged image tokens block 0 receives: its q, k, v are `DismantledBlock.pre_attention_x` of
    that merged x, no text row among them, while the joint attention keeps the T text rows."""
    inputs: list[tuple] = []
    block = sd3.get_model_object("diffusion_model.joint_blocks.0")
    hook = block.register_forward_pre_hook(lambda module, args, kwargs: inputs.append((args[1], kwargs["c"])), with_kwargs=True)
    try:
        merged = fc.attention_inputs(tiny, patch(toma, sd3, ratio=0.5, tile_size=4, blocks="double:0"), LATENT, *conds)
    finally:
        hook.remove()
    assert [c[1].shape[1] for c in merged] == [TEXT + 32, 32, TEXT + 64, TEXT + 64]
    (x, c), = inputs
    assert x.shape[1] == 32
    with torch.no_grad():
        _, qkv2, _ = block.x_block.pre_attention_x(x, c)
    for recorded, expected in zip(merged[1], qkv2):
        torch.testing.assert_close(recorded, expected, rtol=1e-5, atol=1e-6)


def test_register_tokens_pass_through_exactly(tiny: Any, toma: Any, conds: tuple) -> None:
    """MMDiT register tokens (register_length, prepended to the context in
    forward_core_with_concat) and the text after them pass through exactly."""
    model = tiny_dits.build_sd3(seed=0, register_length=4)
    fc.check_passthrough_rows(tiny, toma, model, LATENT, *conds, kept=lambda plain, merged: [(0, 0, 4 + TEXT)], merged_tokens=32)
    fc.check_keys_values_rows(tiny, toma, model, LATENT, *conds, kept=lambda plain, merged: [(0, 0, 4 + TEXT)], merged_tokens=32)


def test_keys_values_merge_the_x_block_self_attention_keys_too(sd3: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scope keys_values on a block with SD3.5-Medium's x_block_self_attn: both of its attention calls
    keep every query (N image queries in the second) and take the block's plan's merge of the N image
    keys and values (the joint one after its T text keys), each merged key carrying its log-mass."""
    plans: list[Any] = []
    original = toma.runtime.make_plan
    monkeypatch.setattr(toma.runtime, "make_plan", lambda *a, **k: plans.append(original(*a, **k)) or plans[-1])
    plain, _ = fc.heads_first_inputs(tiny, sd3, LATENT, *conds)
    merged, _ = fc.heads_first_inputs(tiny, patch(toma, sd3, ratio=0.5, tile_size=4, blocks="double:0", scope="keys_values"), LATENT, *conds)
    (plan,) = plans
    assert [m[1].shape[1] for m in merged] == [TEXT + 32, 32, TEXT + 64, TEXT + 64]
    for (q_p, k_p, v_p), (q_m, k_m, v_m), text in zip(plain[:2], merged[:2], (TEXT, 0)):
        e, e_pad = q_p.shape[-1], q_m.shape[-1]
        torch.testing.assert_close(q_m[..., :e], q_p, rtol=1e-5, atol=1e-5)
        for p_t, m_t, scale in ((k_p, k_m, (e_pad / e) ** 0.5), (v_p, v_m, 1.0)):
            torch.testing.assert_close(m_t[:, :text, :, :e] / scale, p_t[:, :text])
            image = plan.merge(p_t[:, text:].flatten(2)).unflatten(-1, p_t.shape[2:])
            torch.testing.assert_close(m_t[:, text:, :, :e] / scale, image, rtol=1e-5, atol=1e-5)
        mass = k_m[:, text:, 0, e] / e_pad ** 0.5
        torch.testing.assert_close(mass, plan.size_bias().to(mass), rtol=1e-5, atol=1e-5)
