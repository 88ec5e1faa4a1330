"""The README's node tables ("### ToMA Patch", "### ToMA Patch (Advanced)"), rendered from the
nodes' schemas (toma_nodes.py), so the defaults, ranges, options and effects the README gives are
the ones the nodes have: one row per input, its Effect the input's tooltip. Checked by
tests/integration/test_readme_tables.py, as registry.readme_table() is for the models table.
"""

from __future__ import annotations

from ..settings import MIN_TOKENS_RANGE
from .toma_nodes import ToMAPatch, ToMAPatchAdvanced

HEADER = ["| Input | Default | Range | Effect |", "|---|---|---|---|"]
MODEL_RANGE = "see [Supported models](#supported-models-and-known-limits)"
TEXT_RANGES = {
    "blocks": "`auto`, `all` or a list",
    "min_tokens": f"`auto`, or {MIN_TOKENS_RANGE[0]} – {MIN_TOKENS_RANGE[1]}",
}
"""Range column of the text inputs, whose schema has no range (settings.py validates them)."""
ADVANCED_INTRO = "The inputs above, plus (saved workflows keep their values: new inputs were added last):"


def readme_tables() -> str:
    """The markdown of both node sections: heading, (intro,) table."""
    basic = ToMAPatch.define_schema().inputs
    advanced = ToMAPatchAdvanced.define_schema().inputs
    known = {i.id for i in basic}
    lines = ["### ToMA Patch", "", *HEADER, *(_row(i) for i in basic), "",
             "### ToMA Patch (Advanced)", "", ADVANCED_INTRO, "", *HEADER,
             *(_row(i) for i in advanced if i.id not in known)]
    return "\n".join(lines)


def _row(widget) -> str:
    """One table row of a schema input: name, default, range, tooltip."""
    cells = [f"`{widget.id}`", _default(widget), _range(widget), widget.tooltip]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _default(widget) -> str:
    value = getattr(widget, "default", None)
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _range(widget) -> str:
    options = getattr(widget, "options", None)
    if options:
        return ", ".join(f"`{o}`" for o in options)
    if isinstance(getattr(widget, "default", None), bool):
        return "on / off"
    if widget.id in TEXT_RANGES:
        return TEXT_RANGES[widget.id]
    if getattr(widget, "min", None) is None:
        return MODEL_RANGE
    step = getattr(widget, "step", None)
    span = f"{widget.min:g} – {widget.max:g}"
    return span if step in (None, 1) else f"{span}, step {step:g}"
