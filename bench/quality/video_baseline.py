"""Record the video defaults' quality on the trained Wan fixture (the video quality_baseline).

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.quality.video_baseline --write

For each of SEEDS, samples the unpatched Wan fixture (``harness/trained_video.py``, its
20-step sampler) and the fixture under two ToMA settings: the ToMA Patch (Advanced) node's schema
defaults (tile_frames and the ``auto`` block list included) and the ToMA node of
the Wan template ``example_workflows/Wan 2.2 14B - text to video with ToMA.json`` (both experts
carry the same settings; recorded as "Wan template"), each with min_tokens 0
(``trained.patch_at_node_defaults`` says why). Per setting: the mean per-frame PSNR (dB) and the
flicker (``harness.metrics.clip_metrics``) against the unpatched clip. ``--write`` stores them with
the settings in fixtures/video_baseline.json; tests/integration/test_video_fixture.py recomputes
them and fails on a drop beyond its margin or on settings that no longer match the record.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch

from harness.metrics import clip_metrics

from . import quality_baseline

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "example_workflows" / "Wan 2.2 14B - text to video with ToMA.json"
SEEDS = (0, 1)
"""Two clips of 9 frames: about a minute on one CPU thread."""


def baseline_path() -> Path:
    from harness import trained

    return trained.FIXTURE_DIR / "video_baseline.json"


def _inputs(node: type) -> list[Any]:
    return [i for i in node.define_schema().inputs if i.id != "model"]


def settings() -> dict[str, tuple[str, dict[str, Any]]]:
    """{name: (node name, inputs)}: the Advanced node's defaults and the Wan workflow's ToMA node."""
    from harness.pack import pack_module

    nodes = pack_module("nodes.node.toma_nodes")
    advanced = {i.id: i.default for i in _inputs(nodes.ToMAPatchAdvanced)} | {"min_tokens": 0}
    workflow = json.loads(WORKFLOW.read_text())
    found = {}
    for n in workflow["nodes"]:
        if n["type"] in ("ToMAPatch", "ToMAPatchAdvanced"):
            ids = [i.id for i in _inputs(getattr(nodes, n["type"]))]
            found[json.dumps([n["type"], n["widgets_values"]])] = (n["type"], dict(zip(ids, n["widgets_values"])))
    if len(found) != 1:
        raise ValueError(f"{WORKFLOW.name}: the ToMA nodes of the two experts differ or are missing: {sorted(found)}")
    name, inputs = next(iter(found.values()))
    if "min_tokens" in inputs:
        inputs["min_tokens"] = 0
    return {"node defaults": ("ToMAPatchAdvanced", advanced), "Wan template": (name, inputs)}


def _patched(base: Any, node_name: str, inputs: dict[str, Any]) -> Any:
    from harness.pack import pack_module

    nodes = pack_module("nodes.node.toma_nodes")
    if node_name == "ToMAPatch":  # the basic node has no min_tokens: build its settings as it does, with 0
        patching = pack_module("nodes.node.patching")
        return patching.patch_model(base, nodes.build_settings(**inputs, min_tokens=0))
    return getattr(nodes, node_name).execute(base, **inputs).result[0]


def _clip(model: Any, seed: int) -> Any:
    import comfy.sample

    from harness import trained_video as tv

    latent = torch.zeros(tv.latent_shape())
    positive, negative = tv.conditioning()
    s = tv.SAMPLER
    out = comfy.sample.sample(model, comfy.sample.prepare_noise(latent, seed), s["steps"], s["cfg"], s["sampler_name"],
                              s["scheduler"], positive, negative, latent, seed=seed, disable_pbar=True)
    return tv.decode(out)[0].permute(1, 2, 3, 0).double().numpy()


def measure(seeds: tuple[int, ...] = SEEDS, which: tuple[str, ...] | None = None) -> dict[str, Any]:
    """{"settings": {name: [node, inputs]}, "results": {name: {"seeds", "psnr", "flicker", "mean", ...}}}."""
    from harness import trained_video as tv

    base = tv.load_model()
    chosen = {k: v for k, v in settings().items() if which is None or k in which}
    refs = {seed: _clip(base, seed) for seed in seeds}
    results = {}
    for name, (node_name, inputs) in chosen.items():
        model = _patched(base, node_name, inputs)
        ms = [clip_metrics(refs[seed], _clip(model, seed)) for seed in seeds]
        psnr = [statistics.fmean(m["psnr"]) for m in ms]
        flicker = [m["flicker"] for m in ms]
        results[name] = {"seeds": list(seeds), "psnr": psnr, "flicker": flicker,
                         "mean": statistics.fmean(psnr), "flicker_mean": statistics.fmean(flicker)}
    return {"settings": {k: list(v) for k, v in chosen.items()}, "results": results}


def main(argv: list[str] | None = None) -> int:
    return quality_baseline.record_main(argv, __doc__, "video_baseline", measure, baseline_path)


if __name__ == "__main__":
    raise SystemExit(main())
