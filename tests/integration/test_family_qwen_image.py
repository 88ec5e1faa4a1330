"""ToMA on Qwen-Image and Qwen-Image-Edit in real ComfyUI: a tiny random-weight
`QwenImageTransformer2DModel` sampled through `comfy.sample.sample`. Traps
(comfy/ldm/qwen_image/model.py): the 5-D latent, pe with batch B and text rows first, its token
axis 1 or 2 depending on the tree, Edit reference tokens after the image (unmerged), cond and
uncond as separate calls of different lengths when only the positive has a reference, the
index_timestep_zero reference method (timestep-0 modulation from token N on), layered
multi-frame latents."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch, runs_for  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402
from harness.pack import pack_module  # noqa: E402

LATENT = (1, 16, 1, 16, 16)
"""An 8 x 8 token grid (Qwen-Image latents are 5-D with one frame)."""
TEXT = 12


REF = (1, 16, 1, 10, 12)
"""A reference latent of 5 x 6 = 30 tokens after the image."""


def reference(seed: int = 3) -> Any:
    return torch.randn(REF, generator=torch.Generator().manual_seed(seed))


def token_axis(pe: Any, length: int) -> int:
    """The axis of a rope table with `length` rows (axis 1 on ComfyUI 0.3.64, axis 2 on 0.33)."""
    (axis,) = [a for a in range(1, pe.ndim) if pe.shape[a] == length]
    return axis


def require_timestep_zero() -> None:
    from comfy.ldm.qwen_image.model import QwenImageTransformerBlock

    if "timestep_zero_index" not in inspect.signature(QwenImageTransformerBlock.forward).parameters:
        pytest.skip("ComfyUI 0.3.64 has no comfy.ldm.qwen_image index_timestep_zero reference method")


def text_and_references(text: int, refs: int) -> Any:
    """check_passthrough_rows spans: the T text rows first, the R reference rows last."""
    return lambda plain, merged: [(0, 0, text), (plain - refs, merged - refs, refs)]


@pytest.fixture(scope="module")
def qwen(tiny: Any) -> Any:
    return tiny_dits.build_qwen(seed=0)


@pytest.fixture(scope="module")
def conds(tiny: Any) -> tuple[list, list]:
    return tiny_dits.conditioning("qwen", 1, TEXT), tiny_dits.conditioning("qwen", 2, TEXT)


def test_ratio_zero_is_bit_identical(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_ratio_zero(tiny, toma, qwen, LATENT, *conds)


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_every_block_runs_on_merged_tokens(qwen: Any, tiny: Any, toma: Any, conds: tuple, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, qwen, LATENT, *conds, scope=scope)
    assert plain == [TEXT + 64] * 3 and merged == [TEXT + 32] * 3
    assert rel(out, base) > 1e-3
    assert fc.summary(caplog).block_runs_merged == 3


def test_unpatched_model_unchanged(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    fc.check_clone_untouched(tiny, toma, qwen, LATENT, *conds)


def test_per_sample_plans_under_cfg(qwen: Any, tiny: Any, toma: Any, conds: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, qwen, LATENT, *conds, monkeypatch)


@pytest.mark.parametrize("shape", [(1, 16, 1, 17, 23), (1, 16, 1, 2, 30), (1, 16, 1, 10, 26)])
def test_odd_sizes(qwen: Any, tiny: Any, toma: Any, conds: tuple, shape: tuple[int, ...]) -> None:
    n = -(-shape[3] // 2) * -(-shape[4] // 2)
    fc.check_odd_size(tiny, toma, qwen, shape, *conds, full_length=TEXT + n)


def test_edit_reference_tokens_pass_through(qwen: Any, tiny: Any, toma: Any) -> None:
    """The positive carries a 10 x 12 reference latent (5 x 6 = 30 tokens after the image): the cond
    call runs alone on T + D + 30 tokens, the uncond on T + D; ratio 0 stays exact."""
    pos = tiny_dits.conditioning("qwen", 1, TEXT, reference_latents=[reference()])
    neg = tiny_dits.conditioning("qwen", 2, TEXT)
    fc.check_ratio_zero(tiny, toma, qwen, LATENT, pos, neg)
    plain, merged, base, out = fc.merged_lengths(tiny, toma, qwen, LATENT, pos, neg)
    assert sorted(set(plain)) == [TEXT + 64, TEXT + 64 + 30]
    assert sorted(set(merged)) == [TEXT + 32, TEXT + 32 + 30]
    assert rel(out, base) > 1e-3


def test_merged_tokens_take_their_destinations_rope_rows(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """Block 1 sees pe rows [text; destinations' rows]: text rows unchanged, every image row one
    of the unmerged call's image rows."""

    def spying(model: Any, seen: list) -> Any:
        block = model.model.diffusion_model.transformer_blocks[1]

        def forward(**kwargs: Any) -> Any:
            seen.append((kwargs["image_rotary_emb"], kwargs["hidden_states"].shape[1]))
            return type(block).forward(block, **kwargs)

        spied = model.clone()
        spied.add_object_patch("diffusion_model.transformer_blocks.1.forward", forward)
        return spied

    merged: list = []
    full: list = []
    fc.sample(tiny, patch(toma, spying(qwen, merged), blocks="double:1", tile_size=4), LATENT, *conds, steps=1)
    fc.sample(tiny, spying(qwen, full), LATENT, *conds, steps=1)
    (pe, tokens), (pe_full, _) = merged[0], full[0]
    axis = token_axis(pe_full, TEXT + 64)
    assert tokens == 32 and pe.shape[axis] == TEXT + 32
    pe, pe_full = pe.movedim(axis, 1), pe_full.movedim(axis, 1)
    assert torch.equal(pe[:, :TEXT], pe_full[:, :TEXT])
    rows = {tuple(r.flatten().tolist()) for r in pe_full[0, TEXT:]}
    assert all(tuple(r.flatten().tolist()) in rows for r in pe[0, TEXT:])
    assert len({tuple(r.flatten().tolist()) for r in pe[0, TEXT:]}) > 1


def test_text_rows_pass_through_and_image_rows_merge(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """At the first shortened attention the T text rows are exactly the unpatched ones and the
    64-token image lost 32 rows (a pe axis the adapter misreads merges nothing)."""
    fc.check_passthrough_rows(tiny, toma, qwen, LATENT, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=32)
    fc.check_keys_values_rows(tiny, toma, qwen, LATENT, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=32)


def test_edit_reference_rows_pass_through(qwen: Any, tiny: Any, toma: Any) -> None:
    """With a reference after the image, text rows and the 30 reference rows reach the first
    shortened attention exactly as unpatched; 32 of the 64 image rows are gone."""
    pos = tiny_dits.conditioning("qwen", 1, TEXT, reference_latents=[reference()])
    neg = tiny_dits.conditioning("qwen", 2, TEXT)
    fc.check_passthrough_rows(tiny, toma, qwen, LATENT, pos, neg, kept=text_and_references(TEXT, 30), merged_tokens=32)
    fc.check_keys_values_rows(tiny, toma, qwen, LATENT, pos, neg, kept=text_and_references(TEXT, 30), merged_tokens=32)


def timestep_zero_conds() -> tuple[list, list]:
    """Positive with a reference under the index_timestep_zero method (Qwen-Image-Edit 2511's default)."""
    pos = tiny_dits.conditioning(
        "qwen", 1, TEXT, reference_latents=[reference()], reference_latents_method="index_timestep_zero",
    )
    return pos, tiny_dits.conditioning("qwen", 2, TEXT)


def test_timestep_zero_ratio_zero_is_bit_identical(qwen: Any, tiny: Any, toma: Any) -> None:
    require_timestep_zero()
    fc.check_ratio_zero(tiny, toma, qwen, LATENT, *timestep_zero_conds())


def test_timestep_zero_references_keep_their_modulation(qwen: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """index_timestep_zero: the block splits its modulation at the merged image's end, so the 30
    reference rows (timestep-0 modulation) and the text rows reach the first shortened attention
    exactly as unpatched, and every block run merges."""
    require_timestep_zero()
    pos, neg = timestep_zero_conds()
    fc.check_passthrough_rows(tiny, toma, qwen, LATENT, pos, neg, kept=text_and_references(TEXT, 30), merged_tokens=32)
    fc.check_keys_values_rows(tiny, toma, qwen, LATENT, pos, neg, kept=text_and_references(TEXT, 30), merged_tokens=32)
    caplog.set_level("INFO")
    plain, merged, base, out = fc.merged_lengths(tiny, toma, qwen, LATENT, pos, neg)
    assert sorted(set(merged)) == [TEXT + 32, TEXT + 32 + 30]
    assert rel(out, base) > 1e-3
    assert fc.summary(caplog).block_runs_merged == 6


def shifted_zero_index(model: Any) -> Any:
    """A clone of `model` whose blocks receive timestep_zero_index 8 tokens before the image's end:
    an object patch of each block's forward, put after (outside) the one ToMA may have put there."""
    shifted = model.clone()
    for i, block in enumerate(shifted.model.diffusion_model.transformer_blocks):
        key = f"diffusion_model.transformer_blocks.{i}.forward"
        run = shifted.object_patches.get(key) or (lambda *args, block=block, **kw: type(block).forward(block, *args, **kw))

        def forward(*args: Any, run: Any = run, timestep_zero_index: Any = None, **kwargs: Any) -> Any:
            index = None if timestep_zero_index is None else timestep_zero_index - 8
            return run(*args, timestep_zero_index=index, **kwargs)

        shifted.add_object_patch(key, forward)
    return shifted


def test_timestep_zero_index_inside_the_image_runs_unmerged(qwen: Any, tiny: Any, toma: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A timestep_zero_index inside the image rows has no merged position: the sampler does not
    fail, every block run stays unmerged with the layout reason, and the output equals the
    unpatched model's under the same index."""
    require_timestep_zero()
    pos, neg = timestep_zero_conds()
    caplog.set_level("INFO")
    plain = fc.sample(tiny, shifted_zero_index(qwen), LATENT, pos, neg, cfg=1.0)
    merged = fc.sample(tiny, shifted_zero_index(patch(toma, qwen, blocks="all")), LATENT, pos, neg, cfg=1.0)
    assert torch.equal(merged, plain)
    run = fc.summary(caplog)
    assert run.block_runs_merged == 0 and runs_for(run.unmerged_blocks, "timestep_zero_index 56 is not a boundary") > 0, run


LAYERED = (1, 16, 3, 16, 16)
"""A 3-frame latent (Qwen-Image-Layered's layers): 3 frames of 8 x 8 tokens, t-major."""


def require_frames(qwen: Any) -> None:
    try:
        qwen.model.diffusion_model.process_img(torch.zeros(LAYERED))
    except RuntimeError:
        pytest.skip("ComfyUI 0.3.64's QwenImageTransformer2DModel.process_img takes one latent frame")


def test_layered_latent_merges_each_frame_alone(qwen: Any, tiny: Any, toma: Any, conds: tuple) -> None:
    """A 3-frame latent: ratio 0 stays exact; text rows pass through, 3 x 32 image rows merge away,
    and block 1 sees 32 merged tokens per frame, each with a rope row of its own frame."""
    require_frames(qwen)
    fc.check_ratio_zero(tiny, toma, qwen, LAYERED, *conds)
    fc.check_passthrough_rows(tiny, toma, qwen, LAYERED, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=96)
    fc.check_keys_values_rows(tiny, toma, qwen, LAYERED, *conds, kept=lambda plain, merged: [(0, 0, TEXT)], merged_tokens=96)
    merged = rope_rows_of_block_one(tiny, patch(toma, qwen, blocks="all", tile_size=4), LAYERED, conds)
    full = rope_rows_of_block_one(tiny, qwen, LAYERED, conds)
    assert len(merged) == TEXT + 96 and len(full) == TEXT + 192
    for frame in range(3):
        own = set(full[TEXT + 64 * frame:TEXT + 64 * (frame + 1)])
        assert set(merged[TEXT + 32 * frame:TEXT + 32 * (frame + 1)]) <= own


def rope_rows_of_block_one(tiny: Any, model: Any, latent: tuple[int, ...], conds: tuple) -> list[tuple]:
    """The rope rows block 1 receives in a 1-step run (sample 0, one tuple per token; tokens on the
    table's longest axis)."""
    seen: list = []
    block = model.model.diffusion_model.transformer_blocks[1]
    spied = model.clone()
    run = spied.object_patches.get("diffusion_model.transformer_blocks.1.forward") or (lambda **kw: type(block).forward(block, **kw))

    def forward(**kwargs: Any) -> Any:
        seen.append(kwargs["image_rotary_emb"])
        return run(**kwargs)

    spied.add_object_patch("diffusion_model.transformer_blocks.1.forward", forward)
    fc.sample(tiny, spied, latent, *conds, steps=1)
    pe = seen[0]
    axis = max(range(1, pe.ndim), key=lambda a: pe.shape[a])
    return [tuple(r.flatten().tolist()) for r in pe.movedim(axis, 1)[0]]


def test_rope_axis_and_modulation_checks_refuse_other_layouts(toma: Any) -> None:
    """The pe token axis is the one axis of T + N + R rows (axis 1 or 2); no axis, or two, is a
    changed layout; so is a vec batch neither B nor 2B."""
    qwen_image = pack_module("nodes.families.qwen_image")
    assert qwen_image.token_axis(torch.zeros(1, 76, 1, 8, 2, 2), 76) == 1
    assert qwen_image.token_axis(torch.zeros(1, 1, 76, 8, 2, 2), 76) == 2
    for pe in (torch.zeros(1, 1, 75, 8, 2, 2), torch.zeros(1, 76, 76, 8, 2, 2)):
        refused = qwen_image.token_axis(pe, 76)
        assert refused.layout and "pe of shape" in refused.reason
    args = {"img": torch.zeros(2, 64, 8), "transformer_options": {}}
    assert qwen_image.timestep_zero(args | {"vec": torch.zeros(2, 8)}, 64) is None
    assert callable(qwen_image.timestep_zero(args | {"vec": torch.zeros(4, 8)}, 64))
    assert qwen_image.timestep_zero(args | {"vec": torch.zeros(3, 8)}, 64).layout


@pytest.mark.parametrize("scope", fc.SCOPES)
def test_text_mask_holds_on_merged_blocks(qwen: Any, tiny: Any, toma: Any, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    """A text mask hiding the last 4 of the T text tokens (the `encoder_hidden_states_mask` every
    block gets from `_forward`) still hides them on merged blocks: every block merges, and changing
    the hidden tokens leaves the output as it is; in both scopes."""
    mask = torch.ones((1, TEXT), dtype=torch.long)
    mask[:, -4:] = 0
    text = torch.randn((1, TEXT, 32), generator=torch.Generator().manual_seed(1))
    other = text.clone()
    other[:, -4:] = torch.randn((1, 4, 32), generator=torch.Generator().manual_seed(9))
    pos, changed = ([[t, {"attention_mask": mask}]] for t in (text, other))
    neg = tiny_dits.conditioning("qwen", 2, TEXT)
    if not torch.equal(fc.sample(tiny, qwen, LATENT, pos, neg, cfg=1.0), fc.sample(tiny, qwen, LATENT, changed, neg, cfg=1.0)):
        pytest.skip("ComfyUI 0.3.64's comfy.ldm.qwen_image Attention ignores the text mask")
    fc.check_ratio_zero(tiny, toma, qwen, LATENT, pos, neg, scopes=(scope,))
    patched = patch(toma, qwen, tile_size=4, blocks="all", scope=scope)
    caplog.set_level("INFO")
    out = fc.sample(tiny, patched, LATENT, pos, neg, cfg=1.0)
    assert fc.summary(caplog).block_runs_merged == 6
    assert rel(out, fc.sample(tiny, qwen, LATENT, pos, neg, cfg=1.0)) > 1e-3
    torch.testing.assert_close(fc.sample(tiny, patched, LATENT, changed, neg, cfg=1.0), out, rtol=1e-5, atol=1e-6)
