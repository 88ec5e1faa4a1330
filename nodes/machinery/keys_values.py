"""Scope "keys_values": a merged block keeps every query; its self-attention runs on merged image
keys and values (toma_core/keys_values.py, DESIGN §1.9). Nothing is unmerged: every token keeps
its own residual, its MLP and its attention output, computed against a shorter context.

Every ComfyUI attention call goes through `transformer_options["optimized_attention_override"]`
(comfy.ldm.modules.attention.wrap_attn) after the model's qk-norm and rope. For one block run the
shared runner (runner.py `run_merged`) puts a `KeysValuesOverride` in a copy of the block's
transformer_options; the block runs on its own N tokens, and the override changes the first
attention call it sees, which in every supported block is its self-attention (the cross-attention
to text of Wan, Kandinsky 5 and the UNet comes after it; SD3.5-Medium's second, image-only
self-attention is named by `Keys.then`):

    q (B, H, L_q, e)                                   unchanged: L_q = `Keys.queries`
    k, v (B, H, L_k, e), image rows at Keys.start      -> [head; M img; tail] (B, H, L_k - N + D, e)
    mask (..., L_k)                                    -> the destinations' key columns
    log-mass of the merged keys                        -> one extra q/k channel (with_mass_channel)

A merging call of another shape (the block's layout changed under ComfyUI) raises SpansCut before
its keys merge: the block runs again unmerged, with the layout reason. A block whose attention
never reaches the override has run exactly as unpatched; it is counted unmerged rather than run twice:
NOT_REACHED (another node replaced it outside ComfyUI's attention functions) or, when the block got
none of the model call's transformer_options, NOT_HANDED (a forward loop such as TeaCache's runs the
block without them, so no override can reach it).
Another override already in the options (a node choosing the attention kernel, another pack's
attention patch) stays in charge of the kernel: it receives the merged keys and values. How the
override meets ComfyUI's dispatch (a layer's preferred kernel, tensor containers, the caller's scale)
and steps aside for sparse or radial attention: attention_interface.py, foreign_attention.py.

Keys are merged after rope: a merged key averages its cluster's rotated keys, so its logit
q.(M k) = sum_i M_i q.k_i is the mean of the cluster's own roped logits (exact per key, linear in
the keys); what is lost is only the spread of those logits inside a cluster, to which rope adds the
rotation differences within one tile (docs/keys_values.md "Roped keys";
tests/integration/test_keys_values_rope.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import torch

from ...toma_core import MergePlan
from ...toma_core.kernels import KERNELS, MATMUL, Kernel
from ...toma_core.keys_values import (
    CHANNEL,
    EQUAL_MASS,
    PLAIN,
    choose_form,
    join_heads,
    key_bias,
    merge_key_rows,
    split_heads,
    take_span,
    with_mass_channel,
)
from ..contract import NOTHING_TO_MERGE, Unmerged, layout_changed
from ..run.runtime import compiling
from ..settings import CALL_KEY
from .attention_interface import container_function, enter
from .kernel_choice import OVERRIDE, run_kernel
from .spans import SpansCut

log = logging.getLogger(__name__)

POSITIONAL = ("mask", "attn_precision", "skip_reshape", "skip_output_reshape")
"""The arguments after `heads` of ComfyUI's attention functions (attention_pytorch & co.), in order:
some callers pass the mask positionally (optimized_attention_masked in Qwen-Image and Lumina2)."""

R = TypeVar("R")

REFUSED = Unmerged("the attention kernel refused merged keys and values")
"""A keys/values block whose attention kernel raised on the merged call in every form it was
offered (an override ToMA does not know): the block runs again unmerged."""

NOT_REACHED = Unmerged("attention not reached: another node replaced it outside ComfyUI's attention functions")
"""A keys/values run whose block never called an attention function through its transformer_options."""

NOT_HANDED = Unmerged(
    "attention not reached: the loop running this block passes it none of the model call's transformer_options, "
    "which carry ToMA's attention patch"
)
"""A keys/values run that was not reached, of a block whose hook received no transformer_options of the model
call (no CALL_KEY in them): the loop calling the block is not ComfyUI's own, or one of its loops that keep the
options from the blocks; its block wrapper drops the options ToMA hands it (TeaCache's and MagCache's Flux
and Wan loops: `block_wrap` calls the block without them)."""


@dataclass(frozen=True)
class Keys:
    """Where a block's self-attention holds the N image keys: rows [start, start + N) of a key
    sequence with `queries` queries (the block's own tokens, text first or after as the family lays
    them out; the keys may be longer, e.g. cached reference keys appended after them). then: the
    image keys of the block's next attention call when that one is a self-attention over the image
    too (SD3.5-Medium's x_block_self_attn after the joint attention, mmdit._block_mixing); None: the
    calls after this one (cross-attention) keep their keys. balance: where a kernel takes no wider head,
    weigh the merged keys through an equal-mass plan (toma_core.keys_values EQUAL_MASS) rather than not
    at all (PLAIN); only where that was measured better on a trained fixture: the UNet's attn1 (SDXL
    fixture +2.8 / +2.1 dB over plain at ratio 0.5 / 0.75), not Wan (-6.7 / -3.9 dB: its balanced
    spatio-temporal tiles lose more than the mass buys; docs/keys_values.md "Fixture quality per form")."""

    start: int
    queries: int
    then: Keys | None = None
    balance: bool = False


class KeysValuesOverride:
    """An optimized_attention_override that merges the image keys and values of the first attention
    call (see the module docstring); `inner`: the override it chains to, or None. kernel: the kernel
    the call runs (kernel_choice.run_kernel; None: unknown), which picks the merged form
    (toma_core.keys_values.choose_form; the default, a kernel without buckets, keeps the channel).
    After the call, `form` is the form that ran and `refused` the kernel's error when it refused one."""

    def __init__(
        self, plan: MergePlan, keys: Keys, inner, mass: bool, kernel: Kernel | None = KERNELS[MATMUL], kernel_name: str = MATMUL,
    ) -> None:
        self.plan = plan
        self.kernel_name = kernel_name
        self.pending: Keys | None = keys
        self.inner = inner
        self.mass = mass
        self.kernel = kernel
        self.calls = 0
        self.form: str | None = None
        self.refused: str | None = None
        self.aside: Unmerged | None = None

    container_function = property(container_function)
    """The chained override's container path, where it has one (attention_interface.py)."""

    def __call__(self, func, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, *args, **kwargs) -> torch.Tensor:
        kwargs = dict(zip(POSITIONAL, args)) | kwargs
        func = enter(self, func, q, k, v, heads, kwargs)
        run = func if self.inner is None else (lambda *a, **kw: self.inner(func, *a, **kw))
        self.calls += 1
        keys = self.pending
        self.pending = None if keys is None else keys.then
        if keys is None:
            return run(q, k, v, heads, **kwargs)
        heads_first = bool(kwargs.get("skip_reshape"))
        q, k, v = (t if heads_first else split_heads(t, heads) for t in (q, k, v))
        self._check(keys, q, k, v, kwargs.get("mask"))
        image_only = keys.balance and keys.start == 0 and k.shape[2] == self.plan.num_tokens
        form = choose_form(self.kernel, q.shape[-1], image_only) if self.mass else PLAIN
        wants_heads = bool(kwargs.get("skip_output_reshape"))
        kwargs = kwargs | {"skip_reshape": True, "skip_output_reshape": True}
        try:
            out = self._attend(run, form, keys.start, q, k, v, heads, kwargs)
        except SpansCut:
            raise
        except Exception as error:  # the kernel refused the merged call: a form at the head it was handed
            self.refused = f"{type(error).__name__}: {error}"
            if form != CHANNEL:
                raise SpansCut(REFUSED) from error
            form = EQUAL_MASS if image_only else PLAIN
            try:
                out = self._attend(run, form, keys.start, q, k, v, heads, kwargs)
            except SpansCut:
                raise
            except Exception as again:
                raise SpansCut(REFUSED) from again
        self.form = form
        return out if wants_heads else join_heads(out)

    def _attend(self, run, form: str, start: int, q, k, v, heads: int, kwargs: dict) -> torch.Tensor:
        """The merged attention (B, H, L_q, e) of q / k / v (B, H, L, e) in `form`."""
        plan = self.plan.balanced() if form == EQUAL_MASS else self.plan
        k, v = merge_key_rows(k, plan, start), merge_key_rows(v, plan, start)
        if kwargs.get("mask") is not None:
            kwargs = kwargs | {"mask": merged_key_mask(kwargs["mask"], plan, start)}
        bias = key_bias(plan, start, k.shape[2], q) if form == CHANNEL else None
        width = q.shape[-1]
        if bias is not None:
            q, k, v = with_mass_channel(q, k, v, bias, kwargs.get("scale"))
        return run(q, k, v, heads, **kwargs)[..., :width]

    def _check(self, keys: Keys, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> None:
        """SpansCut unless q / k / v hold the block's queries and image keys where `keys` says."""
        n = self.plan.num_tokens
        if q.shape[2] != keys.queries or k.shape[2] < keys.start + n or v.shape[2] != k.shape[2]:
            raise SpansCut(layout_changed(
                f"self-attention of {q.shape[2]} queries and {k.shape[2]} keys, expected {keys.queries} queries and "
                f"the {n} image keys at {keys.start}"
            ))
        if mask is not None and (not torch.is_tensor(mask) or mask.shape[-1] != k.shape[2]):
            raise SpansCut(layout_changed(f"attention mask of shape {tuple(getattr(mask, 'shape', ()))} does not end in {k.shape[2]} keys"))


def merged_key_mask(mask: torch.Tensor, plan: MergePlan, start: int) -> torch.Tensor:
    """An attention mask (..., L_k) with its image key columns [start, start + N) replaced by their
    destinations' columns. A 2-d mask is (L_q, L_k) for every sample, as ComfyUI's attention
    functions read it (attention_pytorch), so it gains a batch axis first."""
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    return take_span(mask, mask.ndim - 1, start, plan)


def keys_values_options(
    options: dict | None, plan: MergePlan, keys: Keys, mass: bool, kernel: tuple | None = None,
) -> tuple[dict, KeysValuesOverride]:
    """A copy of a block's transformer_options whose first attention call merges the image keys and
    values with `plan`, and the override (its `calls` tell whether the attention was reached).
    kernel: (Kernel | None, name) of the call's kernel as the model call read it (CallContext.kernel),
    None to read it here (kernel_choice.run_kernel)."""
    options = dict(options or {})
    if kernel is None:
        kernel = run_kernel(options, plan.device.type if plan.device is not None else "cpu")
    kernel, name = kernel
    override = KeysValuesOverride(plan, keys, options.get(OVERRIDE), mass, kernel, name)
    options[OVERRIDE] = override
    return options, override


def run_with_merged_keys(
    call: Callable[[dict], R], options: dict | None, plan: MergePlan, keys: Keys, mass: bool,
    note: Callable[[str], None] | None = None, kernel: tuple | None = None,
) -> R | Unmerged:
    """call(options') with options' = `options` carrying the keys/values override: the block's result,
    the layout reason when its first attention call is not the expected self-attention (the block
    then runs again unmerged), or NOT_REACHED (NOT_HANDED when `options` are not the model call's)
    with the result when no attention call reached the override (the block ran exactly as unpatched:
    counted, not run twice), or the reason its override stepped aside for a sparse or radial attention
    (attention_interface.py `enter`) with the unmerged result. A plan that keeps every token merges nothing:
    NOTHING_TO_MERGE (the block runs as it is). kernel: as keys_values_options takes it. note("<kernel> as
    <form>") hears which kernel and form a merged call ran; a kernel that refused the merged call is warned
    about once per process."""
    if plan.num_kept == plan.num_tokens:
        return NOTHING_TO_MERGE
    patched, override = keys_values_options(options, plan, keys, mass, kernel)
    try:
        out = call(patched)
    except SpansCut as cut:
        _warn_refused(override)
        return cut.unmerged
    _warn_refused(override)
    if override.form is not None and note is not None:
        note(f"{override.kernel_name} as {override.form}")
    if override.calls:
        return out if override.aside is None else replace(override.aside, result=out)
    if isinstance(options, dict) and CALL_KEY in options:
        return replace(NOT_REACHED, result=out)
    _warn_not_handed()
    return replace(NOT_HANDED, result=out)


_WARNED: list[bool] = []
"""Whether NOT_HANDED was warned about in this process (once: the run line counts every block run)."""


def _warn_refused(override: KeysValuesOverride) -> None:
    if override.refused is None or compiling() or "refused" in _REFUSALS:
        return
    _REFUSALS.add("refused")
    log.warning(
        "ToMA scope keys_values: the attention kernel %s refused the merged keys and values (%s); ToMA ran those "
        "blocks %s, counted on the run line.", override.kernel_name, override.refused,
        f"as {override.form} (the head size unchanged)" if override.form else "unmerged",
    )


_REFUSALS: set[str] = set()
"""Whether a kernel's refusal was warned about in this process (once: the run line counts every block)."""


def _warn_not_handed() -> None:
    if _WARNED or compiling():
        return
    _WARNED.append(True)
    log.warning(
        "ToMA scope keys_values: the loop running the model's blocks does not pass them the model call's "
        "transformer_options (ComfyUI's loops do; another node's replacement loop may not), so ToMA cannot reach "
        "their attention: those blocks run unmerged, counted on the run line. scope block merges under such a "
        "loop (ToMA Patch (Advanced))."
    )
