"""Write the README's "## Results" section from a bench/publish/run_all.py output folder, or its
"## Quality" section from a bench/quality/quality.py output folder.

    python -m bench.publish.update_docs                       # reads bench/out/results.json, edits README.md
    python -m bench.publish.update_docs --quality bench/out/quality   # reads quality.md and its figures

Copies the run's plots to assets/results/ (assets/quality/) and replaces the text between the
section's heading and the next "## " heading (the section is created before "## License", or the
Quality section before "## Results", if missing). Every number in the section comes from the run's
output; the rest of the README is left untouched.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from . import run_all

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

HEADING = "## Results"
QUALITY_HEADING = "## Quality"

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
evidence; image quality on trained models is in [Quality](#quality). Token-level fidelity on
natural images is the last table."""

NOISE = """\
**Timings are noisy**: the CPU run shared {cores} cores with other processes (load average at start
and end below). Every configuration was timed in the same process, in turns, against the unpatched
model of the same run, so load changes hit all of them alike, but single speed-ups can still move
between runs. The relative errors are deterministic (seeded weights and inputs)."""


def section_text(results: dict, image_dir: str) -> str:
    """The Results section: intro, commands, machine, then run_all's tables and plots."""
    machine = results["machine"]
    lines = [HEADING, "", INTRO, ""]
    if machine["device"] == "cpu":
        lines += [NOISE.format(cores=machine["logical_cores"]), ""]
    lines += ["Commands (from the repository root; the first one took "
              f"{results['seconds']:.0f} s here):", "", "```bash",
              f"COMFYUI_PATH=~/comfy/ComfyUI ~/comfy/venv/bin/{results['command']}",
              "python -m bench.publish.update_docs          # this section, from bench/out/results.json",
              "```", "",
              f"Machine: {run_all.machine_line(machine)}.", ""]
    if machine["device"] == "cpu":
        lines += ["`python -m bench.publish.run_all --device cuda` runs Flux.1 / SDXL sizes (bf16 / fp16) on a GPU; "
                  "it has not been run for this section, so no GPU numbers are quoted.", ""]
    body = run_all.render_markdown(results, image_dir=image_dir, heading="##", header=False)
    return "\n".join(lines) + "\n" + body.rstrip() + "\n"


def replace_section(readme: str, section: str, heading: str = HEADING, before: str = "## License") -> str:
    """README text with the section under `heading` replaced (or inserted before `before`)."""
    match = re.search(rf"^{re.escape(heading)}[ \t]*\n.*?(?=^## |\Z)", readme, flags=re.S | re.M)
    if match:
        return readme[: match.start()] + section + "\n" + readme[match.end():]
    anchor = re.search(rf"^{re.escape(before)}", readme, flags=re.M)
    at = anchor.start() if anchor else len(readme)
    return readme[:at] + section + "\n" + readme[at:]


def quality_section(src: Path, image_dir: str) -> str:
    """The Quality section: intro, the command, then quality.md one heading level down, each
    family's Pareto plot and image grid after its tables."""
    meta = json.loads((src / "quality.json").read_text())
    runs = meta["command"].split("; ")  # several when the folder was made by quality.py --combine
    lines = [QUALITY_HEADING, "", QUALITY_INTRO, "", "```bash",
             *(f"COMFYUI_PATH=/path/to/ComfyUI python {command}" for command in runs)]
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


def copy_quality_figures(src: Path, dst: Path) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for png in sorted(src.glob("*.png")):
        shutil.copyfile(png, dst / png.name)
        copied.append(dst / png.name)
    return copied


def copy_plots(results: dict, src: Path, dst: Path) -> list[Path]:
    """Copy the plots the run wrote to dst; returns the copied paths."""
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for section in results["sections"].values():
        if section.get("plot_written"):
            target = dst / section["plot"]
            shutil.copyfile(src / section["plot"], target)
            copied.append(target)
    return copied


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(ROOT / "bench" / "out"), help="run_all.py output folder")
    p.add_argument("--readme", default=str(ROOT / "README.md"))
    p.add_argument("--assets", default="assets/results", help="plot folder, relative to the README")
    p.add_argument("--quality", help="bench/quality/quality.py output folder: write the Quality section instead")
    args = p.parse_args(argv)
    readme = Path(args.readme)
    if args.quality:
        src, assets = Path(args.quality), "assets/quality"
        copied = copy_quality_figures(src, readme.parent / assets)
        section = quality_section(src, assets)
        readme.write_text(replace_section(readme.read_text(), section, QUALITY_HEADING, before=HEADING))
        print(f"updated {readme} ({QUALITY_HEADING}); figures: {', '.join(str(c) for c in copied) or 'none'}")
        return 0
    src = Path(args.results)
    results = json.loads((src / "results.json").read_text())
    copied = copy_plots(results, src, readme.parent / args.assets)
    readme.write_text(replace_section(readme.read_text(), section_text(results, args.assets)))
    print(f"updated {readme} ({HEADING}); plots: {', '.join(str(c) for c in copied) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
