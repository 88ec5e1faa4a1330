"""Rewrite the shipped fixtures' safetensors headers so ComfyUI's own loaders read them, weights untouched.

    python -m bench.quality.fixture_metadata            # rewrite where the header differs, record digests
    python -m bench.quality.fixture_metadata --check    # exit 1 when a file or its json is not as written

Only the header's metadata changes: each file's tensors are read and written back, and the run fails
unless ``trained.tensors_digest`` is the same before and after. The digest goes to the fixture's json
(``tensors_sha256``), which ``tests/integration/test_fixture_loaders.py`` compares the files with.

Which fixture gets metadata: the Wan fixture, ``trained_video.loader_metadata`` (the config entries
``comfy.model_detection.detect_unet_config`` reads from a Wan file's ``config`` metadata). ComfyUI
reads no config metadata for Flux or UNet models (fixtures/README.md says why they do not load):
their headers stay empty.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from harness import trained, trained_video

log = logging.getLogger(__name__)


def wanted_metadata(family: str) -> dict[str, str]:
    """The header metadata the family's fixture file should carry ({} for none)."""
    return trained_video.loader_metadata() if family == trained_video.FAMILY else {}


def fixture_families() -> tuple[str, ...]:
    """The image fixtures and the Wan fixture, as shipped."""
    return (*trained.FAMILIES, trained_video.FAMILY)


def read_metadata(path: Path) -> dict[str, str]:
    """The safetensors header's metadata ({} when it has none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def rewrite(path: Path, metadata: dict[str, str]) -> str:
    """Write `path` again with the same tensors and `metadata`; returns the (unchanged) tensors digest."""
    from safetensors.torch import load_file, save_file

    before = trained.tensors_digest(path)
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata=metadata or None)
    after = trained.tensors_digest(path)
    if after != before:
        raise RuntimeError(f"{path}: tensors changed while rewriting the header ({before} -> {after})")
    return after


def problems(family: str) -> list[str]:
    """What differs from the wanted state: the header's metadata, the json's recorded digest."""
    path = trained.FIXTURE_DIR / f"{family}.safetensors"
    meta = json.loads(path.with_suffix(".json").read_text())
    found = []
    if read_metadata(path) != wanted_metadata(family):
        found.append(f"{path.name}: header metadata {read_metadata(path)} != {wanted_metadata(family)}")
    if meta.get("tensors_sha256") != trained.tensors_digest(path):
        found.append(f"{path.with_suffix('.json').name}: tensors_sha256 does not match {path.name}")
    return found


def update(family: str) -> None:
    """Rewrite the family's header if it differs and record its digest in the json."""
    path = trained.FIXTURE_DIR / f"{family}.safetensors"
    digest = trained.tensors_digest(path)
    if read_metadata(path) != wanted_metadata(family):
        digest = rewrite(path, wanted_metadata(family))
        log.info("%s: header rewritten, tensors unchanged (%s)", path.name, digest)
    meta_file = path.with_suffix(".json")
    meta = json.loads(meta_file.read_text())
    if meta.get("tensors_sha256") != digest:
        meta_file.write_text(json.dumps(meta | {"tensors_sha256": digest}, indent=1) + "\n")
        log.info("%s: tensors_sha256 recorded", meta_file.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report differences, change nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.check:
        found = [line for family in fixture_families() for line in problems(family)]
        for line in found:
            log.error(line)
        return 1 if found else 0
    for family in fixture_families():
        update(family)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
