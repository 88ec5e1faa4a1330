"""README.md is the user's page and docs/ holds the rest: the README stays short, holds no generated
section, and every relative link of README.md and docs/*.md reaches a file (and a heading) that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 275
"""The user's page: what it does, what you get, install, quick start, nodes (ToMA Compare's table included), models, troubleshooting."""

GENERATED = {"## Results": "benchmarks.md", "## Quality": "quality.md"}
"""Headings of the sections the publish script rewrites, and the document that holds each."""

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


def test_readme_is_short_and_generated_sections_live_in_docs():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for heading, document in GENERATED.items():
        assert not re.search(rf"^{re.escape(heading)}\s*$", text, flags=re.M), f"{heading} belongs in docs/{document}"
        holders = [doc.name for doc in DOCS if re.search(rf"^{re.escape(heading)}\s*$", doc.read_text(encoding="utf-8"), flags=re.M)]
        assert holders == [document], f"the publish script writes {heading} into the one docs file holding it: {holders}"


def test_readme_answers_should_i_first_and_keeps_the_tables_in_docs():
    """Right after the picture the README says whether to use ToMA; the predicted speed-up tables live in
    docs/what_you_get.md, the README keeps their generated one-row summary."""
    text = README.read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Should you use it?"
    start, end = text.index("<!-- what-you-get summary: start -->"), text.index("<!-- what-you-get summary: end -->")
    assert text.count("\n| ", start, end) == 0 and "x" in text[start:end]
    assert "<!-- what-you-get: start -->" in (ROOT / "docs" / "what_you_get.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            broken.append(target)
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_every_document_is_reachable_from_the_readme():
    reached, todo = set(), [README.resolve()]
    while todo:
        page = todo.pop()
        for target in links(page):
            destination = (page.parent / target.partition("#")[0]).resolve()
            if destination.suffix == ".md" and destination.is_file() and destination not in reached:
                reached.add(destination)
                todo.append(destination)
    assert not [doc.name for doc in DOCS if doc.resolve() not in reached]


PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdifgrx]|\{[^{}]*\}")
"""Where a logging (%s) or str.format ({}) message puts a value."""
COMFYUI_QUOTES = ("IMPORT FAILED",)
"""Troubleshooting also quotes ComfyUI's own start-up lines (its nodes.py prints them), not the pack's."""


def message_pieces() -> set[str]:
    """The literal text of every string the pack's code can build a message from (nodes/), cut
    where a value goes in: an f-string's fields, %s and {} placeholders. Docstrings left out."""
    pieces: set[str] = set()
    for path in (ROOT / "nodes").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = PLACEHOLDER.sub("\0", node.value)
            else:
                continue
            pieces.update(text.split("\0"))
    return pieces - {""}


def written_by_the_code(fragment: str, pieces: set[str]) -> bool:
    """Whether `fragment` is text a message can hold: the end of one piece, then whole pieces, then
    the start of one, joined only where the code puts a value (or the fragment lies inside one piece)."""
    starts = {0}
    for start in range(len(fragment)):
        if start not in starts:
            continue
        rest = fragment[start:]
        if any((p.startswith(rest) if start else rest in p) for p in pieces):
            return True
        for piece in pieces:
            if start == 0:
                starts.update(len(piece) - k for k in range(1, len(piece)) if rest.startswith(piece[k:]))
            if rest.startswith(piece):
                starts.add(start + len(piece))
    return False


def troubleshooting_quotes() -> list[str]:
    """The pack's messages Troubleshooting quotes: `code` with '...' where the message has a value."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Troubleshooting"):]
    section = section[: section.find("\n## ", 1)]
    quotes = re.findall(r"`([^`]+)`", section)
    return [q for q in quotes if "..." in q and not any(name in q for name in COMFYUI_QUOTES)]


def test_troubleshooting_quotes_messages_the_pack_has():
    pieces = message_pieces()
    quotes = troubleshooting_quotes()
    assert len(quotes) >= 5, quotes
    unknown = [q for q in quotes if not all(written_by_the_code(f, pieces) for f in q.split("...") if f)]
    assert not unknown, f"Troubleshooting quotes messages no code in nodes/ writes: {unknown}"
