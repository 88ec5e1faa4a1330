"""How a family's hooks get onto a ModelPatcher clone (what they run: runner.py).

Two mechanisms, one per kind of host:
- `patches_replace["dit"]` keys (Flux, Chroma, Qwen-Image, SD3, HunyuanVideo): `install_dit_hooks`
  puts one function per selected ("<group>_block", i) key. Another pack's replacement already on
  a key stays outermost and ToMA merges only around the real block (`extra["original_block"]`, as
  comfy.ldm.flux.model.Flux.forward_orig hands it).
- object patches of a block's `forward` (Lumina2, HiDream, the UNet's BasicTransformerBlocks: no
  replace key): `install_forward_patches` through `ModelPatcher.add_object_patch`, applied when
  the model loads and restored when another clone loads, so other clones stay bit-identical.

Every ToMA patch function carries TOMA_MARK (and the function it wrapped, `toma_foreign`), so
re-applying ToMA replaces its earlier hooks, never stacks on them.
"""

from __future__ import annotations

from collections.abc import Callable

from .dit_blocks import DitBlocks

MergedBlock = Callable[[dict, dict, Callable[[dict], dict]], dict]
"""(args, extra, block) -> block output: a family's merged run of one dit block."""

TOMA_MARK = "toma_patch"
"""Attribute of every ToMA patch function: what it patches (a module path, or "attention" for the
UNet's attention patches), so re-applying replaces them."""


def mark(fn: Callable, what: str) -> Callable:
    """`fn` marked as a ToMA patch of `what` (see TOMA_MARK)."""
    setattr(fn, TOMA_MARK, what)
    return fn


def is_toma(fn) -> bool:
    """Whether `fn` is one of ToMA's patch functions."""
    return getattr(fn, TOMA_MARK, None) is not None


def install_dit_hooks(model, sizes: dict[str, int], blocks: DitBlocks, merged: dict[str, MergedBlock]) -> None:
    """Put ToMA on the ("<group>_block", i) dit replace keys that `blocks` selects (sizes: blocks
    per group); earlier ToMA hooks on unselected keys give way to what they wrapped."""
    dit = _dit_patches(model)
    for group, count in sizes.items():
        for index in range(count):
            key = (f"{group}_block", index)
            foreign = _foreign(dit.get(key))
            if blocks.selects(group, index):
                dit[key] = make_dit_hook(merged[group], group, foreign)
            elif foreign is not None:
                dit[key] = foreign
            else:
                dit.pop(key, None)


def _dit_patches(model) -> dict:
    """model_options["transformer_options"]["patches_replace"]["dit"] of the clone, copied so the
    dicts it shares with the model it was cloned from are never modified."""
    options = model.model_options.setdefault("transformer_options", {})
    replace = dict(options.get("patches_replace", {}))
    replace["dit"] = dict(replace.get("dit", {}))
    options["patches_replace"] = replace
    return replace["dit"]


def _foreign(entry):
    """The non-ToMA function under a key: an earlier ToMA hook is unwrapped to what it wrapped."""
    return getattr(entry, "toma_foreign", entry) if entry is not None else None


def make_dit_hook(merged_block: MergedBlock, group: str, foreign=None):
    """A dit replace function running `merged_block` around the real block.

    foreign: another pack's replacement already on this key; it stays outermost and its
    `original_block` becomes the ToMA-merged real block.
    """

    def toma_block(args: dict, extra: dict) -> dict:
        original = extra["original_block"]
        if foreign is None:
            return merged_block(args, extra, original)
        inner = dict(extra, original_block=lambda a: merged_block(a, extra, original))
        return foreign(args, inner)

    toma_block.toma_foreign = foreign
    toma_block.toma_group = group
    return toma_block


def forward_patch_key(path: str) -> str:
    """The object-patch key of the forward of the diffusion model's submodule at `path`."""
    return f"diffusion_model.{path}.forward"


def install_forward_patches(model, paths: dict[str, bool], make_forward: Callable[[str, Callable | None], Callable]) -> None:
    """Object-patch `diffusion_model.<path>.forward` for every path selected in `paths` (path ->
    selected). make_forward(path, foreign) builds the patch; foreign is another pack's object
    patch already there (it then runs in place of the class's forward). Earlier ToMA patches are
    removed first, restoring what they wrapped."""
    for path, selected in paths.items():
        key = forward_patch_key(path)
        entry = model.object_patches.get(key)
        foreign = getattr(entry, "toma_foreign", None) if is_toma(entry) else entry
        if selected:
            patch = mark(make_forward(path, foreign), path)
            patch.toma_foreign = foreign
            model.add_object_patch(key, patch)
        elif foreign is not None:
            model.object_patches[key] = foreign
        elif entry is not None:
            del model.object_patches[key]


def module_forward(module, foreign: Callable | None) -> Callable:
    """What a forward patch calls for the real block: another pack's patch, else the class's own
    forward bound to `module` (so patches inside the block, e.g. attention overrides, still run)."""
    if foreign is not None:
        return foreign
    return lambda *args, **kwargs: type(module).forward(module, *args, **kwargs)
