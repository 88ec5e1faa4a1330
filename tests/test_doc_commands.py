"""Every `python -m bench...` command quoted in README.md and docs/*.md parses: each is run in one
child process up to its argument parser (ArgumentParser.parse_args parses the quoted arguments,
sub-command included, then the run stops before the work), so a CLI change that breaks a quoted
command fails here. `--help` would not do: argparse prints a sub-command's help and exits 0 even
when an option before it is unknown there (`realsize measure --device cuda`).

A command whose script has left the tree is historical: the doc must say where it still lives,
`git show <commit>:bench/<group>/<script>.py` in the same doc, and then it is listed, not run
(`test_historical_commands_name_their_commit`); one without that mark fails."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"python3? -m (bench(?:\.\w+)+)(.*)")
INLINE = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"<[^>]+>")
HISTORICAL = re.compile(r"git show ([0-9a-f]{7,40}):(bench/[\w/]+\.py)")
"""Where a doc says a script that left the tree still lives: `git show <commit>:<path>`."""
PARSED = 0
"""The child's exit code for a command whose arguments parsed."""

CHILD = r"""
import argparse, json, runpy, sys, warnings

warnings.filterwarnings("ignore", "'bench", RuntimeWarning)

class Parsed(Exception):
    pass

def parse_then_stop(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed

parse_args = argparse.ArgumentParser.parse_args
argparse.ArgumentParser.parse_args = parse_then_stop
results, out = [], sys.argv[1]
for module, argv in json.load(sys.stdin):
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        results.append("ran without parsing its arguments")
    except Parsed:
        results.append("")
    except SystemExit as stop:
        results.append("" if stop.code in (0, None) else f"exit {stop.code}")
    except Exception as error:
        results.append(f"{type(error).__name__}: {error}")
with open(out, "w") as f:
    json.dump(results, f)
"""


def code_texts(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each line of a fenced block and each inline code span (which may run
    over several lines) of a markdown text."""
    found, outside = [], []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            outside.append("")
        elif fenced:
            found.append((number, line))
            outside.append("")
        else:
            outside.append(line)
    prose = "\n".join(outside)
    for span in INLINE.finditer(prose):
        found.append((prose.count("\n", 0, span.start()) + 1, span.group(1).replace("\n", " ")))
    return found


def quoted_commands() -> list[tuple[str, str, list[str]]]:
    """(where, module, argv) of every quoted command; placeholders such as <folder> become a path,
    a trailing shell comment is dropped, `bench.<group>.<script>` (a pattern, not a command) is left out."""
    found = []
    for doc in DOCS:
        for number, code in code_texts(doc.read_text(encoding="utf-8")):
            for match in COMMAND.finditer(code):
                tail = PLACEHOLDER.sub("/tmp/toma-doc-command", match.group(2).split(" #")[0])
                found.append((f"{doc.relative_to(ROOT)}:{number}", match.group(1), shlex.split(tail)))
    return found


def script_path(module: str) -> str:
    """bench.tokens.stability -> bench/tokens/stability.py."""
    return module.replace(".", "/") + ".py"


def historical_marks() -> dict[str, set[tuple[str, str]]]:
    """Per doc (as `where` names it), the (commit, path) of every `git show <commit>:<path>` it quotes."""
    return {str(doc.relative_to(ROOT)): set(HISTORICAL.findall(doc.read_text(encoding="utf-8"))) for doc in DOCS}


def split_commands() -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, str, str]], list[str]]:
    """(commands to run, (where, module, commit) of historical ones, failures: a command whose
    script is not in the tree and that its doc does not mark historical)."""
    marks = historical_marks()
    current, historical, unmarked = [], [], []
    for where, module, argv in quoted_commands():
        path = script_path(module)
        if (ROOT / path).is_file():
            current.append((where, module, argv))
            continue
        commits = [commit for commit, marked in marks[where.split(":")[0]] if marked == path]
        if commits:
            historical.append((where, module, commits[0]))
        else:
            unmarked.append(f"{where}: python -m {module}: {path} is not in the tree and the doc quotes no "
                            f"`git show <commit>:{path}`")
    return current, historical, unmarked


def test_docs_quote_commands() -> None:
    assert len(quoted_commands()) > 20


def test_a_command_of_a_removed_script_is_marked_historical() -> None:
    _, _, unmarked = split_commands()
    assert not unmarked, "\n".join(unmarked)


def test_historical_commands_name_their_commit() -> None:
    """Each `git show <commit>:<path>` a doc quotes resolves in this checkout's history."""
    marks = sorted({mark for found in historical_marks().values() for mark in found})
    if not marks:
        pytest.skip("no doc quotes a historical script")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True,
                             check=False)
    if shallow.returncode or shallow.stdout.strip() != "false":
        pytest.skip("not a git checkout with its whole history: the commits cannot be looked up")
    missing = [f"{commit}:{path}" for commit, path in marks
               if subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True,
                                 check=False).returncode]
    assert not missing, f"quoted `git show` targets that this history lacks: {missing}"


def test_every_quoted_command_parses(tmp_path: Path) -> None:
    commands, _, _ = split_commands()
    results = tmp_path / "results.json"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(results)], input=json.dumps([[m, a] for _, m, a in commands]),
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert child.returncode == PARSED, child.stderr[-3000:]
    failures = [f"{where}: python -m {module} {' '.join(argv)} -> {result}"
                for (where, module, argv), result in zip(commands, json.loads(results.read_text())) if result]
    assert not failures, "quoted commands that do not parse:\n" + "\n".join(failures) + "\n" + child.stderr[-3000:]
