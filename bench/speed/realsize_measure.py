"""Timed probes of the real-size cost model: real-width blocks at given token counts, merged and unmerged.

A probe builds the family's few-block model (realsize_setup.RealFamily.reduced: the real class at the
real width, one or two blocks of each kind, every non-block layer; random weights) and times model
calls as a sampler makes them (BaseModel.apply_model with the patcher's wrappers, a ToMA run started
as its OUTER_SAMPLE wrapper starts one), unpatched and patched with the pack's own node code on every
block, in turns. Every block is timed inside its own hook key (the dit replace key a family uses, or
the UNet block's object patch), so one call gives each block kind's time at its token count, and
the call's remainder is the non-block time (embedders, final layer; a UNet's res blocks, up/down
sampling and the transformer stacks' proj_in/out). The merged call builds its plans in its first
merged block (recompute every call); the plan is timed on its own with toma_core's make_plan at the
same tokens and channels and taken out of that block, so block times hold merge + block + unmerge.

Separately: torch SDPA (ComfyUI's optimized_attention) on one head at several lengths, which the
model scales by the heads (the N^2 term of the fits).

Times are in ms on the process CPU clock with one thread (CPU: waiting for a shared core does not
count) or wall time after a CUDA synchronise (--device cuda).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.tiny_models import init_weights, tree_config

from . import realsize_setup as rs


@dataclass
class Clock:
    """Milliseconds on the process CPU clock (cpu) or after a device synchronise (cuda)."""

    device: str

    def now(self) -> float:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            return time.perf_counter() * 1000
        return time.process_time() * 1000


def build_reduced(name: str, device: str, dtype: torch.dtype = torch.float32, overrides: dict[str, Any] | None = None) -> Any:
    """The family's few-block model at the real width (or with the config `overrides`, e.g. a toy
    width for a smoke run), random weights, in a ModelPatcher."""
    import comfy.model_patcher
    import comfy.supported_models

    fam = rs.family(name)
    unet_config = tree_config(fam.unet_config | fam.reduced | (overrides or {}))
    config = getattr(comfy.supported_models, fam.config_class)(dict(unet_config))
    config.unet_config.update(unet_config)
    config.set_inference_dtype(dtype, None)
    dev = torch.device(device)
    model = config.get_model({}, device=dev)
    torch.manual_seed(0)
    init_weights(model.diffusion_model)
    pos_embed = getattr(model.diffusion_model, "pos_embed", None)
    if isinstance(pos_embed, torch.Tensor):
        with torch.no_grad():
            pos_embed.normal_(0.0, 0.1)
    model.to(dev).eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=dev, offload_device=dev)


TEXT_DIM_KEYS = ("context_in_dim", "context_dim", "cap_feat_dim", "text_dim", "joint_attention_dim", "in_text_dim")
"""Config keys holding the text encoder's width (Flux, UNet, Lumina2 / Z-Image, Wan, Qwen-Image, Kandinsky 5)."""


def conditioning(name: str, batch: int, device: str, dtype: torch.dtype, text_dim: int | None = None) -> dict[str, Any]:
    """The family's usual conditioning: text context of text_len tokens (of the real text width, or
    `text_dim`), pooled vector, guidance (Z-Image: the caption's token count, as
    comfy.model_base.Lumina2.extra_conds passes it)."""
    fam = rs.family(name)
    gen = torch.Generator().manual_seed(1)
    dims = {"sdxl": 2048, "sd15": 768, "sd35_large": 4096, "qwen_image": 3584}
    width = text_dim or dims.get(name) or next(fam.unet_config[k] for k in TEXT_DIM_KEYS if k in fam.unet_config)
    out = {"c_crossattn": torch.randn((batch, fam.text_len, width), generator=gen)}
    pooled = {"sdxl": 2816, "sd35_large": 2048}.get(name) or fam.unet_config.get("vec_in_dim") or fam.unet_config.get("in_text_dim2")
    if pooled:
        out["y"] = torch.randn((batch, pooled), generator=gen)
    if fam.unet_config.get("guidance_embed"):
        out["guidance"] = torch.full((batch,), 3.5)
    cond: dict[str, Any] = {k: v.to(device, dtype if v.is_floating_point() and k != "guidance" else v.dtype)
                            for k, v in out.items()}
    if fam.config_class == "ZImage":
        cond["num_tokens"] = fam.text_len
    return cond


def latent(name: str, grid: rs.Grid, batch: int, device: str) -> torch.Tensor:
    """The noisy latent a call on `grid` takes (B, C, [F,] H, W)."""
    fam = rs.family(name)
    gen = torch.Generator().manual_seed(0)
    config = fam.unet_config | fam.reduced
    channels = config.get("in_channels", config.get("in_dim", 16))
    channels = 16 if name == "qwen_image" else channels
    patch = config.get("patch_size", 2)
    patch = patch[-1] if isinstance(patch, (list, tuple)) else patch
    if fam.unet:
        shape = (batch, channels, grid.height, grid.width)
    elif fam.video or name == "qwen_image":
        shape = (batch, channels, grid.frames, patch * grid.height, patch * grid.width)
    else:
        shape = (batch, channels, patch * grid.height, patch * grid.width)
    return torch.randn(shape, generator=gen).to(device)


def concat(name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The concat conditioning a call on latent x (B, C, F, H, W) takes: Kandinsky 5 video's image and
    mask channels (zeros, as comfy.model_base.Kandinsky5.concat_cond gives text-to-video), up to
    visual_embed_dim / the patch's volume; nothing for the other families."""
    config = rs.family(name).unet_config
    if config.get("image_model") != "kandinsky5" or x.ndim != 5:
        return {}
    extra = config["visual_embed_dim"] // 4 - x.shape[1]  # the (1, 2, 2) patch
    return {"c_concat": torch.zeros((x.shape[0], extra, *x.shape[2:]), device=x.device, dtype=x.dtype)} if extra > 0 else {}


# ------------------------------------------------------------------------------ block timers


class BlockTimer:
    """Collects (kind, tokens, ms) of every block run of a call."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.records: list[tuple[str, int, float]] = []

    def wrap_dit(self, kind: str, tokens: Callable[[dict], int], fn: Callable | None) -> Callable:
        def timed(args: dict, extra: dict) -> dict:
            start = self.clock.now()
            out = fn(args, extra) if fn is not None else extra["original_block"](args)
            self.records.append((kind, tokens(args), self.clock.now() - start))
            return out

        return timed

    def wrap_forward(self, kind: str, fn: Callable) -> Callable:
        def timed(x: torch.Tensor, context: Any = None, transformer_options: dict = {}) -> torch.Tensor:  # noqa: B006
            start = self.clock.now()
            out = fn(x, context=context, transformer_options=transformer_options)
            shape = transformer_options.get("activations_shape") or [0, 0, 0, 0]
            self.records.append((kind, int(shape[-2]) * int(shape[-1]), self.clock.now() - start))
            return out

        return timed

    def wrap_layer(self, kind: str, fn: Callable) -> Callable:
        """A layer forward whose first argument is the whole sequence x (B, L, C) (Lumina2 / Z-Image; Kandinsky
        5's visual tokens)."""
        def timed(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            start = self.clock.now()
            out = fn(x, *args, **kwargs)
            self.records.append((kind, int(x.shape[1]), self.clock.now() - start))
            return out

        return timed


DIT_KEYS = {"double": "double_block", "single": "single_block", "joint": "double_block", "joint_last": "double_block"}


def install_timers(patcher: Any, name: str, timer: BlockTimer) -> None:
    """Wrap every block of `patcher` (ToMA's hook where present, else the block itself) in `timer`."""
    fam = rs.family(name)
    dm = patcher.get_model_object("diffusion_model")
    if fam.unet:
        for site in rs.pack_module("nodes.families.unet_sites").find_sites(dm):
            kind = f"unet{int(site.module.attn1.to_q.weight.shape[0])}"
            key = rs.pack_module("nodes.machinery.hooks").forward_patch_key(site.path)
            inner = patcher.object_patches.get(key)
            if inner is None:
                module = site.module

                def inner(x, context=None, transformer_options={}, module=module):  # noqa: B006
                    return type(module).forward(module, x, context=context, transformer_options=transformer_options)

            patcher.object_patches[key] = timer.wrap_forward(kind, inner)
        return
    stream = {"lumina2": "layers", "kandinsky5": "visual_transformer_blocks"}.get(fam.unet_config.get("image_model", ""))
    if stream is not None:  # lumina2.apply / kandinsky5.apply object-patch each block's forward (x first: (B, L, C))
        hooks = rs.pack_module("nodes.machinery.hooks")
        for i, layer in enumerate(getattr(dm, stream)):
            key = hooks.forward_patch_key(f"{stream}.{i}")
            inner = patcher.object_patches.get(key) or layer.forward
            patcher.object_patches[key] = timer.wrap_layer("double", inner)
        return
    options = patcher.model_options.setdefault("transformer_options", {})
    replace = options.setdefault("patches_replace", {}).setdefault("dit", {})
    length = _image_length if fam.cross_text else _sequence_length
    index = 0
    for kind, count in rs.dit_kinds(name, reduced=True).items():
        for i in range(count):
            key = (DIT_KEYS[kind], index if kind in ("joint", "joint_last") else i)
            replace[key] = timer.wrap_dit(kind, length, replace.get(key))
            index += 1


def _image_length(args: dict) -> int:
    """Wan: the block attends over the image tokens (the text is cross-attention)."""
    return int(args["img"].shape[1])


def _sequence_length(args: dict) -> int:
    """Tokens a dit block attends over: txt + img for joint blocks, img (+txt for single blocks)."""
    img = args.get("img", args.get("x"))
    txt = args.get("txt")
    n = int(img.shape[1]) if img is not None else 0
    return n + (int(txt.shape[1]) if txt is not None and txt.ndim == 3 and txt.shape[-1] == img.shape[-1] else 0)


# ------------------------------------------------------------------------------ calls


def sampler_call(patcher: Any, x: torch.Tensor, cond: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """One model call at sigma 1 of a 2-step run, as a sampler makes it; a ToMA run is started as
    its OUTER_SAMPLE wrapper starts one, and its plans are dropped before every call (each call
    builds them)."""
    import comfy.model_patcher
    import comfy.patcher_extension

    device = x.device
    sigmas = torch.tensor([1.0, 0.5, 0.0], device=device)
    b = x.shape[0]
    options = comfy.model_patcher.create_model_options_clone(patcher.model_options)
    to = options.setdefault("transformer_options", {})
    to["wrappers"] = comfy.patcher_extension.copy_nested_dicts(patcher.wrappers)
    to.update(sample_sigmas=sigmas, sigmas=sigmas[:1], cond_or_uncond=[0] * b, uuids=["probe"] * b)
    key = rs.pack_module("nodes.settings").TOMA_KEY
    state = None
    if to.get(key) is not None:
        state = to[key].fresh()
        state.begin_run(patcher.get_model_object("model_sampling").percent_to_sigma, sigmas)
        to[key] = state
    t = sigmas[:1].expand(b)

    def call() -> torch.Tensor:
        if state is not None:
            state.plans.clear()
        with torch.no_grad():
            return patcher.model.apply_model(x, t, transformer_options=dict(to), **cond)

    return call


def patch_all(patcher: Any, ratio: float, tile_size: int, scope: str = "block") -> Any:
    """ToMA on every block (blocks 'all', every call merged, `scope`) through the pack's patch_model."""
    settings = rs.pack_module("nodes.settings")
    schedule = rs.pack_module("toma_core").MergeSchedule()
    return rs.pack_module("nodes.node.patching").patch_model(
        patcher, settings.ToMASettings(ratio=ratio, tile_size=tile_size, blocks="all", schedule=schedule, scope=scope))


def patch_model(patcher: Any, setting: Any) -> Any:
    """`patcher` through the pack's patch_model at a realsize_model.Setting (scope block, min_tokens 0)."""
    settings = rs.pack_module("nodes.settings")
    return rs.pack_module("nodes.node.patching").patch_model(
        patcher, settings.ToMASettings(ratio=setting.ratio, tile_size=setting.tile_size, schedule=setting.schedule(),
                                       blocks=setting.blocks, min_tokens=0))


def plan_ms(tokens: rs.Grid, channels: int, ratio: float, tile_size: int, clock: Clock, device: str, repeats: int = 2,
            tile_frames: int | None = None) -> float:
    """ms of one plan on the features the hooks use for a grid and width: toma_core.make_plan (video
    grids in tiles of 2 frames), or with `tile_frames` the video families' plan (video_plan)."""
    features = rs.pack_module("nodes.machinery.runner").features
    x = torch.randn((1, tokens.tokens, channels), device=device)
    best = []
    for _ in range(repeats):
        start = clock.now()
        video_plan(features(x), tokens, ratio, tile_size, tile_frames)
        best.append(clock.now() - start)
    return min(best)


def video_plan(features: torch.Tensor, grid: rs.Grid, ratio: float, tile_size: int, tile_frames: int | None) -> Any:
    """The plan of a call on `grid`: toma_core.make_plan (in tiles of 2 frames on a video grid) when
    tile_frames is None, else as the video families build it (nodes/families/wan.py, hunyuan_video.py,
    kandinsky5.py): frame 0 in its own segment, the frames after it in tiles of tile_frames."""
    core = rs.pack_module("toma_core")
    if tile_frames is None or grid.frames == 1:
        frames = {"frames": grid.frames, "tile_frames": 2} if grid.frames > 1 else {}
        return core.make_plan(features, grid.height, grid.width, ratio, tile_size, **frames)
    video = rs.pack_module("toma_core.video")
    segments = [video.Segment(1), video.Segment(grid.frames - 1, tile_frames=tile_frames)]
    return video.make_video_plan(features, segments, grid.height, grid.width, ratio, tile_size)


class HeadsFirstZeros:
    """A stand-in attention kernel with a real kernel's output handling and no attention work: zeros
    (B, H, L_q, e_v), reshaped to (B, L_q, H e_v) unless skip_output_reshape (as attention_pytorch)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, skip_reshape: bool = False,
                 skip_output_reshape: bool = False, **_: Any) -> torch.Tensor:
        if not skip_reshape:
            q = q.view(q.shape[0], q.shape[1], heads, -1).transpose(1, 2)
        out = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1] if skip_reshape else v.shape[-1] // heads)
        return out if skip_output_reshape else out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def kv_overhead_ms(grid: rs.Grid, channels: int, heads: int, text: int, ratio: float, tile_size: int, tile_frames: int | None,
                   clock: Clock, device: str, repeats: int = 3) -> float:
    """ms a keys/values block spends besides its attention kernel at `grid`'s image tokens (text first
    in the keys when `text`): KeysValuesOverride (nodes/machinery/keys_values.py: K and V merged with
    the call's plan, the log-mass channel, the padded q / k / v, the output's slice) around a kernel
    that does no attention, less the same kernel on the unmerged q / k / v (its own output reshape,
    which an unmerged block pays too). Fastest of `repeats`, after one untimed call of each (the first
    call allocates: without it a cached figure came out up to three times the steady one)."""
    kv = rs.pack_module("nodes.machinery.keys_values")
    features = rs.pack_module("nodes.machinery.runner").features
    n = grid.tokens
    plan = video_plan(features(torch.randn((1, n, channels), device=device)), grid, ratio, tile_size, tile_frames)
    q, k, v = (torch.randn((1, text + n, channels), device=device) for _ in range(3))
    kernel = HeadsFirstZeros()

    def fastest(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = clock.now()
            fn()
            times.append(clock.now() - start)
        return min(times)

    merged = fastest(lambda: kv.KeysValuesOverride(plan, kv.Keys(text, text + n), None, True)(kernel, q, k, v, heads))
    return max(0.0, merged - fastest(lambda: kernel(q, k, v, heads)))


def width_of(name: str) -> int:
    c = rs.family(name).unet_config
    return int(c.get("hidden_size") or c.get("dim") or c.get("model_dim")
               or c.get("num_attention_heads", 0) * c.get("attention_head_dim", 0)
               or 64 * c.get("depth", 0))


def probe(name: str, grids: list[rs.Grid], ratio: float, tile_size: int, rounds: int, device: str,
          log: Callable[[str], None] = print, keep: Callable[[list[dict[str, Any]]], None] | None = None,
          dtype: torch.dtype = torch.float32, overrides: dict[str, Any] | None = None, scope: str = "block",
          tile_frames: int | None = None) -> list[dict[str, Any]]:
    """Time unmerged and merged calls of the few-block model on each grid, in turns; one record per
    grid and round (block runs, call ms, the plan ms taken out of the first merged block per level).
    keep(records of a grid) is called after each grid (to cache them as they come). dtype: weights
    and compute; overrides: config keys replacing the real ones (build_reduced); scope: the merged
    model's (the records say it); tile_frames: the video plan whose time is taken out is built as the
    node builds it, in tiles of that many frames (None: make_plan in tiles of 2 frames, as the block
    probes above were)."""
    import comfy.model_management

    clock = Clock(device)
    base = build_reduced(name, device, dtype, overrides)
    text_dim = next((overrides[k] for k in TEXT_DIM_KEYS if k in (overrides or {})), None)
    cond = conditioning(name, 1, device, dtype, text_dim)
    plain, merged = base.clone(), patch_all(base, ratio, tile_size, scope)
    timers = {"unmerged": BlockTimer(clock), "merged": BlockTimer(clock)}
    install_timers(plain, name, timers["unmerged"])
    install_timers(merged, name, timers["merged"])
    records = []
    fam = rs.family(name)
    warm = latent(name, min(grids, key=lambda g: g.tokens), 1, device)
    for patcher in (plain, merged):  # untimed: the first call of a model pays allocations
        comfy.model_management.load_models_gpu([patcher])
        sampler_call(patcher, warm, cond | concat(name, warm))()
    for grid in grids:
        x = latent(name, grid, 1, device)
        grid_cond = cond | concat(name, x)
        calls = {"unmerged": (plain, sampler_call(plain, x, grid_cond)), "merged": (merged, sampler_call(merged, x, grid_cond))}
        plans = {}
        for r in range(rounds):
            rec: dict[str, Any] = {"family": name, "grid": [grid.frames, grid.height, grid.width], "tokens": grid.tokens,
                                   "ratio": ratio, "tile_size": tile_size, "round": r, "device": device, "scope": scope}
            for label, (patcher, fn) in calls.items():
                comfy.model_management.load_models_gpu([patcher])
                timers[label].records.clear()
                start = clock.now()
                fn()
                rec[label] = {"call_ms": clock.now() - start, "blocks": list(timers[label].records)}
            if not plans:
                levels = sorted({n for _, n, _ in rec["merged"]["blocks"]}) if fam.unet else [grid.tokens]
                for n in levels:
                    level = grid.level_of(n) if fam.unet else grid
                    plans[n] = plan_ms(level, _plan_width(name, rec, n), ratio, tile_size, clock, device, tile_frames=tile_frames)
            rec["plan_ms"] = {str(n): ms for n, ms in plans.items()}
            records.append(rec)
            log(f"  {name} {grid}: round {r}: unmerged {rec['unmerged']['call_ms']:.0f} ms, merged {rec['merged']['call_ms']:.0f} ms")
        if keep is not None:
            keep([rec for rec in records if rec["grid"] == [grid.frames, grid.height, grid.width]])
    del plain, merged, base
    gc.collect()
    return records


def _plan_width(name: str, rec: dict[str, Any], tokens: int) -> int:
    if not rs.family(name).unet:
        return width_of(name)
    kind = next(k for k, n, _ in rec["merged"]["blocks"] if n == tokens)
    return int(kind.removeprefix("unet"))


def kv_attention_probe(head_dim: int, pairs: list[tuple[int, int]], device: str, rounds: int = 1) -> list[dict[str, Any]]:
    """ms of ComfyUI's optimized_attention (torch SDPA) on one head of head_dim with L_q queries and
    L_kv keys, heads first (skip_reshape, as the keys/values scope calls it), for each (L_q, L_kv)."""
    from comfy.ldm.modules.attention import optimized_attention

    clock = Clock(device)
    out = []
    for queries, keys in pairs:
        q = torch.randn((1, 1, queries, head_dim), device=device)
        k, v = (torch.randn((1, 1, keys, head_dim), device=device) for _ in range(2))
        times = []
        for _ in range(rounds + 1):
            start = clock.now()
            optimized_attention(q, k, v, 1, skip_reshape=True, skip_output_reshape=True)
            times.append(clock.now() - start)
        out.append({"head_dim": head_dim, "length": queries, "keys": keys, "ms": min(times[1:])})
    return out


def attention_probe(head_dim: int, lengths: list[int], device: str, rounds: int = 1) -> list[dict[str, Any]]:
    """ms of ComfyUI's optimized_attention (torch SDPA) on one head of head_dim at each length."""
    from comfy.ldm.modules.attention import optimized_attention

    clock = Clock(device)
    out = []
    for length in lengths:
        q, k, v = (torch.randn((1, length, head_dim), device=device) for _ in range(3))
        times = []
        for _ in range(rounds + 1):
            start = clock.now()
            optimized_attention(q, k, v, 1)
            times.append(clock.now() - start)
        out.append({"head_dim": head_dim, "length": length, "ms": min(times[1:])})
    return out
