"""ToMA on Kandinsky 5 in real ComfyUI: tiny random-weight `comfy.supported_models.Kandinsky5`
(Video Lite / Pro) and `Kandinsky5Image` (Image Lite) sampled through `comfy.sample.sample`; the
adapter is nodes/families/kandinsky5.py.

Kandinsky 5's traps (comfy/ldm/kandinsky5/model.py): the visual blocks see image tokens only, the text
runs through its own text blocks first and enters the visual blocks by cross-attention; the rope table
is 3-D (frame, row, column); ComfyUI's `original_block` returns a tensor while the replace function
must return {"x": ...}; the image model gets 4-D latents. Attention calls are told apart by their
lengths: the text blocks' self-attention is T x T, the visual self-attention N x N (D x D merged), the
cross-attention N x T.

The class is new in ComfyUI 0.33: on 0.3.64 every test here skips saying so."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import family_checks as fc  # noqa: E402
from compat_support import patch, record_attention  # noqa: E402

from harness import tiny_dits  # noqa: E402
from harness.metrics import relative_error as rel  # noqa: E402

VIDEO = (1, 16, 5, 16, 16)
"""5 latent frames of an 8 x 8 token grid (patch 1 x 2 x 2): N = 320."""
IMAGE = (1, 16, 16, 16)
"""One 8 x 8 token grid: N = 64."""
TEXT = 12
VISUAL_BLOCKS = 3


@pytest.fixture(scope="module")
def video(tiny: Any) -> Any:
    return fc.require(tiny_dits.build_kandinsky5(seed=0), "Kandinsky5")


@pytest.fixture(scope="module")
def image(tiny: Any) -> Any:
    return fc.require(tiny_dits.build_kandinsky5(seed=1, image=True), "Kandinsky5Image")


def conditioning() -> tuple[list, list]:
    return tiny_dits.conditioning("kandinsky5", 1, TEXT), tiny_dits.conditioning("kandinsky5", 2, TEXT)


def kept_tokens(toma: Any, frames: int, ratio: float = 0.5, tile: int = 4) -> int:
    """D of an 8 x 8 grid of `frames` frames: frame 0 on its own, frames 1.. in tiles of the settings'
    default tile_frames."""
    grid = toma.core.TileGrid
    first = grid(8, 8, tile, ratio).num_kept
    if frames == 1:
        return first
    tile_frames = toma.settings.ToMASettings().tile_frames
    return first + grid(8, 8, tile, ratio, frames=frames - 1, tile_frames=tile_frames).num_kept


def attention_lengths(tiny: Any, toma: Any, model: Any, latent: tuple[int, ...], **settings: Any) -> list[tuple[int, int]]:
    """(query, key) lengths of every attention call of a 1-step, cfg-1 run (patched with `settings`
    when given)."""
    pos, neg = conditioning()
    target = patch(toma, model, **({"tile_size": 4} | settings)) if settings else model
    recorder, calls = record_attention(target, lambda batch, q, k, mask: (q, k))
    fc.sample(tiny, recorder, latent, pos, neg, steps=1, cfg=1.0)
    return calls


@pytest.mark.parametrize("latent", [VIDEO, IMAGE], ids=["video", "image"])
def test_ratio_zero_is_bit_identical(video: Any, image: Any, tiny: Any, toma: Any, latent: tuple[int, ...]) -> None:
    fc.check_ratio_zero(tiny, toma, video if len(latent) == 5 else image, latent, *conditioning())


@pytest.mark.parametrize("latent", [VIDEO, IMAGE], ids=["video", "image"])
def test_visual_self_attention_runs_on_merged_tokens_and_text_never_merges(
    video: Any, image: Any, tiny: Any, toma: Any, latent: tuple[int, ...], caplog: pytest.LogCaptureFixture,
) -> None:
    """The text block's attention stays T x T; every visual block's self-attention runs D x D and
    its cross-attention D x T, D as the frame segments give it; the run line counts the blocks."""
    caplog.set_level("INFO")
    model = video if len(latent) == 5 else image
    frames = latent[2] if len(latent) == 5 else 1
    n, d = frames * 64, kept_tokens(toma, frames)
    plain = attention_lengths(tiny, toma, model, latent)
    merged = attention_lengths(tiny, toma, model, latent, ratio=0.5, blocks="all")
    assert plain == [(TEXT, TEXT)] + [(n, n), (n, TEXT)] * VISUAL_BLOCKS
    assert merged == [(TEXT, TEXT)] + [(d, d), (d, TEXT)] * VISUAL_BLOCKS
    assert d < n
    run = fc.summary(caplog)
    assert (run.blocks_selected, run.blocks, run.block_runs_merged) == (3, "blocks:0-2", VISUAL_BLOCKS), run


def test_text_reaches_every_attention_exactly(video: Any, tiny: Any, toma: Any) -> None:
    """Which rows merged: the text block's q, k, v and every cross-attention's keys and values (the
    text) are exactly as unpatched; only the visual queries and the visual self-attention shrink."""
    pos, neg = conditioning()
    plain = fc.attention_inputs(tiny, video, VIDEO, pos, neg)
    merged = fc.attention_inputs(tiny, patch(toma, video, ratio=0.5, tile_size=4, blocks="all"), VIDEO, pos, neg)
    assert len(plain) == len(merged) == 1 + 2 * VISUAL_BLOCKS
    for p, m in zip(plain[0], merged[0]):
        assert torch.equal(p, m)
    for i in range(VISUAL_BLOCKS):
        p_cross, m_cross = plain[2 + 2 * i], merged[2 + 2 * i]
        assert m_cross[0].shape[1] < p_cross[0].shape[1]
        torch.testing.assert_close(m_cross[1], p_cross[1], rtol=0, atol=0)
        torch.testing.assert_close(m_cross[2], p_cross[2], rtol=0, atol=0)


@pytest.mark.parametrize("latent", [VIDEO, IMAGE], ids=["video", "image"])
def test_keys_values_merge_only_the_visual_keys(
    video: Any, image: Any, tiny: Any, toma: Any, latent: tuple[int, ...], caplog: pytest.LogCaptureFixture,
) -> None:
    """Scope keys_values, which rows merged: the text block's attention stays as it is; each visual
    block's self-attention keeps its N queries and gets N - D merged keys and values (no pass-through
    rows: the visual blocks hold the video alone); its cross-attention keeps the T text keys; every
    visual block runs merged."""
    model = video if len(latent) == 5 else image
    frames = latent[2] if len(latent) == 5 else 1
    n, d = frames * 64, kept_tokens(toma, frames)
    caplog.set_level("INFO")
    fc.check_keys_values_rows(tiny, toma, model, latent, *conditioning(), lambda plain, merged: [], n - d)
    run = fc.summary(caplog)
    assert run.block_runs_merged == VISUAL_BLOCKS and run.unmerged_calls == run.unmerged_blocks == {}, run
    assert attention_lengths(tiny, toma, model, latent, ratio=0.5, blocks="all", scope="keys_values") == [(TEXT, TEXT)] + [(n, d), (n, TEXT)] * VISUAL_BLOCKS


def record_plans(monkeypatch: pytest.MonkeyPatch, toma: Any) -> list:
    """Every video plan the run builds (the one plan builder, nodes/run/runtime.py CallContext.plan)."""
    runner = toma.runtime
    plans: list = []
    original = runner.make_video_plan
    monkeypatch.setattr(runner, "make_video_plan", lambda *a, **k: plans.append(original(*a, **k)) or plans[-1])
    return plans


@pytest.mark.parametrize("tile_frames", [1, 3])
def test_frame_zero_merges_with_no_other_frame(video: Any, tiny: Any, toma: Any, tile_frames: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frame 0 (the first picture the causal VAE encodes alone; the input image of image-to-video)
    merges within itself: merging an indicator of frame 0 gives 0 or 1 in every merged token."""
    plans = record_plans(monkeypatch, toma)
    pos, neg = conditioning()
    fc.sample(tiny, patch(toma, video, tile_size=4, tile_frames=tile_frames), VIDEO, pos, neg)
    assert plans
    for plan in plans:
        indicator = torch.zeros(plan.batch, 5 * 64, 1)
        indicator[:, :64] = 1.0
        kept = plan.merge(indicator)
        assert ((kept - kept.round()).abs() < 1e-5).all() and (kept > 0.5).any()
        assert plan.num_kept < plan.num_tokens


def test_batch_and_cfg_get_per_sample_plans(video: Any, tiny: Any, toma: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fc.check_per_sample(tiny, toma, video, VIDEO, *conditioning(), monkeypatch, builder=(toma.runtime, "make_video_plan"))


def test_unpatched_model_stays_untouched(video: Any, tiny: Any, toma: Any) -> None:
    fc.check_clone_untouched(tiny, toma, video, VIDEO, *conditioning())


def test_uneven_grids_merge_and_stay_exact_at_ratio_zero(video: Any, tiny: Any, toma: Any) -> None:
    """3 frames of a 3 x 5 token grid (tiles cut at the edges). Odd latent pixels are not tried:
    Kandinsky5._forward pads them to the patch and returns the padded size, which ComfyUI's sampler
    rejects without ToMA too."""
    fc.check_odd_size(tiny, toma, video, (1, 16, 3, 6, 10), *conditioning(), full_length=3 * 3 * 5)


def test_another_packs_block_patch_runs_on_merged_tokens(video: Any, tiny: Any, toma: Any) -> None:
    """Another pack's object patch of a visual block's forward, there before ToMA, runs inside
    ToMA's patch on the merged tokens (D of them), and is restored when ToMA is re-applied at ratio 0.

    The dit replace key ("double_block", i) is not ToMA's hook: on ComfyUI 0.33 its `original_block`
    calls the block with keywords the block does not take, so a replace patch there fails without ToMA
    too (checked here, so the adapter's choice is revisited when ComfyUI fixes it)."""
    import comfy.ldm.kandinsky5.model as k5

    seen: list[int] = []
    clone = video.clone()
    block = clone.get_model_object("diffusion_model.visual_transformer_blocks.1")

    def foreign(visual_embed, text_embed, time_embed, freqs, transformer_options={}):  # noqa: B006
        seen.append(visual_embed.shape[1])
        return k5.TransformerDecoderBlock.forward(block, visual_embed, text_embed, time_embed, freqs, transformer_options)

    clone.add_object_patch("diffusion_model.visual_transformer_blocks.1.forward", foreign)
    pos, neg = conditioning()
    plain = fc.sample(tiny, video, VIDEO, pos, neg, steps=1)
    out = fc.sample(tiny, patch(toma, clone, tile_size=4), VIDEO, pos, neg, steps=1)
    assert seen and set(seen) == {kept_tokens(toma, 5)}
    assert torch.isfinite(out).all() and rel(out, plain) > 1e-4
    seen.clear()
    assert torch.equal(fc.sample(tiny, patch(toma, clone, ratio=0.0), VIDEO, pos, neg, steps=1), plain)
    assert seen and set(seen) == {320}

    replaced = video.clone()
    replaced.set_model_patch_replace(lambda args, extra: {"x": extra["original_block"](args)}, "dit", "double_block", 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        fc.sample(tiny, replaced, VIDEO, pos, neg, steps=1)


@pytest.mark.parametrize("settings, message", [
    ({"blocks": "blocks:0-3"}, "blocks range 0-3 is outside this model's blocks 0-2"),
    ({"blocks": "double:0"}, "'double:0'"),
    ({"scope": "attention"}, "Kandinsky 5 merges whole blocks"),
    ({"proportional_attention": True}, "proportional_attention=True is available for Flux-family models only"),
])
def test_bad_settings_are_refused_with_the_fix(video: Any, toma: Any, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        patch(toma, video, **settings)


@pytest.mark.parametrize("name, visual_blocks", [("Video Lite", 32), ("Image Lite", 50), ("Video Pro", 60)])
def test_real_block_counts_on_the_meta_device(tiny: Any, toma: Any, name: str, visual_blocks: int) -> None:
    """Kandinsky 5 at its real depths (no weights: the meta device): the adapter reads the visual
    block count and refuses one past it."""
    import comfy.model_patcher
    import comfy.supported_models

    cls = fc.require(getattr(comfy.supported_models, "Kandinsky5Image" if name == "Image Lite" else "Kandinsky5", None), "Kandinsky5")
    config = tiny_dits.kandinsky5_config(name == "Image Lite", num_visual_blocks=visual_blocks)
    model = tiny.model_config(cls, config).get_model({}, device=torch.device("meta"))
    cpu = torch.device("cpu")
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    patch(toma, patcher, blocks=f"blocks:5-{visual_blocks - 1}")
    with pytest.raises(ValueError, match=f"this model's blocks 0-{visual_blocks - 1}"):
        patch(toma, patcher, blocks=f"blocks:{visual_blocks}")


def test_real_size_cost_profile_counts_the_visual_blocks(tiny: Any, toma: Any) -> None:
    """min_tokens "auto" reads Kandinsky 5 Video Lite's width (model_dim 1792) and its 32 visual
    blocks, text as cross-attention, and merges a 5 s 768 x 512 call (31 latent frames of 32 x 48
    tokens) at the node's tiles."""
    import comfy.model_patcher
    import comfy.supported_models

    cls = fc.require(getattr(comfy.supported_models, "Kandinsky5", None), "Kandinsky5")
    config = tiny_dits.kandinsky5_config(model_dim=1792, ff_dim=7168, time_dim=512, axes_dims=(16, 24, 24), num_visual_blocks=32, num_text_blocks=2)
    model = tiny.model_config(cls, config).get_model({}, device=torch.device("meta"))
    cpu = torch.device("cpu")
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    settings = toma.settings.ToMASettings(min_tokens=toma.settings.NODE_MIN_TOKENS, tile_size=toma.settings.NODE_TILE_SIZE)
    patched = toma.patching.patch_model(patcher, settings)
    cost = patched.model_options["transformer_options"][toma.settings.TOMA_KEY].config.cost
    assert cost.width == 1792 and sum(b.count for b in cost.blocks) == 32
    assert not any(b.joint for b in cost.blocks)
    assert cost.auto_veto(toma.runtime.CallGeometry(32, 48, 256, frames=31), "cpu", 2) is None
