"""How scope keys_values recognises sparse and radial attention in a call's attention chain
(nodes/machinery/foreign_attention.py): by the function's qualified name and, for ComfyUI's Model
Sparse Attention, the last name of its module, which ComfyUI derives from the file's path; and, where
the sparse node's own tests cannot be read, by its published contract. The behaviour in real ComfyUI
code: tests/integration/test_sparse_radial.py."""

from __future__ import annotations

import types

import pytest
import torch

from harness.pack import pack_module

foreign = pack_module("nodes.machinery.foreign_attention")

FACTORY = '''
def make_attention_override(patch, previous):
    def override(func, q, k, v, heads, **kwargs):
        return previous(func, q, k, v, heads, **kwargs)
    return override
'''


def module(name: str) -> types.ModuleType:
    """A module named `name` holding a `make_attention_override` as the sparse node's source has it."""
    mod = types.ModuleType(name)
    exec(compile(FACTORY, name, "exec"), mod.__dict__)
    return mod


@pytest.mark.parametrize("name", [
    "comfy_extras.nodes_sparse_attention", "/home/u/ComfyUI/comfy_extras/nodes_sparse_attention", r"C:\ComfyUI\comfy_extras\nodes_sparse_attention",
])
def test_sparse_override_is_known_by_module_and_qualname(name: str) -> None:
    assert foreign.is_sparse_override(module(name).make_attention_override(None, None))


def test_another_modules_override_is_not_the_sparse_one() -> None:
    assert not foreign.is_sparse_override(module("some_pack.nodes").make_attention_override(None, None))
    assert not foreign.is_sparse_override(lambda func, *a, **kw: func(*a, **kw))


def test_chain_follows_inner_attributes_and_previous_closures() -> None:
    """ToMA-like `inner` attribute -> a pack override with `inner` -> the sparse override -> its
    `previous` closure variable: every link is followed, and the walk stops on a cycle's bound."""
    last = lambda func, *a, **kw: func(*a, **kw)  # noqa: E731
    sparse = module("comfy_extras.nodes_sparse_attention").make_attention_override(None, last)
    pack = types.SimpleNamespace(inner=sparse)
    top = types.SimpleNamespace(inner=pack)
    assert list(foreign.chain(top)) == [top, pack, sparse, last]
    loop = types.SimpleNamespace()
    loop.inner = loop
    assert len(list(foreign.chain(loop))) == 16


def heads_first(tokens: int, head: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(1, 1, tokens, head) for _ in range(3))


@pytest.mark.parametrize(("tokens", "head", "mask", "runs"), [
    (12288, 128, None, True), (12287, 128, None, False), (12288, 64, None, False), (12288, 128, torch.zeros(1), False),
])
def test_sparse_contract_without_the_nodes_own_tests(tokens: int, head: int, mask, runs: bool) -> None:
    """A sparse override whose patch and `_ineligible` cannot be read: sparse for head 128, q / k / v
    of one shape, >= 12,288 tokens and no mask; ToMA steps aside exactly then."""
    sparse = module("comfy_extras.nodes_sparse_attention").make_attention_override(None, None)
    q, k, v = heads_first(tokens, head)
    kwargs = {"skip_reshape": True, "mask": mask}
    assert foreign.sparse_would_run(sparse, q, k, v, 1, kwargs) is runs
    reason = foreign.step_aside_reason(lambda *a, **kw: None, types.SimpleNamespace(inner=sparse), q, k, v, 1, kwargs)
    assert reason == (foreign.SPARSE_ASIDE if runs else None)


def get_radial_attn_func():
    """As ComfyUI-RadialAttn's nodes.py names its kernel factory and kernel."""

    def radial_attn_func(q, k, v, heads, **kwargs):
        return q

    return radial_attn_func


def test_radial_kernel_is_known_by_qualname() -> None:
    q, k, v = heads_first(8, 16)
    assert foreign.step_aside_reason(get_radial_attn_func(), None, q, k, v, 1, {}) == foreign.RADIAL_ASIDE
    assert foreign.step_aside_reason(lambda *a, **kw: None, None, q, k, v, 1, {}) is None
