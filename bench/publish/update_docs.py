"""Write the generated "## Results" section from a bench/publish/run_all.py output folder, or the
"## Quality" section from a bench/quality/quality.py output folder, into the docs/*.md file that
holds the section's heading.

    python -m bench.publish.update_docs                       # reads bench/out/results.json
    python -m bench.publish.update_docs --quality bench/out/quality   # reads quality.md and its figures
    python -m bench.publish.update_docs --scope bench/out/scope       # bench/quality/scope_report.py's output

The heading line is the section's marker: the text from it to the next "## " heading (or the end of
the file) is replaced, the rest of the file is left untouched. Exactly one docs/*.md file must hold
the marker; README.md is never written (it is the user's page, not a place for generated tables).
Copies the run's plots to assets/results/ (assets/quality/) and links them relative to the docs
file. Every number in the section comes from the run's output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from . import run_all

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

HEADING = "## Results"
QUALITY_HEADING = "## Quality"
SCOPE_HEADINGS = {"scope.md": "## Every method at its real-size speed",
                  "scope_video.md": "## Every method at its real-size speed (Wan)"}
"""The scope study's sections (bench/quality/scope_report.py): image fixtures, and the Wan fixture."""
"""The generated sections' markers: each is a heading line in one docs/*.md file."""

REFUSED = "README.md"
"""The file generated sections are never written into, wherever the search looks."""

QUALITY_INTRO = """\
Image quality is measured on small models **trained** here on natural-image crops (ComfyUI's own Flux,
SDXL and SD1.5 classes; fixtures/README.md says how they were made), sampled through ComfyUI's sampler with
the nodes wired as a user wires them, against the unpatched model at the same seed and step count.
Each ToMA row is compared with what a user can do instead at the same time saving: **fewer steps**
(and the core EasyCache / LazyCache nodes). These fixtures are tiny (about 1,000 image tokens), so
the speed-ups are smaller than on Flux.1 / SDXL at 1024 px (see Results); the quality comparison at
equal speed-up is what this section is for. The SD1.5 fixture (32 px, 1.5M parameters, 30 ms a step)
is too small for any token merging to save time (ToMA and ComfyUI's ToMe both run at about 1.0x
there): read its rows for quality, and ComfyUI's ToMe beside ToMA. This section is written from the run's quality.md by
`bench/publish/update_docs.py --quality`."""

INTRO = """\
Every number below was printed by `bench/publish/run_all.py` in one run, on the machine named under it, and
this section was written from that run's `results.json` by `bench/publish/update_docs.py`. Models are
ComfyUI's own Flux and SDXL classes at reduced width/depth on CPU (keeping the real models'
tokens-to-width balance at 1024x1024; see bench/speed/bench_flux.py and bench/speed/bench_sdxl.py), with **random weights**: the
speed-ups are what the merge buys on those shapes; the relative errors compare ratios and methods on
a pure-noise latent (the first sampling step), where neighbouring tokens are less alike than in a
trained model on a real image, so they are not a measure of image quality: these tables are speed
evidence; image quality on trained models is in [Quality]({quality_link}). Token-level fidelity on
natural images is the last table."""

NOISE = """\
**Timings are noisy**: the CPU run shared {cores} cores with other processes (load average at start
and end below). Every configuration was timed in the same process, in turns, against the unpatched
model of the same run, so load changes hit all of them alike, but single speed-ups can still move
between runs. The relative errors are deterministic (seeded weights and inputs)."""


def section_text(results: dict, image_dir: str, quality_link: str = "#quality") -> str:
    """The Results section: intro, commands, machine, then run_all's tables and plots."""
    machine = results["machine"]
    lines = [HEADING, "", INTRO.format(quality_link=quality_link), ""]
    if machine["device"] == "cpu":
        lines += [NOISE.format(cores=machine["logical_cores"]), ""]
    lines += ["Commands (from the repository root; the first one took "
              f"{results['seconds']:.0f} s here):", "", "```bash",
              f"COMFYUI_PATH=/path/to/ComfyUI {results['command']}",
              "python -m bench.publish.update_docs          # this section, from bench/out/results.json",
              "```", "",
              f"Machine: {run_all.machine_line(machine)}.", ""]
    if machine["device"] == "cpu":
        lines += ["`python -m bench.publish.run_all --device cuda` runs Flux.1 / SDXL sizes (bf16 / fp16) on a GPU; "
                  "it has not been run for this section, so no GPU numbers are quoted.", ""]
    body = run_all.render_markdown(results, image_dir=image_dir, heading="##", header=False)
    return "\n".join(lines) + "\n" + body.rstrip() + "\n"


def _section_pattern(heading: str) -> re.Pattern[str]:
    """The marker line `heading` and everything after it up to the next "## " heading or the end."""
    return re.compile(rf"^{re.escape(heading)}[ \t]*\n.*?(?=^## |\Z)", flags=re.S | re.M)


def holds_marker(text: str, heading: str) -> bool:
    """True when `text` has the marker line `heading`."""
    return _section_pattern(heading).search(text) is not None


def find_doc(docs: Path, heading: str) -> Path:
    """The one ``docs/*.md`` file whose lines include the marker `heading`.

    Raises SystemExit naming the marker when no file or several hold it, or when the holder is a
    README.md (generated sections live in docs/, never in the README)."""
    holders = [p for p in sorted(docs.glob("*.md")) if holds_marker(p.read_text(encoding="utf-8"), heading)]
    refused = [p for p in holders if p.name == REFUSED]
    if refused:
        raise SystemExit(f"refusing to write {refused[0]}: generated sections go into docs/*.md, never into "
                         f"{REFUSED}; move its '{heading}' section into a docs/ file")
    if len(holders) != 1:
        found = ", ".join(str(p) for p in holders) or "none"
        raise SystemExit(f"the marker '{heading}' must be a heading line in exactly one {docs}/*.md file "
                         f"(found: {found}); add it where the generated section belongs")
    return holders[0]


def replace_section(text: str, section: str, heading: str = HEADING) -> str:
    """`text` with the section under the marker `heading` replaced by `section`."""
    match = _section_pattern(heading).search(text)
    if match is None:
        raise ValueError(f"no '{heading}' heading line to replace")
    return text[: match.start()] + section + "\n" + text[match.end():]


def write_section(doc: Path, section: str, heading: str) -> None:
    """Replace the section under `heading` in `doc`, a docs file (never a README.md)."""
    if doc.name == REFUSED:
        raise SystemExit(f"refusing to write {doc}: generated sections go into docs/*.md, never into {REFUSED}")
    doc.write_text(replace_section(doc.read_text(encoding="utf-8"), section, heading), encoding="utf-8")


def link(target: Path, doc: Path) -> str:
    """`target` as a markdown link path relative to the folder of `doc`."""
    return Path(os.path.relpath(target, doc.parent)).as_posix()


def quality_link(docs: Path, doc: Path) -> str:
    """The link from `doc` to the Quality section: an anchor when it is in the same file."""
    holders = [p for p in sorted(docs.glob("*.md")) if holds_marker(p.read_text(encoding="utf-8"), QUALITY_HEADING)]
    if not holders or holders[0] == doc:
        return "#quality"
    return f"{link(holders[0], doc)}#quality"


def quality_section(src: Path, image_dir: str) -> str:
    """The Quality section: intro, the command, then quality.md one heading level down, each
    family's Pareto plot and image grid after its tables."""
    meta = json.loads((src / "quality.json").read_text())
    runs = meta["command"].split("; ")  # several when the folder was made by quality.py --combine
    lines = [QUALITY_HEADING, "", QUALITY_INTRO, "", "```bash",
             *(f"COMFYUI_PATH=/path/to/ComfyUI {command}" for command in runs)]
    if len(runs) > 1:
        lines.append("python -m bench.quality.quality --combine <the --out folders above> --out bench/out/quality")
    lines += ["python -m bench.publish.update_docs --quality bench/out/quality   # this section", "```", ""]
    body = (src / "quality.md").read_text().split("\n## ")
    lines.append(body[0].split("\n", 1)[1].strip())  # the setup line, without quality.md's own title
    for chunk in body[1:]:
        name = chunk.split("\n", 1)[0].strip()
        lines += ["", f"### {chunk.strip()}", ""]
        for kind, stem in (("PSNR against speed-up", "pareto"), ("images", "grid")):
            if (src / f"{stem}_{name}.png").is_file():
                lines += [f"![{name}: {kind}]({image_dir}/{stem}_{name}.png)", ""]
    return "\n".join(lines).rstrip() + "\n"


SCOPE_INTRO = """\
Everything a user can do instead of (or with) ToMA, on the trained fixtures, each at the end-to-end
speed-up it is **predicted** to give on the real model the fixture stands for (never the fixture's
CPU clock): the keys/values scope (ratios 0.5 / 0.75 / 0.9, tile 4 and 8, from step 0 and from 40 %,
with and without the log-mass weight `key_mass`, which has no node input: the bench sets it), the
block merge (the node defaults; ratio 0.25 / 0.5 / 0.75 from step 0 and from 40 %), fewer steps,
the step caches (ComfyUI's EasyCache and LazyCache on ComfyUI 0.33; TeaCache and MagCache, the real
packs, run on ComfyUI 0.3.64 only: on 0.33 they fail to import), and the stack (keys/values + a
cache). Every ToMA row merges `blocks` auto with min_tokens 0. The fixtures are tiny and not
step-distilled: their 4- and 8-step runs stand for the per-step behaviour of a few-step model, and
"fewer steps" there is a baseline a distilled model does not have. This section is written from
scope_report.py's output by `bench/publish/update_docs.py --scope`."""


def scope_section(heading: str, body: str, image_dir: str, commands: list[str]) -> str:
    """A scope-study section: the heading, intro, commands, then the report with its figure links
    pointing at `image_dir`."""
    lines = [heading, "", SCOPE_INTRO, "", "```bash", *commands, "```", "",
             body.replace("](methods_", f"]({image_dir}/methods_")]
    return "\n".join(lines).rstrip() + "\n"


def write_scope(src: Path, docs: Path, assets: Path) -> list[str]:
    """Both scope sections from scope_report.py's --out folder; returns what was written."""
    done = []
    copied = copy_quality_figures(src, assets, "methods_*.png")
    for name, heading in SCOPE_HEADINGS.items():
        if not (src / name).is_file():
            continue
        doc = find_doc(docs, heading)
        commands = [f"python -m bench.publish.update_docs --scope {src}   # these sections, from the report below"]
        write_section(doc, scope_section(heading, (src / name).read_text(), link(assets, doc), commands), heading)
        done.append(f"{doc} ({heading})")
    return done + [str(c) for c in copied]


def copy_quality_figures(src: Path, dst: Path, pattern: str = "*.png") -> list[Path]:
    return copy_files(sorted(src.glob(pattern)), dst)


def copy_files(files: list[Path], dst: Path) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(f, dst / f.name)) for f in files]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(BENCH / "out"), help="run_all.py output folder")
    p.add_argument("--docs", type=Path, default=ROOT / "docs", help="folder whose *.md files hold the markers")
    p.add_argument("--assets", type=Path, help="folder the figures are copied to (default assets/results/, "
                   "with --quality assets/quality/)")
    p.add_argument("--quality", help="bench/quality/quality.py output folder: write the Quality section instead")
    p.add_argument("--scope", help="bench/quality/scope_report.py output folder: write the scope study's sections instead")
    args = p.parse_args(argv)
    assets = args.assets or ROOT / "assets" / ("quality" if args.quality or args.scope else "results")
    if args.scope:
        print("updated " + ", ".join(write_scope(Path(args.scope), args.docs, assets)))
        return 0
    if args.quality:
        doc = find_doc(args.docs, QUALITY_HEADING)
        src = Path(args.quality)
        copied = copy_quality_figures(src, assets)
        write_section(doc, quality_section(src, link(assets, doc)), QUALITY_HEADING)
        print(f"updated {doc} ({QUALITY_HEADING}); figures: {', '.join(str(c) for c in copied) or 'none'}")
        return 0
    doc = find_doc(args.docs, HEADING)
    src = Path(args.results)
    results = json.loads((src / "results.json").read_text())
    copied = copy_files([src / s["plot"] for s in results["sections"].values() if s.get("plot_written")], assets)
    write_section(doc, section_text(results, link(assets, doc), quality_link(args.docs, doc)), HEADING)
    print(f"updated {doc} ({HEADING}); plots: {', '.join(str(c) for c in copied) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
