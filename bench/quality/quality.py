"""Image quality of ToMA on the trained fixtures, against what a user would do instead.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.quality.quality                 # every fixture
    python -m bench.quality.quality --families flux --quick --out /tmp/q                       # smoke run
    python -m bench.quality.quality --combine /tmp/q_flux /tmp/q_sd15 --out /tmp/q             # one report of two runs

Every row is a chain of nodes as a user wires them (Load -> ToMA -> EasyCache -> KSampler): the
pack's ToMA nodes and ComfyUI's EasyCache, LazyCache and TomePatchModel, each called through its
own ``execute`` with its schema's defaults for inputs the row leaves out. Every row samples the
same seeds through ``comfy.sample.sample`` (the sampler settings of ``trained.SAMPLER``) and the
latent is decoded with the fixture's pixel codec (``trained.decode``). Per row:

- PSNR (mean and min over seeds) and SSIM (mean) against the unpatched run at the reference step
  count with the same seed (scikit-image). A bit-identical image has PSNR inf (JSON: Infinity).
- speed-up: the whole sampling call timed in turns with the unpatched reference. Each pass over a
  seed runs the rows in a shuffled order with the reference re-run every few rows; a row's call
  counts as (mean of the two reference calls around it) / (its own time). The row's speed-up is
  the median over seeds and passes (--repeats: passes; later ones also check the images repeat
  bit for bit). Both clocks are recorded: the process's CPU time (``speedup``, the default with
  one thread: other jobs on a shared machine barely move it) and wall time (``speedup_wall``).
- fewer steps at the same time: the step count an unpatched run of the same duration has
  (``same_time_steps``, from a one-parameter fit of the fewer-steps rows' speed-ups: a share of
  every run does not scale with steps) and the fewer-steps rows' PSNR interpolated there
  (``steps_psnr_at_speedup``; quality_report.steps_psnr_at); ``beats_fewer_steps``: the row's mean
  PSNR is above it.

Rows are data (``ROWS``): a group, a label, an optional step fraction and a chain of
(node, inputs). ToMA rows pin every basic input (``PINNED``, the paper's every-step schedule, plus
what the label names); only "ToMA node defaults" follows the node's current defaults. Inputs a node does not have (``merge_every`` before it exists) skip the row; so
do rows for other families (``only``) and node inputs the node rejects (ValueError). The blocks
value "later" stands for the later half of the model's blocks (Flux: the second half of each
stream; UNet: the output blocks).

Outputs under --out: quality.json, quality.md, pareto_<family>.png, grid_<family>.png (--combine
writes the same from earlier runs' folders, without sampling).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import metrics

from .. import cli
from ..timing import CLOCKS

BENCH = Path(__file__).resolve().parents[1]

REFERENCE = "unpatched"
"""Label of the reference row: the unpatched model at the sampler's step count."""

STEP_FRACTIONS = (0.95, 0.9, 0.8, 0.75, 0.7, 0.6, 0.5, 0.4, 0.25)
"""Fewer-steps baseline: 19, 18, 16, 15, 14, 12, 10, 8, 5 of 20 steps, 3, 2, 1 of 4 (19: rows at
speed-ups near 1.05x are compared with a measured step count, not with 18 steps' lower bound; 8 and
5: rows predicted at 2-4x on real sizes)."""

REF_EVERY = 5
"""The reference is re-run after every this many rows, so drift on a shared machine cancels."""

EASYCACHE_THRESHOLDS = (0.02, 0.05, 0.1, 0.2, 0.5)
LAZYCACHE_THRESHOLDS = (0.05, 0.1, 0.2, 0.5, 1.0)
COMBINED_THRESHOLDS = (0.05, 0.1)
"""reuse_threshold values of the cache rows (ToMA + EasyCache: thresholds that also run alone).
Measured on the fixtures (1 seed, 20 steps): EasyCache skips 0/4/6/8 of 20 steps on Flux and 6/8/10/11
on SDXL at 0.02/0.05/0.1/0.2; LazyCache 0/5/7 (Flux) and 5/6/8 (SDXL) at 0.05/0.1/0.2. The
highest (EasyCache 0.5, LazyCache 0.5 and 1) are for 4-step runs, where the lower ones skip nothing
(docs/quality.md, Few-step runs)."""

TEACACHE_THRESHOLDS = (0.2, 0.4, 0.6)
MAGCACHE_THRESHOLDS = (0.06, 0.12, 0.24)
"""rel_l1_thresh of TeaCache (its default 0.4) and magcache_thresh of MagCache (its default 0.06)."""

SCOPE_RATIOS = {"block": (0.25, 0.5, 0.75), "keys_values": (0.5, 0.75, 0.9)}
SCOPE_STARTS = (0.0, 0.4)
KV_TILES = (4, 8)
"""The scope study's grid: block merge at tile 4, keys/values at tile 4 and 8 with and without the
log-mass weight (ToMASettings.key_mass, no node input: the bench sets it), each from step 0 and
from 40 % of the schedule; blocks auto, min_tokens 0 (a fixture stands in for a real model's
image: trained.patch_at_node_defaults)."""


PINNED = {"ratio": 0.5, "tile_size": 4, "start_percent": 0.0, "end_percent": 1.0, "recompute_every": 1, "merge_every": 1}
"""The basic inputs of every ToMA row but "ToMA node defaults": the paper's schedule (merge on every
step), so a row's label names everything it changes and a new node default cannot relabel a row."""


def _toma(label: str, group: str, quick: bool = False, node: str = "ToMAPatch", only: tuple[str, ...] = (),
          **inputs: Any) -> dict[str, Any]:
    return {"label": label, "group": group, "quick": quick, "only": only, "chain": [(node, PINNED | inputs)]}


def _adv(label: str, **inputs: Any) -> dict[str, Any]:
    only = inputs.pop("only", ())
    return _toma(label, "ToMA advanced", node="ToMAPatchAdvanced", only=only, **inputs)


def _cache(node: str, threshold: float, quick: bool = False, key: str = "reuse_threshold") -> dict[str, Any]:
    return {"label": f"{node} {threshold:g}", "group": node, "quick": quick, "only": (),
            "chain": [(node, {key: threshold})]}


def _scope(scope: str, ratio: float, start: float, tile: int = 4, key_mass: bool = True) -> dict[str, Any]:
    """A row of the scope study (SCOPE_RATIOS): "block 0.5 start 0.4", "KV 0.75 start 0 tile 8 no mass"."""
    kv = scope == "keys_values"
    label = f"KV {ratio:g} start {start:g} tile {tile}" + ("" if key_mass else " no mass") if kv else f"block {ratio:g} start {start:g}"
    group = ("keys_values" if key_mass else "keys_values no mass") if kv else "block merge"
    inputs = PINNED | {"ratio": ratio, "start_percent": start, "tile_size": tile, "blocks": "auto", "min_tokens": 0, "scope": scope}
    return {"label": label, "group": group, "quick": False, "only": (),
            "chain": [("ToMAPatchAdvanced", inputs | ({} if key_mass else {"key_mass": False}))]}


def stack_row(ratio: float, start: float, tile: int, node: str, threshold: float) -> dict[str, Any]:
    """The keys/values row (_scope) with a step cache after it, as a user chains them: "stack KV 0.75
    start 0.4 tile 4 + LazyCache 0.2"."""
    kv = _scope("keys_values", ratio, start, tile)
    key = {"TeaCache": "rel_l1_thresh", "MagCache": "magcache_thresh"}.get(node, "reuse_threshold")
    return {"label": f"stack {kv['label']} + {node} {threshold:g}", "group": "stack", "quick": False, "only": (),
            "chain": [*kv["chain"], (node, {key: threshold})]}


STACK_CACHES = (("LazyCache", 0.2), ("LazyCache", 1.0), ("EasyCache", 0.02), ("TeaCache", 0.2), ("TeaCache", 0.4), ("MagCache", 0.06))
"""The caches the stack rows put after keys/values: each fixture's best cache rows of the scope study
(LazyCache on Flux, EasyCache on SDXL, TeaCache / MagCache on ComfyUI 0.3.64; 1.0 and 0.4 for 4 steps)."""


ROWS: list[dict[str, Any]] = [
    {"label": REFERENCE, "group": "reference", "quick": True, "only": (), "chain": []},
    *({"label": f"steps x{f:g}", "group": "fewer steps", "quick": f == 0.75, "only": (), "chain": [],
       "steps": f} for f in STEP_FRACTIONS),
    _toma("ToMA 0 (identity)", "check", quick=True, ratio=0.0),
    {"label": "ToMA node defaults", "group": "ToMA defaults", "quick": True, "only": (), "chain": [("ToMAPatch", {})]},
    _toma("ToMA 0.25", "ToMA ratio", ratio=0.25),
    _toma("ToMA 0.5", "ToMA ratio", ratio=0.5),
    _toma("ToMA 0.75", "ToMA ratio", ratio=0.75),
    _toma("ToMA 0.5 start 0.25", "ToMA schedule", ratio=0.5, start_percent=0.25),
    _toma("ToMA 0.5 start 0.5", "ToMA schedule", ratio=0.5, start_percent=0.5),
    _toma("ToMA 0.5 start 0.75", "ToMA schedule", ratio=0.5, start_percent=0.75),
    _toma("ToMA 0.75 start 0.5", "ToMA schedule", ratio=0.75, start_percent=0.5),
    _toma("ToMA 0.5 recompute 5", "ToMA schedule", ratio=0.5, recompute_every=5),
    _toma("ToMA 0.5 merge_every 2", "ToMA schedule", ratio=0.5, merge_every=2),
    _toma("ToMA 0.5 merge_every 3", "ToMA schedule", ratio=0.5, merge_every=3),
    _toma("ToMA 0.75 merge_every 3", "ToMA schedule", ratio=0.75, merge_every=3),
    _toma("ToMA 0.5 tile 2", "ToMA schedule", ratio=0.5, tile_size=2),
    _toma("ToMA 0.5 tile 8", "ToMA schedule", ratio=0.5, tile_size=8),
    _adv("ToMA 0.5 blocks all", ratio=0.5, blocks="all"),
    _adv("ToMA 0.5 blocks later", ratio=0.5, blocks="later"),
    _adv("ToMA 0.75 blocks later", ratio=0.75, blocks="later"),
    _adv("ToMA 0.75 blocks later start 0.5", ratio=0.75, blocks="later", start_percent=0.5),
    _adv("ToMA 0.75 blocks later merge_every 2", ratio=0.75, blocks="later", merge_every=2),
    _adv("ToMA 0.9 blocks later start 0.75", ratio=0.9, blocks="later", start_percent=0.75),
    _adv("ToMA 0.5 centered_cosine", ratio=0.5, similarity="centered_cosine"),
    _adv("ToMA 0.5 neg_sq_dist", ratio=0.5, similarity="neg_sq_dist"),
    _adv("ToMA 0.5 temperature 0", ratio=0.5, temperature=0.0),
    _adv("ToMA 0.5 temperature 0.05", ratio=0.5, temperature=0.05),
    _adv("ToMA 0.5 budget adaptive", ratio=0.5, budget="adaptive"),
    _adv("ToMA 0.5 proportional", ratio=0.5, proportional_attention=True, only=("flux",)),
    _adv("ToMA 0.5 scope attention", ratio=0.5, scope="attention"),
    _adv("ToMA 0.5 unmerge hard", ratio=0.5, unmerge="hard"),
    _adv("ToMA 0.5 unmerge output", ratio=0.5, unmerge="output"),
    _adv("ToMA 0.5 start 0.75 blocks later", ratio=0.5, start_percent=0.75, blocks="later"),
    _adv("ToMA 0.5 start 0.75 centered_cosine", ratio=0.5, start_percent=0.75, similarity="centered_cosine"),
    _adv("ToMA 0.5 start 0.75 scope attention", ratio=0.5, start_percent=0.75, scope="attention"),
    _adv("ToMA 0.75 start 0.75 scope attention", ratio=0.75, start_percent=0.75, scope="attention"),
    *(_cache("EasyCache", t, quick=t == 0.1) for t in EASYCACHE_THRESHOLDS),
    *(_cache("LazyCache", t) for t in LAZYCACHE_THRESHOLDS),
    *({"label": f"ToMA 0.5 + EasyCache {t:g}", "group": "ToMA + EasyCache", "quick": False, "only": (),
       "chain": [("ToMAPatch", PINNED), ("EasyCache", {"reuse_threshold": t})]} for t in COMBINED_THRESHOLDS),
    *({"label": f"ToMe {r:g}", "group": "ToMe", "quick": False, "only": ("sd15",),
       "chain": [("TomePatchModel", {"ratio": r})]} for r in (0.3, 0.5)),
    *(_cache("TeaCache", t, key="rel_l1_thresh") for t in TEACACHE_THRESHOLDS),
    *(_cache("MagCache", t, key="magcache_thresh") for t in MAGCACHE_THRESHOLDS),
    {"label": "block node defaults", "group": "block merge", "quick": False, "only": (), "chain": [("ToMAPatch", {"min_tokens": 0})]},
    *(_scope("block", r, st) for r in SCOPE_RATIOS["block"] for st in SCOPE_STARTS),
    {"label": "KV 0 (identity)", "group": "check", "quick": False, "only": (),
     "chain": [("ToMAPatchAdvanced", PINNED | {"ratio": 0.0, "scope": "keys_values", "min_tokens": 0})]},
    *(_scope("keys_values", r, st, t, mass) for mass in (True, False) for r in SCOPE_RATIOS["keys_values"]
      for st in SCOPE_STARTS for t in KV_TILES),
    *(stack_row(r, 0.4, 4, node, t) for r in (0.5, 0.75) for node, t in STACK_CACHES),
]
"""Every row of the bench. "quick": in the --quick set. "only": families the row applies to (empty: all).
Group "check": ratio 0 must give the reference image bit for bit (PSNR inf); it is no trade-off."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=None, help="fixture families (default: every fixture present)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1, the same for every row (default 5, --quick 2)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes over the seeds (the first one gives the images)")
    p.add_argument("--steps", type=int, nargs="+", default=[], metavar="N",
                   help="reference step counts, one run each (default: the fixture's SAMPLER steps)")
    p.add_argument("--quick", action="store_true", help="a few rows only (smoke test)")
    p.add_argument("--rows", default=None, metavar="REGEX",
                   help="only rows whose label matches (the reference and fewer-steps rows always run)")
    p.add_argument("--add", action="append", default=[], metavar="CHAIN",
                   help="an extra row, e.g. 'ToMAPatch:ratio=0.6;start_percent=0.4 + EasyCache:reuse_threshold=0.1'")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"],
                   help="pytorch: SDPA (what ComfyUI uses on GPUs); comfy-default: ComfyUI's CPU choice")
    p.add_argument("--clock", choices=["auto", *CLOCKS], default="auto",
                   help="clock of the speed-ups (auto: cpu with one thread, else wall); both are recorded")
    p.add_argument("--out", type=Path, default=BENCH / "out" / "quality")
    p.add_argument("--combine", nargs="+", type=Path, default=None, metavar="DIR",
                   help="no sampling: merge the --out folders of earlier runs (e.g. one per family) into --out")
    args = p.parse_args(argv)
    if args.seeds is None:
        args.seeds = 2 if args.quick else 5
    if args.seeds < 1 or args.repeats < 1 or args.threads < 1 or any(n < 1 for n in args.steps):
        p.error(f"--seeds {args.seeds}, --repeats {args.repeats}, --threads {args.threads} must be >= 1 "
                f"and --steps {args.steps} >= 1")
    args.device, args.dtype = "cpu", "fp32"
    if args.clock == "auto":
        args.clock = "cpu" if args.threads == 1 else "wall"
    try:
        args.add = [parse_chain(spec) for spec in args.add]
        args.rows = None if args.rows is None else re.compile(args.rows)
    except (ValueError, re.error) as exc:
        p.error(str(exc))
    return args


def parse_chain(spec: str) -> dict[str, Any]:
    """A row from 'Node:key=value;key=value + Node:...' (values: int, float, true/false or text)."""
    chain = []
    for part in spec.split("+"):
        name, _, pairs = part.strip().partition(":")
        inputs = {}
        for pair in filter(None, (x.strip() for x in pairs.split(";"))):
            key, eq, value = pair.partition("=")
            if not eq:
                raise ValueError(f"--add {spec!r}: {pair!r} is not key=value")
            inputs[key.strip()] = _value(value.strip())
        chain.append((name.strip(), inputs))
    group = "ToMA added" if any(name.startswith("ToMAPatch") for name, _ in chain) else "added"
    return {"label": spec.strip(), "group": group, "quick": True, "only": (), "chain": chain}


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ------------------------------------------------------------------------------ rows -> patched models


@dataclass
class Variant:
    """One row made runnable: its patched model and step count."""

    row: dict[str, Any]
    steps: int
    model: Any
    chain: list[dict[str, Any]]


@dataclass(kw_only=True)
class RowMetrics:
    """What a row of either quality study measured: the fields an image fixture's row (RowResult)
    and the video fixture's (video_quality.VideoRow) share; None where skipped. Keyword-only, so
    each study adds its own fields (its JSON rows hold these keys and its own)."""

    label: str
    group: str
    params: dict[str, Any]
    speedup: float | None = None
    speedup_wall: float | None = None
    psnr_mean: float | None = None
    ssim_mean: float | None = None
    log: str = ""
    skipped: str | None = None
    computed_steps: float | None = None
    """Model calls per run that ran the model's blocks (a step cache skips some), mean over seeds."""
    predicted: dict[str, float] = field(default_factory=dict)
    """Predicted real-size end-to-end speed-up per target (bench/quality/real_speed.py)."""

    @classmethod
    def skipped_row(cls, row: dict[str, Any], reason: str, **own: Any) -> RowMetrics:
        """The row as built from ROWS' data only, with the reason it has no metrics; `own`: the
        study's required fields (family, regime)."""
        return cls(label=row["label"], group=row["group"], params={"chain": [list(c) for c in row["chain"]]},
                   skipped=reason, **own)


@dataclass(kw_only=True)
class RowResult(RowMetrics):
    """What one row of an image fixture measured (quality.json's rows)."""

    family: str
    psnr_min: float | None = None
    seconds: float | None = None
    psnr_per_seed: list[float] = field(default_factory=list)
    deterministic: bool | None = None
    same_time_steps: float | None = None
    steps_psnr_at_speedup: float | None = None
    beats_fewer_steps: bool | None = None
    regime: int | None = None
    """The reference step count of the run the row belongs to (--steps)."""


class ComfyNode:
    """A ComfyUI node (io.ComfyNode) as a chain link: its schema's defaults and its execute."""

    def __init__(self, node: type) -> None:
        self.node = node

    def defaults(self) -> dict[str, Any]:
        """Every input of the node but the model, with its schema default."""
        return {i.id: i.default for i in self.node.define_schema().inputs if i.id != "model"}

    def apply(self, model: Any, **inputs: Any) -> Any:
        return self.node.execute(model, **inputs).result[0]


class PackNode:
    """A third-party pack's node (INPUT_TYPES / FUNCTION) as a chain link, its model_type set to the
    fixture's family (``THIRD_PARTY``), imported from the real pack (harness/third_party.py)."""

    def __init__(self, pack: str, cls: str, model_type: str) -> None:
        from harness import third_party

        self.node = getattr(third_party.pack_module(pack, "nodes"), cls)()
        self.model_type = model_type

    def defaults(self) -> dict[str, Any]:
        spec = self.node.INPUT_TYPES()["required"]
        return {k: v[1]["default"] for k, v in spec.items() if k not in ("model", "model_type")}

    def apply(self, model: Any, **inputs: Any) -> Any:
        return getattr(self.node, self.node.FUNCTION)(model, model_type=self.model_type, **inputs)[0]


THIRD_PARTY: dict[str, tuple[str, str, dict[str, str]]] = {
    "TeaCache": ("ComfyUI-TeaCache", "TeaCache", {"flux": "flux", "wan": "wan2.1_t2v_1.3B"}),
    "MagCache": ("ComfyUI-MagCache", "MagCache", {"flux": "flux", "wan": "wan2.1_t2v_1.3B"}),
}
"""Step caches of third-party packs: (pack folder, node class, model_type per fixture family). Neither
pack has a UNet model_type (SDXL rows skip); Wan takes their Wan 2.1 1.3B coefficients (the fixture's
topology at a smaller width)."""


def node_classes() -> dict[str, type]:
    """The ComfyUI nodes a row's chain may name, as ComfyUI registers them."""
    from comfy_extras.nodes_easycache import EasyCacheNode, LazyCacheNode
    from comfy_extras.nodes_tomesd import TomePatchModel

    from harness.pack import pack_module

    nodes = pack_module("nodes.node.toma_nodes")
    return {"ToMAPatch": nodes.ToMAPatch, "ToMAPatchAdvanced": nodes.ToMAPatchAdvanced, "EasyCache": EasyCacheNode,
            "LazyCache": LazyCacheNode, "TomePatchModel": TomePatchModel}


def chain_node(name: str, family: str, nodes: dict[str, type]) -> ComfyNode | PackNode | str:
    """The link a chain names, or why it cannot run on `family` (unknown node, pack missing)."""
    if name in nodes:
        return ComfyNode(nodes[name])
    if name not in THIRD_PARTY:
        return f"unknown node {name!r} (one of {', '.join([*nodes, *THIRD_PARTY])})"
    pack, cls, types_ = THIRD_PARTY[name]
    if family not in types_:
        return f"{name} has no model_type for {family} (it has {', '.join(sorted(set(types_.values())))})"
    try:
        return PackNode(pack, cls, types_[family])
    except BaseException as exc:  # a missing pack skips (harness.third_party raises pytest's Skipped)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return f"{name}: {type(exc).__name__}: {exc}"


def settings_only() -> frozenset[str]:
    """ToMASettings fields a ToMA row may set that are no node input (min_tokens on ToMA Patch, key_mass):
    the bench patches them through ``nodes.node.patching.patch_model`` (``override_settings``)."""
    import dataclasses

    from harness.pack import pack_module

    return frozenset(f.name for f in dataclasses.fields(pack_module("nodes.settings").ToMASettings)) - {"schedule"}


def override_settings(before: Any, patched: Any, overrides: dict[str, Any]) -> Any:
    """`before` patched with the settings the node built into `patched`, `overrides` replaced."""
    import dataclasses

    from harness.pack import pack_module

    key = pack_module("nodes.settings").TOMA_KEY
    settings = patched.model_options["transformer_options"][key].config.settings
    return pack_module("nodes.node.patching").patch_model(before, dataclasses.replace(settings, **overrides))


def later_blocks(model: Any) -> str:
    """The later half of the model's blocks in the Advanced node's `blocks` syntax."""
    unet = model.get_model_object("diffusion_model")
    if hasattr(unet, "double_blocks"):
        d, s = len(unet.double_blocks), len(unet.single_blocks)
        return f"double:{d // 2}-{d - 1},single:{s // 2}-{s - 1}"
    return "output"


def build_variant(row: dict[str, Any], family: str, model: Any, ref_steps: int, nodes: dict[str, type]) -> Variant | str:
    """The row's patched model (its chain of nodes on `model`), or why it is skipped. A ToMA link's
    inputs that are ToMASettings fields but no input of its node (``settings_only``) are set on the
    settings the node built (``override_settings``). A step-distilled student runs its teacher's rows."""
    from harness import trained

    family = trained.STUDENTS.get(family, family)
    if row["only"] and family not in row["only"]:
        return f"not for {family} (only {', '.join(row['only'])})"
    steps = max(1, round(row["steps"] * ref_steps)) if "steps" in row else ref_steps
    chain = []
    for name, given in row["chain"]:
        node = chain_node(name, family, nodes)
        if isinstance(node, str):
            return node
        inputs = node.defaults()
        extra = set(given) - set(inputs)
        overrides = {k: given[k] for k in extra & settings_only()} if name.startswith("ToMAPatch") else {}
        missing = sorted(extra - set(overrides))
        if missing:
            return f"{name} has no input {', '.join(missing)}"
        inputs |= {k: later_blocks(model) if (k, v) == ("blocks", "later") else v for k, v in given.items() if k not in overrides}
        try:
            patched = node.apply(model, **inputs)
            model = override_settings(model, patched, overrides) if overrides else patched
        except ValueError as exc:
            return f"{name} rejects the inputs: {exc}"
        chain.append({"node": name, "inputs": inputs | overrides})
    return Variant(row, steps, model, chain)


def build_all(rows: list[dict[str, Any]], family: str, model: Any, ref_steps: int) -> dict[str, Variant | str]:
    """Every row's Variant or skip reason, by label; a fewer-steps row whose step count is already
    run (short --steps) is skipped."""
    nodes, built, seen = node_classes(), {}, {ref_steps}
    for row in rows:
        variant = build_variant(row, family, model, ref_steps, nodes)
        if isinstance(variant, Variant) and "steps" in row:
            if variant.steps in seen:
                variant = f"{variant.steps} steps are already run"
            else:
                seen.add(variant.steps)
        built[row["label"]] = variant
    return built


# ------------------------------------------------------------------------------ sampling and timing


class LogTap(logging.Handler):
    """Keeps the last run-summary line of ToMA and of EasyCache / LazyCache."""

    PATTERN = re.compile(r"^(ToMA \[|EasyCache - skipped|LazyCache - skipped)")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.PATTERN.match(message):
            self.lines.append(summary(message))

    @classmethod
    def install(cls) -> LogTap:
        """A tap on the root logger, whose handlers (ComfyUI's stderr one) are raised to WARNING: the
        run summaries go to the tap only."""
        tap = cls()
        root_logger = logging.getLogger()
        for handler in root_logger.handlers:
            handler.setLevel(max(handler.level, logging.WARNING))
        root_logger.addHandler(tap)
        root_logger.setLevel(logging.INFO)  # EasyCache logs its summary with logging.info on the root logger
        return tap


def summary(line: str) -> str:
    """The informative part of a run-summary line (ToMA: steps merged and tokens)."""
    if line.startswith("ToMA ["):
        parts = line.split(" | ")
        return f"{parts[0].split(': ', 1)[1]}; {parts[1]}"
    return line


class BlockRuns:
    """Counts runs of a model's last transformer block (Flux's last single block, Wan's last block;
    TeaCache and MagCache skip the blocks, not the final layer) or of a UNet's output convolution
    (``out``: ComfyUI calls the layers inside its output blocks, never the blocks as modules): a step
    cache that skips a model call runs none."""

    def __init__(self, diffusion_model: torch.nn.Module) -> None:
        self.count = 0
        for name in ("single_blocks", "blocks"):
            if hasattr(diffusion_model, name):
                getattr(diffusion_model, name)[-1].register_forward_hook(self._hook)
                return
        if hasattr(diffusion_model, "output_blocks"):
            diffusion_model.out.register_forward_hook(self._hook)
            return
        raise ValueError(f"{type(diffusion_model).__name__} has no single_blocks, blocks or output_blocks to count")

    def _hook(self, *_: Any) -> None:
        self.count += 1


@dataclass
class Family:
    """What sampling one fixture needs: model, conditioning, sampler settings, empty latent, the
    counter of its block runs, and its decoder (sampled latent -> image (H, W, 3) or clip (F, H, W, 3)
    in [0, 1])."""

    name: str
    model: Any
    positive: list
    negative: list
    sampler: dict[str, Any]
    latent: torch.Tensor
    runs: BlockRuns
    decode: Callable[[torch.Tensor], np.ndarray]


def load_family(name: str) -> Family:
    from harness import trained

    positive, negative = trained.conditioning(name)
    model = trained.load_model(name)
    return Family(name, model, positive, negative, dict(trained.SAMPLER[name]),
                  torch.zeros(trained.latent_shape(name)), BlockRuns(model.get_model_object("diffusion_model")),
                  lambda z: trained.decode(name, z)[0].permute(1, 2, 0).double().numpy())


def sample(fam: Family, variant: Variant, seed: int, tap: LogTap) -> tuple[dict[str, float], np.ndarray, str, int]:
    """Seconds of one whole comfy.sample.sample call on each of CLOCKS, the decoded image (fam.decode),
    its log summary and the model calls that ran the blocks (BlockRuns)."""
    import comfy.sample

    noise = comfy.sample.prepare_noise(fam.latent, seed)
    s = fam.sampler
    tap.lines.clear()
    fam.runs.count = 0
    start = {name: clock() for name, clock in CLOCKS.items()}
    latent = comfy.sample.sample(variant.model, noise, variant.steps, s["cfg"], s["sampler_name"], s["scheduler"],
                                 fam.positive, fam.negative, fam.latent, seed=seed, disable_pbar=True)
    seconds = {name: clock() - start[name] for name, clock in CLOCKS.items()}
    image = fam.decode(latent)
    return seconds, image, "; ".join(tap.lines), fam.runs.count


def pass_order(variants: list[Variant], reference: Variant, seed: int, repeat: int) -> list[Variant]:
    """The rows in a shuffled order, the reference first, last and after every REF_EVERY rows."""
    rows = list(variants)
    random.Random(seed * 1009 + repeat).shuffle(rows)
    order = [reference]
    for i in range(0, len(rows), REF_EVERY):
        order += rows[i:i + REF_EVERY] + [reference]
    return order


@dataclass
class Measured:
    """Per row and seed: the first and the latest image; speed-up samples, seconds, repeat check, logs."""

    images: dict[int, np.ndarray] = field(default_factory=dict)
    last: dict[int, np.ndarray] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in CLOCKS})
    seconds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in CLOCKS})
    repeats_identical: bool = True
    logs: list[str] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    failed: str | None = None


def run_pass(fam: Family, order: list[Variant], reference: Variant, seed: int, measured: dict[str, Measured],
             tap: LogTap) -> None:
    """Sample every variant of `order` once with `seed`; record times, speed-up samples and images.
    A row whose sampling raises (a third-party cache at a step count it cannot run) records the
    error and is not sampled again; the reference must run."""
    calls = []
    for v in order:
        m = measured[v.row["label"]]
        if m.failed is not None:
            continue
        try:
            calls.append((v, *sample(fam, v, seed, tap)))
        except Exception as exc:
            if v is reference:
                raise
            m.failed = f"sampling raised {type(exc).__name__}: {exc}"
    ref_at = [i for i, (v, *_) in enumerate(calls) if v is reference]
    for i, (v, seconds, image, log, runs) in enumerate(calls):
        m = measured[v.row["label"]]
        m.logs.append(log)
        m.calls.append(runs)
        if seed in m.images:
            m.repeats_identical &= bool(np.array_equal(m.images[seed], image))
        m.images.setdefault(seed, image)
        m.last[seed] = image
        before = max((j for j in ref_at if j < i), default=None)
        after = min((j for j in ref_at if j > i), default=None)
        for clock, value in seconds.items():
            m.seconds[clock].append(value)
            if v is not reference:
                m.ratios[clock].append((calls[before][1][clock] + calls[after][1][clock]) / 2 / value)


def run_family(fam: Family, ref_steps: int, rows: list[dict[str, Any]], args: argparse.Namespace,
               tap: LogTap) -> tuple[list[RowResult], dict, dict[str, dict[int, np.ndarray]]]:
    """Measure every row on one fixture at `ref_steps` reference steps: the results in ROWS order,
    what the run was (its "name": the family, with the steps when --steps names several), and the
    first-pass images by row label and seed."""
    started = time.perf_counter()
    name = fam.name
    built = build_all(rows, name, fam.model, ref_steps)
    measured = measure(fam, built, args.seeds, args.repeats, tap, f"{name} at {ref_steps} steps")
    results = [result_of(name, row, built[row["label"]], measured, args.seeds, args.clock) for row in rows]
    for r in results:
        r.regime = ref_steps
    run = f"{name}_{ref_steps}steps" if len(args.steps) > 1 else name
    meta = {"family": name, "name": run, "steps": ref_steps, "sampler": fam.sampler, "seeds": list(range(args.seeds)),
            "repeats": args.repeats, "clock": args.clock, "threads": torch.get_num_threads(), "attention": args.attention,
            "latent": list(fam.latent.shape), "reference_jitter": {c: reference_jitter(t) for c, t in measured[REFERENCE].seconds.items()},
            "seconds": round(time.perf_counter() - started, 1)}
    images = {r.label: measured[row["label"]].images for r, row in zip(results, rows) if r.skipped is None}
    return results, meta, images


def measure(fam: Family, built: dict[str, Variant | str], seeds: int, repeats: int, tap: LogTap,
            name: str) -> dict[str, Measured]:
    """Sample every built row (Variant) with seeds 0..seeds-1, `repeats` passes in shuffled orders
    with the reference (label REFERENCE) re-run between them; what each row measured, by label."""
    started = time.perf_counter()
    variants = [v for v in built.values() if isinstance(v, Variant)]
    reference = built[REFERENCE]
    others = [v for v in variants if v is not reference]
    measured = {v.row["label"]: Measured() for v in variants}
    sample(fam, reference, 0, tap)  # warm-up, not counted
    for repeat in range(repeats):
        for seed in range(seeds):
            run_pass(fam, pass_order(others, reference, seed, repeat), reference, seed, measured, tap)
            print(f"  {name}: pass {repeat + 1}/{repeats}, seed {seed} done ({time.perf_counter() - started:.0f} s)", flush=True)
    return measured


def reference_jitter(seconds: list[float]) -> float:
    """Median relative change between consecutive reference calls: the timing noise floor."""
    changes = [abs(b / a - 1) for a, b in zip(seconds, seconds[1:])]
    return round(statistics.median(changes), 4) if changes else 0.0


def skip_reason(variant: Variant | str, m: Measured | None) -> str | None:
    """Why a row has no metrics: it did not build (`variant` is the reason) or its sampling raised."""
    return variant if isinstance(variant, str) else m.failed


def sampled_fields(m: Measured, clock: str, is_ref: bool) -> dict[str, Any]:
    """The RowMetrics fields both studies take from a row's samples alike: its speed-ups on `clock`
    and on wall time (median over seeds and passes; 1 for the reference itself), its run summaries
    and its calls that ran the blocks."""
    return {"speedup": 1.0 if is_ref else round(statistics.median(m.ratios[clock]), 4),
            "speedup_wall": 1.0 if is_ref else round(statistics.median(m.ratios["wall"]), 4),
            "log": " / ".join(sorted(set(m.logs)))[:400], "computed_steps": statistics.fmean(m.calls)}


def result_of(family: str, row: dict[str, Any], variant: Variant | str, measured: dict[str, Measured],
              seeds: int, clock: str) -> RowResult:
    """The row's metrics against the reference images of the same seeds. The reference row itself
    compares its first image of each seed with its last re-run (inf when sampling repeats bit for bit)."""
    m, ref = measured.get(row["label"]), measured[REFERENCE]
    reason = skip_reason(variant, m)
    if reason is not None:
        return RowResult.skipped_row(row, reason, family=family)
    is_ref = row["label"] == REFERENCE
    images = ref.last if is_ref else m.images
    psnrs, ssims = zip(*(image_metrics(ref.images[s], images[s]) for s in range(seeds)))
    label = f"unpatched {variant.steps} steps" if "steps" in row else row["label"]
    return RowResult(
        family=family, label=label, group=row["group"], params={"steps": variant.steps, "chain": variant.chain},
        psnr_mean=round(float(np.mean(psnrs)), 3), psnr_min=round(float(np.min(psnrs)), 3),
        ssim_mean=round(float(np.mean(ssims)), 4), seconds=round(statistics.median(m.seconds[clock]), 4),
        psnr_per_seed=[round(p, 3) for p in psnrs], deterministic=m.repeats_identical,
        **sampled_fields(m, clock, is_ref),
    )


def image_metrics(reference: np.ndarray, image: np.ndarray) -> tuple[float, float]:
    """PSNR (dB, inf when identical) and SSIM of two (H, W, 3) images in [0, 1]."""
    return metrics.psnr(reference, image), metrics.ssim(reference, image)


# ------------------------------------------------------------------------------ main


def selected_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """ROWS filtered by --quick or --rows, then the --add rows."""
    always = ("reference", "fewer steps")
    if args.rows is not None:
        rows = [r for r in ROWS if r["group"] in always or args.rows.search(r["label"])]
    else:
        rows = [r for r in ROWS if r["quick"] or not args.quick]
    return rows + args.add


def combine(folders: list[Path], out: Path) -> str:
    """One report from the runs in `folders` (their quality.json and figures): families in order,
    the setup line of the first run. Returns the Markdown written to out/quality.md."""
    import shutil

    from . import quality_report

    runs = [json.loads((folder / "quality.json").read_text()) for folder in folders]
    metas = [meta for run in runs for meta in run["families"]]
    rows = [RowResult(**row) for run in runs for row in run["rows"]]
    out.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for figure in folder.glob("*.png"):
            if figure.parent.resolve() != out.resolve():
                shutil.copy(figure, out / figure.name)
    (out / "quality.json").write_text(json.dumps(
        {"setup": runs[0]["setup"], "command": "; ".join(run["command"] for run in runs), "families": metas,
         "rows": [asdict(r) for r in rows]}, indent=1))
    table = quality_report.markdown(runs[0]["setup"], metas, rows)
    (out / "quality.md").write_text(table)
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.combine:
        print(combine(args.combine, args.out))
        return 0
    root = cli.import_comfy(args)
    torch.set_num_threads(args.threads)
    from harness import trained

    from . import quality_report

    families = args.families or list(trained.available())
    missing = [f for f in families if f not in trained.available(students=True)]
    if missing or not families:
        sys.exit(f"error: no fixture for {', '.join(missing) or 'any family'} in {trained.FIXTURE_DIR} "
                 f"(present: {', '.join(trained.available()) or 'none'})")
    tap = LogTap.install()
    header = cli.run_header(root, args)
    print(header + f"families {', '.join(families)}, {args.seeds} seeds, {args.repeats} passes", flush=True)
    results, metas, images = [], [], {}
    for family in families:
        fam = load_family(family)
        for steps in args.steps or [int(fam.sampler["steps"])]:
            rows, meta, images[(family, steps)] = run_family(fam, steps, selected_rows(args), args, tap)
            meta["step_overhead"] = round(quality_report.compare_with_fewer_steps(rows), 4)
            results += rows
            metas.append(meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quality.json").write_text(json.dumps(
        {"setup": header, "command": shlex.join(["python", "-m", "bench.quality.quality", *sys.argv[1:]]), "families": metas, "rows": [asdict(r) for r in results]},
        indent=1))
    table = quality_report.markdown(header, metas, results)
    (args.out / "quality.md").write_text(table)
    quality_report.write_figures(args.out, metas, results, images)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
