"""A CPU stand-in for ComfyUI-RadialAttn's "PatchRadialAttn", written from its published source
(woct0rdho/ComfyUI-RadialAttn@effd40139023520318e5ebd900d0a90d566ffc5f nodes.py).

Kept from the source: no attention override; its options in the model's transformer_options
("radial_attn": dense_block, dense_timestep, last_dense_timestep); a model-function wrapper that, inside its step window
(after `dense_timestep` steps, before the last `last_dense_timestep`), puts `maybe_radial_attn` in
place of comfy.ldm.wan.model's optimized_attention for the model call; from block `dense_block` on it
calls `get_radial_attn_func(...)`'s `radial_attn_func`, a function under ComfyUI's `wrap_attn`, which
treats q.shape != k.shape as cross-attention and hands it to ComfyUI's own attention. Left out: the
radial mask and the SpargeAttn kernel (CUDA only; here the radial path runs exact attention and
counts the call). The module attribute is set with pytest's monkeypatch and restored after each
model call (the pack uses unittest.mock.patch, the same set-and-restore).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F


def get_radial_attn_func(calls: list):
    from comfy.ldm.modules.attention import optimized_attention, wrap_attn

    @wrap_attn
    def radial_attn_func(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs):
        if q.shape != k.shape:
            calls.append(("dense", tuple(k.shape)))
            return optimized_attention(q, k, v, heads, mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape, **kwargs)
        calls.append(("radial", tuple(k.shape)))
        b = q.shape[0]
        q, k, v = (t if skip_reshape else t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        return out if skip_output_reshape else out.transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[-1])

    return radial_attn_func


def patch_radial_attn(model: Any, monkeypatch: Any, dense_block: int, dense_timestep: int, last_dense_timestep: int) -> tuple[Any, list]:
    """A clone of the Wan `model` with the stand-in's wrapper, and the list its radial function records into."""
    import comfy.ldm.wan.model as wan_model
    from comfy.ldm.modules.attention import optimized_attention

    calls: list = []
    radial_attn_func = get_radial_attn_func(calls)
    model = model.clone()
    options = {"dense_block": dense_block, "dense_timestep": dense_timestep, "last_dense_timestep": last_dense_timestep}
    model.model_options.setdefault("transformer_options", {})["radial_attn"] = options

    def unet_wrapper_function(model_function, kwargs):
        timestep, c = kwargs["timestep"], kwargs["c"]
        sigmas = c["transformer_options"]["sample_sigmas"]
        matched = (sigmas == timestep[0]).nonzero()  # the source compares the whole timestep: one sample's is the step
        step = matched[0].item() if len(matched) else 0
        if not dense_timestep <= step < len(sigmas) - 1 - last_dense_timestep:
            return model_function(kwargs["input"], timestep, **c)

        def maybe_radial_attn(*args, **kw):
            block_index = kw.get("transformer_options", {}).get("block_index", -1)
            return (radial_attn_func if block_index >= dense_block else optimized_attention)(*args, **kw)

        with monkeypatch.context() as m:
            m.setattr(wan_model, "optimized_attention", maybe_radial_attn)
            return model_function(kwargs["input"], timestep, **c)

    model.set_model_unet_function_wrapper(unet_wrapper_function)
    return model, calls
