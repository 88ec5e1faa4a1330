"""What the Advanced node refuses when a prompt is queued, before any model loads (the node's
`validate_inputs`, ComfyUI's check of a queued prompt): the checks that need no model, with the
messages they give when the node runs. `min_tokens` is checked whole (settings.parse_min_tokens);
`blocks` for its grammar (machinery/block_lists.py) against the groups of every family, since the
family is known only once the model is; the family's parser then refuses a group this model does
not have, or a range past its blocks, naming this model's groups. Pure Python.
"""

from __future__ import annotations

from ..families.registry import block_groups, blocks_examples
from ..machinery.block_lists import block_items
from ..settings import AUTO, check_blocks_text, parse_min_tokens

QUEUED_MENU = f"the groups depend on the model, e.g. {blocks_examples()}"
"""What a `blocks` list may name, while the model (and so its groups) is not known yet."""


def queued_input_errors(blocks: object, min_tokens: object) -> list[str]:
    """The messages of the inputs ToMA refuses whatever the model (none: the prompt may run). An
    input linked from another node arrives as None: its value exists only when the node runs,
    which checks it then."""
    errors = []
    for check, value in ((check_blocks, blocks), (parse_min_tokens, min_tokens)):
        if value is None:
            continue
        try:
            check(value)
        except ValueError as error:
            errors.append(str(error))
    return errors


def check_blocks(value: object) -> None:
    """ValueError for a `blocks` text no family accepts: not a string, blank, or a list outside
    the grammar or naming a group no family has."""
    check_blocks_text(value)
    if value.strip().lower() not in (AUTO, "all"):
        block_items(value, block_groups(), QUEUED_MENU)
