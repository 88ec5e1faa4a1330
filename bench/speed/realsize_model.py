"""The real-size cost model: block-time curves fitted to the probes, and a run's predicted speed-up.

Per block kind (Flux double / single, a UNet width, ...), from the probes of realsize_measure at the
real width:

    t(L)        = a + b L + heads * attn(L)        the unmerged block on L tokens
    attn(L)     = alpha L^2 + beta L               one SDPA head of the block's head_dim (measured)
    merged(N)   = t(L(D)) + o N                    the block on D kept tokens + merge/unmerge

L is what the block attends over (text + image tokens for joint blocks; image tokens for Wan, Kandinsky 5
and UNet self-attention: their cross-attention is linear in N and sits in b). a, b come from the
unmerged probes (least squares, after the attention term); o (ms per image token) from the merged
probes, after the block's own curve at D and the plan: the sum of those residuals over the summed
N (so the largest probes weigh most), and never below 0 (a negative residual is the curve's own
error, not a gain from merging). Where a probe ran at the prediction's token
count the curve passes through it (two or more probes per kind); elsewhere the prediction is a
fit, and the tables say which. A call adds its non-block time (linear in N, fitted per family, for
merged and unmerged calls) and, when it re-selects, the plans (toma_core.make_plan timed at the
call's own tokens and width).

A run is the family's evaluations (realsize_setup.evaluations): merged ones cost the merged call,
others the unmerged call; every call of a CFG run has batch 2, which scales both alike on one CPU
thread, so CFG changes the counts, not the ratio.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from . import realsize_setup as rs

HEADS: dict[str, dict[str, tuple[int, int]]] = {
    "flux": {"double": (24, 128), "single": (24, 128)},
    "hunyuan_video": {"double": (24, 128), "single": (24, 128)},
    "hunyuan_video15": {"double": (16, 128)},
    "flux2": {"double": (48, 128), "single": (48, 128)},
    "flux2_klein4b": {"double": (24, 128), "single": (24, 128)},
    "flux2_klein9b": {"double": (32, 128), "single": (32, 128)},
    "zimage": {"double": (30, 128)},
    "zimage_base": {"double": (30, 128)},
    "longcat_image": {"double": (24, 128), "single": (24, 128)},
    "sdxl": {"unet640": (10, 64), "unet1280": (20, 64)},
    "sd15": {"unet320": (8, 40), "unet640": (8, 80), "unet1280": (8, 160)},
    "sd35_large": {"joint": (38, 64), "joint_last": (38, 64)},
    "qwen_image": {"double": (24, 128)},
    "wan14b": {"double": (40, 128)},
    "wan22_14b": {"double": (40, 128)},
    "wan22_14b_4step": {"double": (40, 128)},
    "wan1.3b": {"double": (12, 128)},
    "kandinsky5_lite": {"double": (28, 64)},
    "kandinsky5_pro": {"double": (32, 128)},
    "kandinsky5_image": {"double": (20, 128)},
}
"""(heads, head_dim) of each block kind's self-attention."""

SCOPES = ("block", "keys_values")
"""The scopes a prediction prices."""


@dataclass(frozen=True)
class Setting:
    """The node inputs the model prices (min_tokens 0). scope: "block" or "keys_values" (nodes/settings.py
    SCOPES; "attention" is not priced here). tile_frames: frames per tile of a video family's plan, as
    the node builds it (frame 0 alone, toma_core.video); None: the earlier accounting, spatial tiles per
    frame for D and plans timed in tiles of 2 frames (the tables above the keys/values ones)."""

    ratio: float = 0.5
    tile_size: int = 4
    start_percent: float = 0.0
    end_percent: float = 1.0
    recompute_every: int = 1
    merge_every: int = 1
    blocks: str = "auto"
    scope: str = "block"
    tile_frames: int | None = None

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope!r}: the real-size model prices {' and '.join(SCOPES)}")

    def schedule(self) -> Any:
        return rs.pack_module("toma_core").MergeSchedule(self.start_percent, self.end_percent, self.recompute_every, self.merge_every)

    def label(self) -> str:
        parts = [] if self.scope == "block" else [self.scope]
        parts.append(f"ratio {self.ratio:g}")
        if self.tile_size != 4:
            parts.append(f"tile {self.tile_size}")
        if self.start_percent or self.end_percent < 1:
            parts.append(f"window {self.start_percent:g}-{self.end_percent:g}")
        if self.merge_every > 1:
            parts.append(f"merge_every {self.merge_every}")
        if self.recompute_every > 1:
            parts.append(f"recompute {self.recompute_every}")
        if self.blocks != "auto":
            parts.append(f"blocks {self.blocks}")
        if self.tile_frames is not None:
            parts.append(f"{self.tile_frames} tile frames")
        return ", ".join(parts)


def joint(name: str, kind: str) -> bool:
    """Whether a kind attends over text + image tokens (its L includes T)."""
    return not (rs.family(name).unet or rs.family(name).cross_text) and kind != "single"


def attention_fit(points: list[dict[str, Any]], head_dim: int) -> tuple[float, float]:
    """(alpha, beta) of ms = alpha L^2 + beta L for one head of head_dim (least squares)."""
    rows = [(p["length"], p["ms"]) for p in points if p["head_dim"] == head_dim]
    if not rows:
        raise ValueError(f"no attention probe of head_dim {head_dim}: run `realsize measure` first")
    s44 = sum(L ** 4 for L, _ in rows)
    s33 = sum(L ** 3 for L, _ in rows)
    s22 = sum(L ** 2 for L, _ in rows)
    y2 = sum(ms * L ** 2 for L, ms in rows)
    y1 = sum(ms * L for L, ms in rows)
    det = s44 * s22 - s33 * s33
    if len(rows) < 2 or det == 0:
        return rows[0][1] / rows[0][0] ** 2, 0.0
    return (y2 * s22 - y1 * s33) / det, (s44 * y1 - s33 * y2) / det


def kv_attention_fit(points: list[dict[str, Any]], head_dim: int) -> tuple[float, float]:
    """(alpha, beta) of ms = alpha L_q L_kv + beta L_q for one head of head_dim with L_q queries over
    L_kv keys (least squares over the keys/values attention probes)."""
    rows = [(p["length"], p["keys"], p["ms"]) for p in points if p["head_dim"] == head_dim]
    if len(rows) < 2:
        raise ValueError(f"no keys/values attention probe of head_dim {head_dim}: run `realsize measure-kv` first")
    s11 = sum((q * k) ** 2 for q, k, _ in rows)
    s12 = sum(q * k * q for q, k, _ in rows)
    s22 = sum(q * q for q, _, _ in rows)
    y1 = sum(ms * q * k for q, k, ms in rows)
    y2 = sum(ms * q for q, _, ms in rows)
    det = s11 * s22 - s12 * s12
    return (y1 * s22 - y2 * s12) / det, (s11 * y2 - s12 * y1) / det


def kv_attention_terms(points: list[dict[str, Any]], head_dim: int, alpha: float) -> tuple[float | None, float]:
    """(kv_alpha, kv_beta) of a kind's keys/values attention, one head: the padded head's fit
    (kv_attention_fit at padded_head(head_dim)) in the units of the kind's own attention fit `alpha`,
    i.e. times alpha over the unpadded square attention timed with it (`realsize measure-kv` times
    both in one session: SDPA's speed moves between sessions on this shared machine, and the
    keys/values block must be priced against the attention its curve was fitted with). (None, 0)
    without those probes."""
    padded = padded_head(head_dim)
    if not any(p["head_dim"] == padded for p in points) or not any(p["head_dim"] == head_dim for p in points):
        return None, 0.0
    kv_alpha, kv_beta = kv_attention_fit(points, padded)
    session = alpha / kv_attention_fit(points, head_dim)[0]
    return kv_alpha * session, kv_beta * session


@dataclass
class KindCurve:
    """t(L) = a + b L + heads attn(L) of one block kind, and its merge correction at N image tokens.

    `corrections` holds, per probed N, the mean of (merged block ms - its plan - t(D + text)): the
    merge / unmerge work plus the curve's own error at the kept length, which is large where the
    fit is far from its points (a block on a few hundred tokens runs below the GEMMs' best rate).
    Between probes it is interpolated linearly in N, beyond them scaled with N from the nearest."""

    a: float
    b: float
    heads: int
    alpha: float
    beta: float
    corrections: list[tuple[int, float]] = field(default_factory=list)
    probe_lengths: list[int] = field(default_factory=list)
    kv_alpha: float | None = None
    kv_beta: float = 0.0

    def ms(self, length: float) -> float:
        return self.a + self.b * length + self.heads * (self.alpha * length ** 2 + self.beta * length)

    def kv_ms(self, length: float, keys: float) -> float:
        """The block on `length` tokens whose self-attention runs over `keys` keys in heads padded for
        the log-mass channel (kv_alpha, kv_beta: one padded head, from the keys/values attention
        probes); its other layers as t(length). The K / V merge is not in it (FamilyCost.kv_overhead)."""
        if self.kv_alpha is None:
            raise ValueError("no keys/values attention probe for this kind's padded head: run `realsize measure-kv` first")
        return self.a + self.b * length + self.heads * (self.kv_alpha * length * keys + self.kv_beta * length)

    def merge_correction(self, tokens: int) -> float:
        """ms to add to t(D + text) for a merged block on `tokens` image tokens."""
        points = self.corrections
        if not points:
            return 0.0
        if tokens <= points[0][0]:
            return points[0][1] * tokens / points[0][0]
        for (n0, c0), (n1, c1) in zip(points, points[1:]):
            if tokens <= n1:
                return c0 + (c1 - c0) * (tokens - n0) / (n1 - n0)
        return points[-1][1] * tokens / points[-1][0]


@dataclass
class FamilyCost:
    """Everything measured for one family: curves per kind, non-block fits, plan times, noise."""

    name: str
    curves: dict[str, KindCurve]
    nonblock: dict[str, tuple[float, float]]
    probe_tokens: list[int]
    noise: float
    plans: dict[str, float]


def _linear(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of y = a + b x by least squares; through the origin with one distinct x."""
    xs = {x for x, _ in points}
    if len(xs) < 2:
        x0 = next(iter(xs))
        return 0.0, statistics.mean(y for _, y in points) / x0
    mx = statistics.mean(x for x, _ in points)
    my = statistics.mean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def padded_head(head_dim: int) -> int:
    """e' of the keys/values scope's padded heads (toma_core.cost.padded_head)."""
    return rs.pack_module("toma_core.cost").padded_head(head_dim)


def block_length(name: str, kind: str, tokens: int) -> int:
    """L of a block kind on `tokens` image tokens."""
    return tokens + (rs.family(name).text_len if joint(name, kind) or kind == "single" else 0)


def fit_family(name: str, cache: dict[str, Any]) -> FamilyCost:
    """Curves of every kind of `name` from the cached probes and attention probes."""
    probed = rs.family(name).probed
    records = [r for r in cache["probes"] if r["family"] == probed]
    if not records:
        raise ValueError(f"no probe of {probed}: run `python -m bench.speed.realsize measure --families {probed}`")
    curves = {}
    for kind, (heads, head_dim) in HEADS[name].items():
        alpha, beta = attention_fit(cache["attention"], head_dim)
        runs = [(length, ms) for r in records for k, length, ms in r["unmerged"]["blocks"] if k == kind]
        if not runs:
            continue
        curve = KindCurve(0.0, 0.0, heads, alpha, beta, probe_lengths=sorted({length for length, _ in runs}))
        curve.a, curve.b = _linear([(length, ms - heads * (alpha * length ** 2 + beta * length)) for length, ms in runs])
        curve.kv_alpha, curve.kv_beta = kv_attention_terms(cache.get("kv_attention", []), head_dim, alpha)
        curves[kind] = curve
    residuals: dict[tuple[str, int], list[float]] = {}
    for r in records:
        for kind, n, residual in _merge_residuals(name, r, curves):
            residuals.setdefault((kind, n), []).append(residual)
    for (kind, n), values in sorted(residuals.items()):
        curves[kind].corrections.append((n, statistics.mean(values)))
    nonblock = {label: _linear([(r["tokens"], r[label]["call_ms"] - sum(ms for *_, ms in r[label]["blocks"])) for r in records])
                for label in ("unmerged", "merged")}
    noise = _noise(records)
    return FamilyCost(name, curves, nonblock, sorted({r["tokens"] for r in records}), noise, cache.get("plans", {}))


def _merge_residuals(name: str, record: dict[str, Any], curves: dict[str, KindCurve]) -> list[tuple[str, int, float]]:
    """Per merged block run of a probe: (kind, N, its ms - the plan it built - the curve at its kept length)."""
    fam = rs.family(name)
    seen: set[int] = set()
    out = []
    grid = rs.Grid(*record["grid"][1:], record["grid"][0])
    for kind, length, ms in record["merged"]["blocks"]:
        if kind not in curves:
            continue
        n = length if fam.unet else record["tokens"]
        text = length - n
        level = grid.level_of(n) if fam.unet else grid
        d = rs.kept_tokens(level, record["ratio"], record["tile_size"])
        plan = 0.0
        if n not in seen:
            plan = float(record["plan_ms"].get(str(n), 0.0))
            seen.add(n)
        out.append((kind, n, ms - plan - curves[kind].ms(d + text)))
    return out


def _noise(records: list[dict[str, Any]]) -> float:
    """Largest relative spread (max / min - 1) of a call's time over the rounds of one grid."""
    spreads = []
    by_grid: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        by_grid.setdefault(tuple(r["grid"]), []).append(r)
    for group in by_grid.values():
        for label in ("unmerged", "merged"):
            values = [r[label]["call_ms"] for r in group]
            if len(values) > 1:
                spreads.append(max(values) / min(values) - 1)
    return max(spreads) if spreads else float("nan")


# ------------------------------------------------------------------------------ prediction


@dataclass
class Prediction:
    """A run's predicted times (ms of model calls, batch included) and what it merged."""

    family: str
    resolution: str
    setting: Setting
    speedup: float
    unmerged_ms: float
    merged_ms: float
    evaluations: int
    merged_evaluations: int
    blocks_merged: int
    blocks: int
    per_block_speedup: dict[str, float]
    measured_tokens: bool


def predict(cost: FamilyCost, resolution: str, setting: Setting, frames: int = 81, steps: int | None = None,
            sampler: str | None = None, scheduler: str | None = None, cfg: float | None = None,
            reduced: bool = False, plan_ms: Any = None, kv_ms: Any = None) -> Prediction:
    """The speed-up of `setting` on the family's run at `resolution` (width x height of RESOLUTIONS,
    frames for video), from the fitted curves. plan_ms(grid, channels, ratio, tile, tile_frames) -> ms
    of one plan; kv_ms(grid, channels, heads, text, ratio, tile, tile_frames) -> ms of one keys/values
    block's K / V merge (scope keys_values only)."""
    name = cost.name
    width, height = rs.RESOLUTIONS[resolution]
    grid = rs.grid_for(name, width, height, frames)
    sites = rs.block_sites(name, setting.blocks, reduced=reduced)
    unmerged, merged, plans = _call_times(cost, grid, sites, setting, plan_ms, kv_ms)
    evals = rs.evaluations(name, resolution, setting.schedule(), steps, sampler, scheduler)
    batch = rs.calls_per_evaluation(name, cfg)
    total_u = batch * unmerged * len(evals)
    total_m = batch * sum(merged + (plans if e.reselect else 0.0) if e.merge else unmerged for e in evals)
    per_block = {}
    for kind in {s.kind for s in sites}:
        level = grid.level(next(s.level for s in sites if s.kind == kind))
        per_block[kind] = cost.curves[kind].ms(block_length(name, kind, level.tokens)) / merged_block_ms(cost, kind, level, setting, kv_ms)
    return Prediction(
        name, resolution, setting, total_u / total_m, total_u, total_m, len(evals), sum(e.merge for e in evals),
        sum(s.selected for s in sites), len(sites), per_block, grid.tokens in cost.probe_tokens,
    )


def merged_block_ms(cost: FamilyCost, kind: str, level: rs.Grid, setting: Setting, kv_ms: Any = None) -> float:
    """ms of one merged block of `kind` on `level`'s image tokens, its plan not counted: scope block,
    the curve at the kept length plus the merge correction; scope keys_values, the curve with its
    self-attention over the kept keys in padded heads (KindCurve.kv_ms) plus the K / V merge
    (kv_ms, measured at the block's width and heads)."""
    name = cost.name
    n = level.tokens
    length = block_length(name, kind, n)
    d = rs.kept_tokens(level, setting.ratio, setting.tile_size, setting.tile_frames if rs.family(name).video else None)
    curve = cost.curves[kind]
    if setting.scope == "block":
        return curve.ms(length - n + d) + curve.merge_correction(n)
    if kv_ms is None:
        raise ValueError("scope keys_values needs kv_ms, the K / V merge's time (realsize.KvTimes)")
    heads, _ = HEADS[name][kind]
    tile_frames = setting.tile_frames if rs.family(name).video else None
    overhead = kv_ms(level, _channels(name, kind), heads, length - n, setting.ratio, setting.tile_size, tile_frames)
    return curve.kv_ms(length, length - n + d) + overhead


def _call_times(cost: FamilyCost, grid: rs.Grid, sites: list[rs.BlockSite], setting: Setting, plan_ms: Any,
                kv_ms: Any = None) -> tuple[float, float, float]:
    """(unmerged call, merged call without plans, the plans of a re-selecting call) in ms."""
    name = cost.name
    a_u, b_u = cost.nonblock["unmerged"]
    a_m, b_m = cost.nonblock["merged"]
    unmerged = a_u + b_u * grid.tokens
    merged = a_m + b_m * grid.tokens
    levels: dict[int, int] = {}
    for site in sites:
        level = grid.level(site.level)
        curve = cost.curves[site.kind]
        length = block_length(name, site.kind, level.tokens)
        unmerged += curve.ms(length)
        if site.selected:
            merged += merged_block_ms(cost, site.kind, level, setting, kv_ms)
            levels[site.level] = _channels(name, site.kind)
        else:
            merged += curve.ms(length)
    tile_frames = setting.tile_frames if rs.family(name).video else None
    plans = sum(plan_ms(grid.level(lv), c, setting.ratio, setting.tile_size, tile_frames) for lv, c in levels.items()) if plan_ms else 0.0
    return unmerged, merged, plans


def _channels(name: str, kind: str) -> int:
    if kind.startswith("unet"):
        return int(kind.removeprefix("unet"))
    heads, head_dim = HEADS[name][kind]
    return heads * head_dim
