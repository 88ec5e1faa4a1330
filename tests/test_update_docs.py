"""bench/publish/update_docs.py writes a generated section into the one docs/*.md file that holds its
marker heading, leaves the rest of that file as it was, and never writes a README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.publish import update_docs

MACHINE = {"cpu": "test cpu", "logical_cores": 2, "torch_threads": 1, "torch": "x", "python": "3", "device": "cpu"}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A run_all output folder with no sections (the section text is then intro, commands, machine)."""
    out = tmp_path / "out"
    out.mkdir()
    record = {"preset": "smoke", "command": "python -m bench.publish.run_all --smoke", "seconds": 3.0,
              "machine": MACHINE, "sections": {}}
    (out / "results.json").write_text(json.dumps(record))
    return out


def _run(results: Path, docs: Path, tmp_path: Path) -> None:
    update_docs.main(["--results", str(results), "--docs", str(docs), "--assets", str(tmp_path / "assets")])


def test_section_replaced_in_the_docs_file_that_holds_its_marker(results: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    bench_md = docs / "benchmarks.md"
    bench_md.write_text("# Benchmarks\n\nintro kept\n\n## Results\n\nold numbers\n\n## After\n\nkept too\n")
    (docs / "quality.md").write_text("# Quality\n\n## Quality\n\nold quality\n")
    _run(results, docs, tmp_path)
    text = bench_md.read_text()
    assert text.startswith("# Benchmarks\n\nintro kept\n\n## Results\n")
    assert "old numbers" not in text and text.endswith("## After\n\nkept too\n")
    assert "python -m bench.publish.run_all --smoke" in text and "test cpu" in text
    assert "[Quality](quality.md#quality)" in text
    assert (docs / "quality.md").read_text() == "# Quality\n\n## Quality\n\nold quality\n"


def test_readme_is_refused(results: Path, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Pack\n\n## Results\n\nold numbers\n")
    with pytest.raises(SystemExit, match="never into README.md"):
        _run(results, tmp_path, tmp_path)
    assert readme.read_text() == "# Pack\n\n## Results\n\nold numbers\n"
    with pytest.raises(SystemExit, match="never into README.md"):
        update_docs.write_section(readme, "## Results\n\nnew\n", update_docs.HEADING)
    assert readme.read_text() == "# Pack\n\n## Results\n\nold numbers\n"


@pytest.mark.parametrize("holders", [0, 2])
def test_marker_must_be_in_exactly_one_docs_file(results: Path, tmp_path: Path, holders: int) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "other.md").write_text("# Other\n\n### Results\n\nnot the marker: a deeper heading\n")
    for i in range(holders):
        (docs / f"doc{i}.md").write_text("## Results\n\nold\n")
    before = {p.name: p.read_text() for p in docs.iterdir()}
    with pytest.raises(SystemExit, match="'## Results' must be a heading line in exactly one"):
        _run(results, docs, tmp_path)
    assert {p.name: p.read_text() for p in docs.iterdir()} == before
