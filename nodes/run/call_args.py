"""BaseModel.apply_model's arguments as an APPLY_MODEL wrapper receives them: (x, t, c_concat,
c_crossattn, control, transformer_options, **extra conds), transformer_options positional
(comfy.model_base.BaseModel.apply_model) or a keyword."""

from __future__ import annotations

from collections.abc import Callable

OPTIONS_INDEX = 5
"""Position of transformer_options among apply_model's arguments."""


def transformer_options_of(args: list, kwargs: dict) -> tuple[dict | None, Callable[[dict], None]]:
    """The call's transformer_options (None when it has none) and a function that puts a
    replacement in its place (in `args`, a list, or `kwargs`)."""
    if "transformer_options" in kwargs:
        return kwargs["transformer_options"], lambda new: kwargs.__setitem__("transformer_options", new)
    if len(args) > OPTIONS_INDEX:
        return args[OPTIONS_INDEX], lambda new: args.__setitem__(OPTIONS_INDEX, new)
    return None, lambda new: kwargs.__setitem__("transformer_options", new)
