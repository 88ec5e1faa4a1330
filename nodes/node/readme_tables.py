"""The README's node tables ("### ToMA Patch", "### ToMA Patch (Advanced)", "### ToMA Compare"), rendered
from the nodes' schemas (toma_nodes.py, compare.py), so the defaults, ranges, options and effects the
README gives are the ones the nodes have: one row per input (ToMA Compare: per socket a user wires
differently from KSampler's), its Effect the tooltip. Checked by tests/integration/test_readme_tables.py,
as registry.readme_table() is for the models table.
"""

from __future__ import annotations

from ..settings import MIN_TOKENS_RANGE
from .compare import ToMACompare
from .toma_nodes import ToMAPatch, ToMAPatchAdvanced

HEADER = ["| Input | Default | Range | Effect |", "|---|---|---|---|"]
MODEL_RANGE = "see [Supported models](#supported-models-and-known-limits)"
TEXT_RANGES = {
    "blocks": "`auto`, `all` or a list",
    "min_tokens": f"`auto`, or {MIN_TOKENS_RANGE[0]} – {MIN_TOKENS_RANGE[1]}",
}
"""Range column of the text inputs, whose schema has no range (settings.py validates them)."""
ADVANCED_INTRO = "The inputs above, plus (saved workflows keep their values: new inputs were added last):"
COMPARE_HEADER = ["| Input / output | Effect |", "|---|---|"]
COMPARE_ROWS = ("model", "toma_model", "step_cache_model", "vae", "steps", "comparison", "report")
"""The sockets the README's ToMA Compare table describes; the others are KSampler's, COMPARE_OWN or a run's images."""
COMPARE_OWN = ("repeats",)
"""ToMA Compare's own widgets beyond KSampler's, described in the text under its table."""
COMPARE_TEMPLATE = "Flux.1 Dev - compare ToMA with fewer steps"
"""The comparison template's name in ComfyUI's template browser (example_workflows/<it>.json)."""


def readme_tables() -> str:
    """The markdown of the three node sections: heading, (intro,) table (ToMA Compare: its text after)."""
    basic = ToMAPatch.define_schema().inputs
    advanced = ToMAPatchAdvanced.define_schema().inputs
    known = {i.id for i in basic}
    lines = ["### ToMA Patch", "", *HEADER, *(_row(i) for i in basic), "",
             "### ToMA Patch (Advanced)", "", ADVANCED_INTRO, "", *HEADER,
             *(_row(i) for i in advanced if i.id not in known), "", *_compare_section()]
    return "\n".join(lines)


def _compare_section() -> list[str]:
    """ToMA Compare: a row per COMPARE_ROWS socket (its tooltip), then a line naming the others."""
    schema = ToMACompare.define_schema()
    sockets = [(i.id, "", i.tooltip) for i in schema.inputs] + [(o.id, " (output)", o.tooltip) for o in schema.outputs]
    rows = [f"| `{name}`{kind} | {tooltip} |" for name, kind, tooltip in sockets if name in COMPARE_ROWS]
    shared = ", ".join(f"`{i.id}`" for i in schema.inputs if i.id not in COMPARE_ROWS + COMPARE_OWN)
    own = " ".join(f"`{i.id}`: {i.tooltip}" for i in schema.inputs if i.id in COMPARE_OWN)
    images = ", ".join(f"`{o.id}`" for o in schema.outputs if o.id not in COMPARE_ROWS)
    others = (f"{schema.description} {own} The other inputs ({shared}) are KSampler's, the same for every run; the outputs "
              f"{images} are each run's decoded images (video frames). Template: *{COMPARE_TEMPLATE}*.")
    return ["### ToMA Compare", "", *COMPARE_HEADER, *rows, "", others]


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
