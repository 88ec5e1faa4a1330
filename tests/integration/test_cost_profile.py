"""min_tokens "auto" on real-size models: the cost profile read from ComfyUI's own full-size model
classes, built on torch's meta device (no weights, no compute), merges the calls users run at
1024 px and leaves the small ones unmerged where merging would not pay. And on a real sampling run
of the Wan-shaped model (harness/tiny_wan.py WAN_SHAPED), whose prediction at the node's defaults
(scope keys_values, tiles 8 x 8 x 4 frames) is close to break-even: the run measures and its line says
what it decided (either outcome: CPU timing is noisy), while far from break-even (scope block, tile 4)
runs are deterministic.

Configs: Flux.1-dev (hidden 3072, 19 + 38 blocks) and SDXL (320 channels, transformer depth 2 / 10)
as ComfyUI's model detection reads them from the released checkpoints."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from harness.pack import PACK_NAME, pack_module

FLUX_DEV = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "vec_in_dim": 768, "context_in_dim": 4096,
            "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24, "depth": 19, "depth_single_blocks": 38,
            "axes_dim": [16, 56, 56], "theta": 10000, "patch_size": 2, "qkv_bias": True, "guidance_embed": True}
SDXL = {"use_checkpoint": False, "image_size": 32, "in_channels": 4, "out_channels": 4, "model_channels": 320,
        "use_spatial_transformer": True, "legacy": False, "use_temporal_attention": False, "use_temporal_resblock": False,
        "num_res_blocks": [2, 2, 2], "channel_mult": [1, 2, 4], "transformer_depth": [0, 0, 2, 2, 10, 10],
        "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10], "transformer_depth_middle": 10,
        "use_linear_in_transformer": True, "num_classes": "sequential", "adm_in_channels": 2816,
        "context_dim": 2048, "num_heads": -1, "num_head_channels": 64}
WAN_1_3B = {"image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "text_len": 512, "in_dim": 16,
            "dim": 1536, "ffn_dim": 8960, "freq_dim": 256, "text_dim": 4096, "out_dim": 16, "num_heads": 12,
            "num_layers": 30, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6}
WAN_14B = WAN_1_3B | {"dim": 5120, "ffn_dim": 13824, "num_heads": 40, "num_layers": 40}
"""Wan 2.1 / 2.2 14B T2V (a Wan 2.2 14B expert has the same blocks)."""


def meta_model(config_class: str, unet_config: dict[str, Any]) -> Any:
    import comfy.model_patcher
    import comfy.supported_models
    import torch

    from harness.tiny_models import tree_config

    unet_config = tree_config(unet_config)  # keys this tree's params class needs (ComfyUI 0.33: Flux's txt_ids_dims)
    config = getattr(comfy.supported_models, config_class)(dict(unet_config))
    config.unet_config.update(unet_config)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(config.get_model({}, device=torch.device("meta")), load_device=cpu, offload_device=cpu)


def auto_profile(comfy: Any, config_class: str, unet_config: dict[str, Any], **kwargs: Any) -> Any:
    patching, settings = pack_module("nodes.node.patching"), pack_module("nodes.settings")
    toma = settings.ToMASettings(min_tokens=settings.NODE_MIN_TOKENS, **kwargs)
    patched = patching.patch_model(meta_model(config_class, unet_config), toma)
    return patched.model_options["transformer_options"][settings.TOMA_KEY].config.cost


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_real_size_models_merge_at_1024px(comfy: Any, device: str) -> None:
    runtime = pack_module("nodes.run.runtime")
    flux = auto_profile(comfy, "Flux", FLUX_DEV)
    sdxl = auto_profile(comfy, "SDXL", SDXL)
    assert flux.width == 3072 and sdxl.width == 640  # SDXL's first transformer level
    assert flux.auto_veto(runtime.CallGeometry(64, 64, 512), device, 1) is None  # 1024 px, 512 text tokens
    assert sdxl.auto_veto(runtime.CallGeometry(128, 128, 77), device, 2) is None  # 1024 px, cond + uncond


def test_small_calls_of_a_real_size_unet_run_unmerged_on_a_gpu(comfy: Any) -> None:
    runtime = pack_module("nodes.run.runtime")
    sdxl = auto_profile(comfy, "SDXL", SDXL)
    small, large = runtime.CallGeometry(32, 32, 77), runtime.CallGeometry(128, 128, 77)
    assert sdxl.speedup(small.tokens, 77, "cuda", 2) < sdxl.speedup(large.tokens, 77, "cuda", 2)
    reason = sdxl.auto_veto(small, "cuda", 1)
    assert reason is not None and "1024 image tokens at width 640 on cuda" in reason


def test_a_real_size_video_model_merges_at_the_node_tiles(comfy: Any) -> None:
    """Wan 2.1 1.3B at 480p, 81 frames (21 x 30 x 52 latent tokens) with the nodes' tile 8 x 4 frames:
    the plan, which grows with the tile's 256 tokens, stays small beside 30 blocks of width 1536."""
    runtime, settings = pack_module("nodes.run.runtime"), pack_module("nodes.settings")
    wan = auto_profile(comfy, "WAN21_T2V", WAN_1_3B, tile_size=settings.NODE_TILE_SIZE)
    assert wan.width == 1536 and wan.tile_tokens == settings.NODE_TILE_SIZE ** 2 * settings.NODE_TILE_FRAMES
    assert wan.auto_veto(runtime.CallGeometry(30, 52, 512, frames=21), "cpu", 2) is None


def wan_shaped_run(caplog: pytest.LogCaptureFixture, start_percent: float, scope: str, **inputs: Any) -> tuple[Any, Any]:
    """A 4-step, cfg 1 run of the Wan-shaped model through ToMA at the ToMA Patch node's defaults
    (min_tokens "auto") at `scope` ("auto": keys_values on Wan, whose prediction here is within the
    cost model's error of break-even, docs/advice.md), at `start_percent` and with other `inputs`: its
    latent and run record. The run logs one info line, its run line (what auto measured is in it, not
    on a line of its own)."""
    from compat_support import RUNTIME_LOGGER, run_records

    from harness import tiny_models, tiny_wan

    nodes, patching = pack_module("nodes.node.toma_nodes"), pack_module("nodes.node.patching")
    settings = pack_module("nodes.settings")
    defaults = {i.id: i.default for i in nodes.ToMAPatch.define_schema().inputs if i.id != "model"}
    toma = nodes.build_settings(**(defaults | {"start_percent": start_percent} | inputs), min_tokens=settings.NODE_MIN_TOKENS, scope=scope)
    model = patching.patch_model(tiny_wan.build_wan("t2v", **tiny_wan.WAN_SHAPED), toma)
    latent = tiny_wan.WAN_SHAPED_LATENT
    positive = tiny_wan.conditioning(model, 1, latent)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=PACK_NAME):
        out = tiny_models.sample(model, latent, steps=4, cfg=1.0, positive=positive, negative=positive)
    info = [r for r in caplog.records if r.name.startswith(PACK_NAME) and r.levelno == logging.INFO]
    assert [r.name for r in info] == [RUNTIME_LOGGER], "one info line per run, its run line: " + "\n".join(r.getMessage() for r in info)
    return out, run_records(caplog)[-1]


@pytest.mark.parametrize("start", [0.2, 0.0])
def test_near_break_even_a_measurement_decides_and_the_run_line_says_so(comfy: Any, caplog: pytest.LogCaptureFixture, start: float) -> None:
    gain, settings = pack_module("nodes.run.gain"), pack_module("nodes.settings")
    assert start in (settings.NODE_START_PERCENT, 0.0)
    _, record = wan_shaped_run(caplog, start, settings.NODE_SCOPE)
    (measured,) = record.auto
    assert (measured.tokens, measured.batch) == (1680, 1) and measured.predicted is not None
    timed = record.unmerged_calls.get(gain.AUTO_TIMING, 0)
    eligible = 4 if start == 0 else 3  # 4 steps; the node's window (start 0.2) holds the last three
    assert timed == (1 if start == 0 else 0) and record.unmerged_calls.get("outside the sigma window", 0) == 4 - eligible
    stopped = sum(n for why, n in record.unmerged_calls.items() if why.endswith("stopped by min_tokens auto"))
    assert record.calls_merged + stopped == eligible - timed and record.calls_merged >= 1
    assert stopped == 0 if measured.merge else stopped >= 1
    assert record.gain is not None and record.gain.measured


def test_far_from_break_even_runs_are_deterministic(comfy: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Scope block, tile 4 x 4, one frame: the plan is small, every call is predicted to gain beyond
    the model's error, so every call merges and no clock is asked: two runs give the same latent and line."""
    import torch
    from compat_support import without_gain

    first, record = wan_shaped_run(caplog, 0.0, "block", tile_size=4, tile_frames=1)
    second, again = wan_shaped_run(caplog, 0.0, "block", tile_size=4, tile_frames=1)
    assert torch.equal(first, second)
    assert not record.auto and record.calls_merged == 4 and not record.unmerged_calls
    assert without_gain(record) == without_gain(again)


def test_auto_merges_keys_and_values_where_attention_dominates(comfy: Any) -> None:
    """Scope keys_values on the full-size models: the profile prices the setting's scope with the
    model's own head width (128), so min_tokens auto merges the long calls of Wan 14B (1280 x 720 x
    81: 21 x 45 x 80 tokens), where attention is most of a block, and refuses a 512 px Flux.1-dev
    call, where merging its 1,024 image keys is predicted below AUTO_MIN_SPEEDUP."""
    runtime, settings = pack_module("nodes.run.runtime"), pack_module("nodes.settings")
    wan = auto_profile(comfy, "WAN21_T2V", WAN_14B, tile_size=settings.NODE_TILE_SIZE, ratio=0.75, scope="keys_values")
    flux = auto_profile(comfy, "Flux", FLUX_DEV, scope="keys_values", ratio=0.75)
    assert {b.scope for b in wan.blocks if b.merged} == {"keys_values"} and {b.head for b in wan.blocks} == {128}
    for device in ("cpu", "cuda"):
        assert wan.auto_veto(runtime.CallGeometry(45, 80, 512, frames=21), device, 2) is None
        reason = flux.auto_veto(runtime.CallGeometry(32, 32, 512), device, 1)
        assert reason is not None and "1024 image tokens at width 3072" in reason
    block = auto_profile(comfy, "Flux", FLUX_DEV, ratio=0.75)
    assert block.speedup(1024, 512) > flux.speedup(1024, 512)


@pytest.mark.parametrize("kind", [None, "sage2", "flash2.8"])
def test_scope_auto_on_wan_14b_decides_by_the_selected_kernel(comfy: Any, kind: str | None, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """`scope` auto on Wan 14B under ComfyUI's own attention flag (kernel_standins.install_flag): the
    family's keys_values where the cost model predicts it pays on that kernel (at blocks 5-29, 25 of
    its 40 blocks, ratio 0.5 and the node's tiles), else the block merge, said once when patched."""
    import kernel_standins as ks

    settings, kernels = pack_module("nodes.settings"), pack_module("toma_core.kernels")
    if kind is not None:
        ks.install_flag(kind, ks.sage2() if kind == "sage2" else ks.flash("2.8"), monkeypatch)
    toma = dict(tile_size=settings.NODE_TILE_SIZE, ratio=0.5, tile_frames=settings.NODE_TILE_FRAMES,
                blocks="blocks:5-29", scope=settings.NODE_SCOPE)
    with caplog.at_level(logging.INFO, logger=pack_module("nodes.node.patching").__name__):
        cost = auto_profile(comfy, "WAN21_T2V", WAN_14B, **toma)
    kv = auto_profile(comfy, "WAN21_T2V", WAN_14B, **(toma | {"scope": "keys_values"}))
    pays, predicted = kv.keys_values_pays(kernels.KERNELS[kind] if kind else None, "cpu")
    assert {b.scope for b in cost.blocks if b.merged} == {"keys_values" if pays else "block"}
    assert ("scope auto runs block" in caplog.text) == (not pays)
    if kind == "sage2":
        assert not pays and f"{predicted:.2f}x" in caplog.text
