"""Which attention kernel a model call runs (toma_core/kernels.py's contracts), read from the objects
ComfyUI calls: the override in transformer_options["optimized_attention_override"] when one is set
(comfy.ldm.modules.attention.wrap_attn hands every call to it), else the function ComfyUI selected
at import as comfy.ldm.modules.attention.optimized_attention (its --use-sage-attention /
--use-flash-attention / xformers / --use-pytorch-cross-attention / --use-ck-attention flags).

An override ToMA does not know is an unknown kernel (None): the keys/values form keeps its head size
there (toma_core/keys_values.py `choose_form`). An override that hands every call on to the function
it is given (a recorder, a patch that only edits q / k / v) can say so with an attribute
`hands_on = True`: the kernel is then ComfyUI's selected function's; one that runs a kernel of
toma_core/kernels.py can name it, `attention_kernel = KERNELS[name]`.
"""

from __future__ import annotations

import inspect
import sys

from ...toma_core.kernels import KERNELS, MATMUL, Kernel

OVERRIDE = "optimized_attention_override"
"""The transformer_options key comfy.ldm.modules.attention.wrap_attn hands every attention call to."""


def run_kernel(options: dict | None, device_type: str) -> tuple[Kernel | None, str]:
    """The kernel this model call's attention runs on a `device_type` device ("cuda", "cpu", ...) and
    a short name for the run line; None for a kernel ToMA cannot tell (an unknown override)."""
    override = (options or {}).get(OVERRIDE)
    declared = getattr(override, "attention_kernel", None)
    if isinstance(declared, Kernel):
        return declared, f"{declared.name} (declared by {_qualname(override)})"
    if override is not None and not getattr(override, "hands_on", False):
        return override_kernel(override, device_type)
    import comfy.ldm.modules.attention as attention

    kernel, name = function_kernel(attention.optimized_attention, device_type)
    return kernel, name if override is None else f"{name} through {_qualname(override)}"


def function_kernel(func, device_type: str) -> tuple[Kernel | None, str]:
    """The kernel of one of ComfyUI's attention functions (wrapped by wrap_attn or not, as an
    override receives it); None for a function of no known kernel."""
    import comfy.ldm.modules.attention as attention

    func = getattr(func, "__wrapped__", func)
    flags = (
        ("attention_sage", lambda: _sage_kernel(getattr(attention, "sageattn", None)), "(ComfyUI --use-sage-attention)"),
        ("attention3_sage", lambda: KERNELS["sage3"], "(ComfyUI sage3)"),
        ("attention_flash", lambda: _flash_kernel(False), "(ComfyUI --use-flash-attention)"),
        ("attention_xformers", lambda: KERNELS["xformers"], "(ComfyUI xformers)"),
        ("attention_comfy_kitchen_int8", lambda: KERNELS["kitchen_int8"], "(ComfyUI --use-ck-attention)"),
        ("attention_pytorch", lambda: KERNELS["sdpa" if device_type == "cuda" else MATMUL], "(ComfyUI pytorch attention)"),
        ("attention_split", lambda: KERNELS[MATMUL], "(ComfyUI split attention)"),
        ("attention_sub_quad", lambda: KERNELS[MATMUL], "(ComfyUI sub-quadratic attention)"),
        ("attention_basic", lambda: KERNELS[MATMUL], "(ComfyUI basic attention)"),
    )
    for name, kernel, how in flags:
        known = getattr(attention, name, None)
        if known is not None and func is getattr(known, "__wrapped__", known):
            chosen = kernel()
            return chosen, f"{chosen.name} {how}"
    return None, f"unknown attention function {_qualname(func)}"


def override_kernel(override, device_type: str) -> tuple[Kernel | None, str]:
    """The kernel of an optimized_attention_override: KJNodes' "Patch Sage Attention KJ" / "Patch
    Flash Attention KJ" (and its loaders' sage option), told by their closures
    (ComfyUI-KJNodes nodes/model_optimization_nodes.py: `attention_override_sage` holds
    `new_attention`, a wrap_attn function whose closure holds `sage_func`, itself holding the
    `sage_attention` mode; the flash one holds `flash_func` and `is_fa3`), and ComfyUI's own
    ModelPatcher.set_model_optimized_attention (ComfyUI 0.33 model_patcher.py: its override closes
    over the chosen `optimized_attention` function: its "ModelAttentionBackend" node); None for any other."""
    chosen = _closure(override).get("optimized_attention")
    if chosen is not None:
        kernel, name = function_kernel(chosen, device_type)
        return kernel, f"{name} via set_model_optimized_attention" if kernel is not None else f"unknown override {_qualname(chosen)}"
    found = _closure(_closure(override).get("new_attention"))
    if "sage_func" in found:
        sage = _closure(found["sage_func"])
        mode = str(sage.get("sage_attention", ""))
        kernel = KERNELS["sage3"] if "sageattn3" in mode else _sage_kernel(sage["sageattn"]) if "sageattn" in sage else KERNELS["sage2"]
        return kernel, f"{kernel.name} (KJNodes Patch Sage Attention KJ{', ' + mode if mode else ''})"
    if "flash_func" in found:
        kernel = _flash_kernel(bool(_closure(found["flash_func"]).get("is_fa3")))
        return kernel, f"{kernel.name} (KJNodes Patch Flash Attention KJ)"
    return None, f"unknown override {_qualname(override)}"


def _sage_kernel(sageattn) -> Kernel:
    """SageAttention 2 when the package the sage function comes from has its CUDA kernels
    (sageattention 2.x `sageattn_qk_int8_pv_fp16_cuda`), else the Triton-only 1.0.6."""
    module = getattr(sageattn, "__module__", None) or "sageattention"
    package = sys.modules.get(module.partition(".")[0])
    return KERNELS["sage2" if hasattr(package, "sageattn_qk_int8_pv_fp16_cuda") else "sage1"]


def _flash_kernel(fa3: bool) -> Kernel:
    """FlashAttention 3, else 2 by the flash_attn version (2.8.0 removed the 160 kernel)."""
    if fa3:
        return KERNELS["flash3"]
    version = str(getattr(sys.modules.get("flash_attn"), "__version__", "2.8"))
    major_minor = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    return KERNELS["flash2" if major_minor < (2, 8) else "flash2.8"]


def _closure(func) -> dict:
    """The variables a function closes over (its nonlocals and the globals it names), read through
    its decorators (functools.wraps' __wrapped__: wrap_attn, torch.compiler.disable); {} for anything
    that is not a Python function."""
    func = inspect.unwrap(func) if callable(func) else func
    if not inspect.isfunction(func):
        return {}
    found = inspect.getclosurevars(func)
    return {**found.globals, **found.nonlocals}


def _qualname(obj) -> str:
    kind = obj if inspect.isfunction(obj) or inspect.isclass(obj) else type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"
