"""The README's node tables are the nodes' schemas (nodes/node/readme_tables.py renders them), and its
Troubleshooting names no default by value, so neither can go stale when a default changes."""

from __future__ import annotations

import re

from harness.pack import PACK_ROOT, pack_module

README = PACK_ROOT / "README.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_readme_node_tables_are_the_schemas(comfy) -> None:
    tables = pack_module("nodes.node.readme_tables").readme_tables()
    assert tables in README.read_text(encoding="utf-8"), (
        "README '### ToMA Patch' / '### ToMA Patch (Advanced)' tables differ from the nodes: paste readme_tables.readme_tables()"
    )


def test_readme_tables_show_the_schema_defaults(comfy) -> None:
    """The rendering itself: each numeric input's row carries its schema default."""
    nodes = pack_module("nodes.node.toma_nodes")
    tables = pack_module("nodes.node.readme_tables").readme_tables()
    for node in nodes.NODES:
        for widget in node.define_schema().inputs:
            default = getattr(widget, "default", None)
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                assert f"| `{widget.id}` | {default:g} |" in tables, widget.id


def test_troubleshooting_names_no_default_by_value(comfy) -> None:
    """A default quoted as a number in Troubleshooting goes stale when the default moves: an input's
    mention followed in the same clause by its default value, or the word 'default' followed by a number."""
    nodes = pack_module("nodes.node.toma_nodes")
    section = _section(README.read_text(encoding="utf-8"), "## Troubleshooting")
    defaults = {
        w.id: f"{w.default:g}" for node in nodes.NODES for w in node.define_schema().inputs
        if isinstance(getattr(w, "default", None), (int, float)) and not isinstance(w.default, bool)
    }
    found = [m.group(0) for m in re.finditer(r"default[^.;:\n]{0,40}?\d", section)]
    for mention in re.finditer(r"`(\w+)`([^.;`\n]*)", section):
        value = defaults.get(mention.group(1))
        if value is not None and re.search(rf"(?<![\d.]){re.escape(value)}(?![\d.])", mention.group(2)):
            found.append(mention.group(0))
    assert not found, f"README Troubleshooting names defaults by value: {found}"
