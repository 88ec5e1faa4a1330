"""Predicted real-size end-to-end speed-ups of the quality studies' rows (quality.py, video_quality.py).

A fixture stands for a real model (``TARGETS``: Flux.1-dev and SDXL at 1024 and 2048 px, Wan 2.2 14B at
832 x 480 x 81). A row is priced by what it runs, never by the fixture's clock:

- its ToMA node, through the real-size cost model (bench/speed/realsize_model.py ``predict``, real
  widths and token counts, scope "block" or "keys_values", "auto" as the family's own, a video's tile_frames) at the regime's
  step count. A fixture's block list (``auto`` included) is mapped to the real depth by position,
  fixture block i of n -> the i-th n-th of the real blocks, so the prediction prices the blocks whose
  quality was measured (UNet lists are priced as they are). Rows without the log-mass weight
  (key_mass False) are priced as with it (the model prices the padded heads). Where the cost model's
  cache has no keys/values probes yet, scope keys_values falls back to ``keys_values_speedup``, a
  stand-in from the fitted attention terms, and ``Pricer.standin`` says so;
- its step count and its step cache: ref_steps / the model calls that ran the model's blocks (a
  call a cache skips costs nothing; the cache's own work is not priced);
- a stack (ToMA + a cache): call by call, from the share of its computed calls ToMA merged (its run
  line): a merged call at the cost model's merged-call time, the others unmerged (a stack whose
  cache keeps ToMA from merging, as TeaCache's and MagCache's own Flux forward do, is priced as the
  cache alone).

The run priced (``Target.run``): 20 or more steps, the real model's template (Flux.1-dev cfg 1,
guidance-distilled; SDXL cfg 7; Wan 2.2 14B's 20-step path with CFG, realsize family wan22_14b); fewer
steps, the few-step run at that step count with cfg 1 (Wan: the LightX2V 4-step path, wan22_14b_4step).
A CFG run batches cond and uncond, which scales merged and unmerged calls alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..speed import realsize
from ..speed import realsize_model as model
from ..speed import realsize_setup as rs


@dataclass(frozen=True)
class Target:
    """A real model a fixture stands for: the prediction's key, cost-model family of a full-step and of a
    few-step run, resolution, frames, and the real block count of each stream the fixture's block lists
    map onto."""

    key: str
    family: str
    few_step: str
    resolution: str
    frames: int
    depths: tuple[tuple[str, int], ...]

    def run(self, steps: int) -> tuple[str, float | None]:
        """(realsize family, cfg) of a regime of `steps` steps (cfg None: the family's own)."""
        return (self.family, None) if steps >= 20 else (self.few_step, 1.0)


_FLUX = (("double", 19), ("single", 38))
TARGETS: dict[str, tuple[Target, ...]] = {
    "flux": (Target("Flux.1-dev 1024", "flux", "flux", "1024", 1, _FLUX),
             Target("Flux.1-dev 2048", "flux", "flux", "2048", 1, _FLUX)),
    "sdxl": (Target("SDXL 1024", "sdxl", "sdxl", "1024", 1, ()), Target("SDXL 2048", "sdxl", "sdxl", "2048", 1, ())),
    "wan": (Target("Wan 2.2 14B 480p x 81", "wan22_14b", "wan22_14b_4step", "480p", 81, (("blocks", 40),)),),
}
"""Per fixture family, the real runs its rows are priced on (depths: Flux.1-dev's 19 double + 38
single blocks, Wan 14B's 40; none for a UNet, whose block lists are priced as they are)."""

FIXTURE_DEPTHS: dict[str, tuple[tuple[str, int], ...]] = {"flux": (("double", 4), ("single", 8)), "wan": (("blocks", 6),)}
"""The fixtures' streams (harness/trained.py FLUX_CONFIG, harness/trained_video.py WAN_CONFIG)."""


def real_blocks(blocks: str, fixture: str, target: Target) -> str:
    """A fixture's `blocks` setting as the real model's block list, by position ("all" unchanged)."""
    if not target.depths or blocks.strip().lower() == "all":
        return blocks
    parse = rs.pack_module("nodes.machinery.dit_blocks").parse_dit_blocks
    chosen = parse(blocks, dict(FIXTURE_DEPTHS[fixture]), video=fixture == "wan")
    real = {group: set() for group, _ in target.depths}
    for (group, n), (_, depth) in zip(FIXTURE_DEPTHS[fixture], target.depths):
        for i in getattr(chosen, group):
            real[group].update(range(i * depth // n, (i + 1) * depth // n))
    picked = rs.pack_module("nodes.machinery.dit_blocks").DitBlocks(tuple((g, frozenset(s)) for g, s in real.items()))
    return picked.describe()


def toma_inputs(chain: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The inputs (node defaults filled in) of the row's ToMA node, None when it has none."""
    return next((link["inputs"] for link in chain if link["node"].startswith("ToMAPatch")), None)


def keys_values_speedup(cost: model.FamilyCost, resolution: str, setting: model.Setting, frames: int, steps: int,
                        plan_ms: Any, key_mass: bool) -> float:
    """STAND-IN pricing of scope keys_values from the cost model's own fitted terms, for a cache without
    the keys/values probes (`realsize measure-kv`): a selected block keeps its per-token time (a + b L) and its
    attention runs L queries over L_kv = D + text keys, heads * (alpha L L_kv e'/e + beta L), with e'/e
    the head padded for the log-mass channel (e + 1 rounded up to a multiple of 8; 1 without
    key_mass); the call's plans as for the block merge; the K / V merge itself is not priced."""
    name = cost.name
    width, height = rs.RESOLUTIONS[resolution]
    grid = rs.grid_for(name, width, height, frames)
    a, b = cost.nonblock["unmerged"]
    unmerged = merged = a + b * grid.tokens
    levels: dict[int, int] = {}
    for site in rs.block_sites(name, setting.blocks):
        level = grid.level(site.level)
        n = level.tokens
        curve = cost.curves[site.kind]
        length = model.block_length(name, site.kind, n)
        unmerged += curve.ms(length)
        if not site.selected:
            merged += curve.ms(length)
            continue
        heads, head = model.HEADS[name][site.kind]
        pad = (-(-(head + 1) // 8) * 8) / head if key_mass else 1.0
        kv = length - n + rs.kept_tokens(level, setting.ratio, setting.tile_size, setting.tile_frames)
        merged += curve.a + curve.b * length + curve.heads * (curve.alpha * length * kv * pad + curve.beta * length)
        levels[site.level] = heads * head
    plans = sum(plan_ms(grid.level(lv), c, setting.ratio, setting.tile_size, setting.tile_frames) for lv, c in levels.items())
    evals = rs.evaluations(name, resolution, setting.schedule(), steps)
    total_u = unmerged * len(evals)
    total_m = sum(merged + (plans if e.reselect else 0.0) if e.merge else unmerged for e in evals)
    return total_u / total_m


class Pricer:
    """Predicts rows of one fixture family: the fitted costs, plan and K / V merge times loaded once.
    standin: True once a keys/values row was priced by the stand-in (keys_values_speedup)."""

    def __init__(self, fixture: str) -> None:
        self.fixture = fixture
        self.targets = TARGETS[fixture]
        self.cache = realsize.load_cache(realsize.CACHE)
        self.plans = realsize.PlanTimes(self.cache, "cpu")
        self.kvs = realsize.KvTimes(self.cache, "cpu")
        self.costs = {name: model.fit_family(name, self.cache) for t in self.targets for name in (t.family, t.few_step)}
        self.standin = False

    def toma(self, target: Target, inputs: dict[str, Any], ref_steps: int) -> float:
        """The predicted speed-up of a ToMA node's inputs on `target` at ref_steps steps (see the module docstring)."""
        name, cfg = target.run(ref_steps)
        scope = inputs.get("scope", "auto")
        kv = (rs.pack_family(name).scope if scope == "auto" else scope) == "keys_values"
        video = rs.family(name).video
        setting = model.Setting(inputs["ratio"], inputs["tile_size"], inputs["start_percent"], inputs["end_percent"],
                                inputs["recompute_every"], inputs["merge_every"],
                                real_blocks(inputs.get("blocks", "auto"), self.fixture, target),
                                scope="keys_values" if kv else "block", tile_frames=inputs.get("tile_frames") if video else None)
        cost = self.costs[name]
        try:
            return model.predict(cost, target.resolution, setting, target.frames, ref_steps, cfg=cfg, plan_ms=self.plans,
                                 kv_ms=self.kvs).speedup
        except ValueError:
            if not kv or any(c.kv_alpha is not None for c in cost.curves.values()):
                raise
            self.standin = True
            return keys_values_speedup(cost, target.resolution, setting, target.frames, ref_steps, self.plans,
                                       inputs.get("key_mass", True))

    def price(self, chain: list[dict[str, Any]], ref_steps: int, computed_steps: float,
              merged_share: float | None = None) -> dict[str, float]:
        """{target key: predicted end-to-end speed-up} of a row that ran `computed_steps` model calls;
        {} when no call ran the model's blocks (a cache that reused one output for every step: no
        price, since nothing was computed). A stack (ToMA and a cache) with `merged_share`, the share
        of its computed calls ToMA merged (its run line), is priced call by call: each merged call at
        the cost model's merged-call time (the setting on every step), the others at the unmerged time."""
        if computed_steps <= 0:
            return {}
        inputs = toma_inputs(chain)
        calls = ref_steps / computed_steps
        cached = any(not link["node"].startswith("ToMAPatch") for link in chain)
        out = {}
        for target in self.targets:
            if inputs is None or inputs["ratio"] == 0 or merged_share == 0:
                merged = 1.0
            elif cached and merged_share is not None:
                every_step = self.toma(target, inputs | {"start_percent": 0.0, "end_percent": 1.0}, ref_steps)
                merged = 1.0 / (1.0 - merged_share + merged_share / every_step)
            else:
                merged = self.toma(target, inputs, ref_steps)
            out[target.key] = round(merged * calls, 3)
        return out
