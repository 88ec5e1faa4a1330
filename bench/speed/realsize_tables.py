"""Markdown tables of the real-size cost model (bench/speed/realsize.py `table`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import realsize_model as model
from . import realsize_setup as rs


def settings_from(path: Path | None) -> list[model.Setting]:
    """Settings listed in a JSON file (a list of Setting fields), e.g. the search's Pareto front."""
    if path is None:
        return []
    return [model.Setting(**entry) for entry in json.loads(path.read_text())]


def resolutions_of(name: str) -> list[str]:
    """The family's usual size (its template's) and a larger one: 480p / 720p for video, 1024 / 2048 px for images."""
    fam = rs.family(name)
    usual = ["480p", "720p"] if fam.video else ["1024", "2048"]
    return usual if fam.resolution in usual else [fam.resolution, usual[-1]]


def run_text(name: str, resolution: str) -> str:
    fam = rs.family(name)
    calls = rs.calls_per_evaluation(name)
    frames = f", {fam.frames} frames" if fam.video else ""
    return (f"{fam.steps} steps {fam.sampler} / {fam.scheduler}, {rs.sampling_text(name, resolution)}, "
            f"cfg {fam.cfg:g} ({calls} sample{'s' if calls > 1 else ''} per call){frames}")


def family_table(cache: dict[str, Any], name: str, resolution: str, settings: list[model.Setting], plans: Any) -> str:
    """One family at one resolution: a row per setting."""
    cost = model.fit_family(name, cache)
    fam = rs.family(name)
    width, height = rs.RESOLUTIONS[resolution]
    grid = rs.grid_for(name, width, height, fam.frames)
    measured = grid.tokens in cost.probe_tokens
    tokens = (f"latent {grid.height} x {grid.width}: {grid.level(2).tokens:,} tokens at the 1/2 level, {grid.level(4).tokens:,} at 1/4"
              if fam.unet else f"{grid.tokens:,} image tokens + {fam.text_len} text")
    head = (f"**{fam.title}, {resolution}** ({width} x {height}; {tokens}): {run_text(name, resolution)}. Block times "
            + ("measured at this token count." if measured else
               f"fitted (a + b L + heads x SDPA(L)) from probes at {', '.join(f'{n:,}' for n in cost.probe_tokens)} tokens.")
            + f" Clock spread over repeats: {_pct(cost.noise)}.")
    rows = ["| setting | evaluations merged | blocks merged | per merged block | predicted speed-up |", "|---|---:|---:|---|---:|"]
    for s in settings:
        p = model.predict(cost, resolution, s, fam.frames, plan_ms=plans)
        per = ", ".join(f"{k} {v:.2f}x" for k, v in sorted(p.per_block_speedup.items()))
        rows.append(f"| {s.label()} | {p.merged_evaluations}/{p.evaluations} | {p.blocks_merged}/{p.blocks} | {per} | **{p.speedup:.2f}x** |")
    return head + "\n\n" + "\n".join(rows)


def _pct(x: float) -> str:
    return "one round" if x != x else f"{x * 100:.1f} %"


def all_tables(cache: dict[str, Any], families: list[str], plans: Any, settings: list[model.Setting]) -> str:
    out = []
    for name in families:
        probed = rs.family(name).probed
        if not any(r["family"] == probed for r in cache["probes"]):
            out.append(f"**{rs.family(name).title}**: not measured yet (`python -m bench.speed.realsize measure --families {probed}`).")
            continue
        for resolution in resolutions_of(name):
            out.append(family_table(cache, name, resolution, settings, plans))
    return "\n\n".join(out) + "\n"


def probe_table(cache: dict[str, Any], name: str) -> str:
    """The measured blocks of one family: kind, tokens, unmerged / merged ms, the fit at them and the
merge correction (KindCurve.merge_correction) at their N."""
    cost = model.fit_family(name, cache)
    rows = ["| family | kind | C | image tokens N | block tokens L | unmerged ms | merged ms (ratio 0.5) | fit unmerged ms | merge correction ms |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in cache["probes"] if r["family"] == name):
        merged = {}
        for kind, length, ms in r["merged"]["blocks"]:
            merged.setdefault((kind, length), []).append(ms)
        for kind, length, ms in r["unmerged"]["blocks"]:
            c = model._channels(name, kind)
            n = length if rs.family(name).unet else r["tokens"]
            m = merged.get((kind, length), [float("nan")])[0]
            curve = cost.curves[kind]
            rows.append(f"| {name} | {kind} | {c} | {n:,} | {length:,} | {ms:.0f} | {m:.0f} | {curve.ms(length):.0f} | "
                        f"{curve.merge_correction(n):+.0f} |")
    return "\n".join(rows)


def short_run(name: str) -> str:
    """E.g. '20 steps euler / simple, cfg 3.5 (CFG), 81 frames'."""
    fam = rs.family(name)
    frames = f", {fam.frames} frames" if fam.video else ""
    return f"{fam.steps} steps {fam.sampler} / {fam.scheduler}, cfg {fam.cfg:g}{frames}"


def scope_table(cache: dict[str, Any], runs: list[tuple[str, str]], ratios: list[float], starts: list[float], tile: int,
                tile_frames: int, plans: Any, kv_ms: Any) -> str:
    """Block against keys/values merging: a row per run and start_percent, a column per ratio with
    both scopes' predicted speed-ups (tile `tile`, video families in tiles of `tile_frames` frames as
    the node builds them, blocks auto, end 1)."""
    head = "| model (run) | size | start_percent | steps merged | " + " | ".join(f"ratio {r:g}: block / keys_values" for r in ratios) + " |"
    rows = [head, "|---|---|---:|---:|" + "---:|" * len(ratios)]
    for name, resolution in runs:
        fam = rs.family(name)
        cost = model.fit_family(name, cache)
        frames = tile_frames if fam.video else None
        for start in starts:
            cells, merged = [], ""
            for ratio in ratios:
                pair = []
                for scope in model.SCOPES:
                    setting = model.Setting(ratio, tile, start, scope=scope, tile_frames=frames)
                    p = model.predict(cost, resolution, setting, fam.frames, plan_ms=plans, kv_ms=kv_ms)
                    pair.append(f"{p.speedup:.2f}x")
                    merged = f"{p.merged_evaluations}/{p.evaluations}"
                cells.append(" / ".join(pair))
            rows.append(f"| {fam.title} ({short_run(name)}) | {resolution} | {start:g} | {merged} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def kv_probe_table(cache: dict[str, Any], kv_ms: Any) -> str:
    """The blocks timed with a scope in one session (realsize measure-kv --blocks) against the model's
    merged block at their size (model.merged_block_ms: keys/values, the block's curve with its
    attention over the kept keys in padded heads plus the K / V merge, realsize.KvTimes; block, the
    curve at D plus the merge correction): a block's speed-up, unmerged over merged, measured (the
    first merged block with its plan taken out) and predicted."""
    rows = ["| family | scope | kind | image tokens N | keys after merging | unmerged ms | merged ms (ratio 0.5) | measured | predicted | error |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in cache.get("kv_probes", []):
        name = r["family"]
        cost = model.fit_family(name, cache)
        grid = rs.Grid(*r["grid"][1:], r["grid"][0])
        scope = r.get("scope", "keys_values")
        setting = model.Setting(r["ratio"], r["tile_size"], scope=scope,
                                tile_frames=rs.pack_module("nodes.settings").NODE_TILE_FRAMES if rs.family(name).video else None)
        n = r["tokens"]
        d = rs.kept_tokens(grid, setting.ratio, setting.tile_size, setting.tile_frames)
        for i, ((kind, length, plain), (_, _, ms)) in enumerate(zip(r["unmerged"]["blocks"], r["merged"]["blocks"])):
            merged = ms - (float(r["plan_ms"].get(str(n), 0.0)) if i == 0 else 0.0)
            predicted = cost.curves[kind].ms(length) / model.merged_block_ms(cost, kind, grid, setting, kv_ms)
            measured = plain / merged
            rows.append(f"| {name} | {scope} | {kind} | {n:,} | {length - n + d:,} | {plain:.0f} | {merged:.0f} | {measured:.2f}x | "
                        f"{predicted:.2f}x | {100 * (predicted / measured - 1):+.1f} % |")
    return "\n".join(rows)
