"""Property-based tests (hypothesis) of the pure layer: block-list strings, settings, merge plans on
any grid (1 x n, not divisible by the tile, smaller than a tile) and video plans over frame segments.

Invariants: ratio 0 is the identity; D is what make_plan documents (the sum over tiles of
round(n_real (1 - ratio)), at least 1 per tile); every output is finite; a bad value raises a
ValueError that names it, and nothing else ever escapes. Examples are derandomized by the "ci"
profile of tests/conftest.py (HYPOTHESIS_PROFILE=explore draws new random ones).
"""

from __future__ import annotations

import math
import re

import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness.pack import pack_module  # noqa: E402
from toma_core import (  # noqa: E402
    BUDGETS,
    RATIO_RANGE,
    SIMILARITIES,
    UNMERGES,
    MergeSchedule,
    SigmaWindow,
    TileGrid,
    make_plan,
)
from toma_core.video import Segment, frame_runs, make_video_plan  # noqa: E402

dit_blocks = pack_module("nodes.machinery.dit_blocks")
unet_blocks = pack_module("nodes.families.unet_blocks")
settings_mod = pack_module("nodes.settings")
registry = pack_module("nodes.families.registry")
input_checks = pack_module("nodes.node.input_checks")

FEW, SOME, MANY = 50, 150, 300
"""max_examples per property, sized by the cost of one example (the whole file: ~40 s of CPU on one core)."""

NOT_NUMBERS = st.sampled_from([None, "0.5", [], float("nan"), float("inf"), -float("inf"), True])


def names(error: ValueError, *fields: str) -> bool:
    """The message names one of `fields` as `field=` or in a sentence."""
    return any(re.search(rf"\b{re.escape(f)}\b", str(error)) for f in fields)


# Block lists ------------------------------------------------------------------------------------

SIZES = st.dictionaries(
    st.sampled_from(["double", "single", "blocks", "layers"]), st.integers(1, 40), min_size=1, max_size=3,
)
SPEC_TEXT = st.text(alphabet="doublesingeaptmrxy:-,0123456789 _\t", max_size=30)


@st.composite
def dit_spec(draw: st.DrawFn, sizes: dict[str, int]) -> str:
    """A well-formed block list for `sizes`: items group[:lo-hi], bare ranges continuing a group."""
    items = []
    for _ in range(draw(st.integers(1, 4))):
        group = draw(st.sampled_from(sorted(sizes)))
        lo = draw(st.integers(0, sizes[group] - 1))
        hi = draw(st.integers(lo, sizes[group] - 1))
        form = draw(st.sampled_from(["group", "one", "span", "span+bare"]))
        if form == "group":
            items.append(group)
        elif form == "one":
            items.append(f"{group}:{lo}")
        else:
            items.append(f"{group}: {lo} - {hi}")
            if form == "span+bare":
                items.append(str(draw(st.integers(0, sizes[group] - 1))))
    return ",".join(items)


@settings(max_examples=MANY)
@given(SIZES, st.data())
def test_dit_block_lists_parse_and_round_trip(sizes: dict[str, int], data: st.DataObject) -> None:
    spec = data.draw(st.one_of(dit_spec(sizes), st.sampled_from(["all", "AUTO", " auto "])))
    parsed = dit_blocks.parse_dit_blocks(spec, sizes)
    assert [g for g, _ in parsed.groups] == list(sizes)
    assert all(i in range(sizes[g]) for g, indices in parsed.groups for i in indices)
    assert parsed.count == sum(len(indices) for _, indices in parsed.groups) > 0
    assert dit_blocks.parse_dit_blocks(parsed.describe(), sizes) == parsed


@settings(max_examples=MANY)
@given(SIZES, SPEC_TEXT)
def test_dit_block_lists_accept_or_name_the_value(sizes: dict[str, int], spec: str) -> None:
    try:
        parsed = dit_blocks.parse_dit_blocks(spec, sizes)
    except ValueError as error:
        assert str(error).startswith(f"blocks={spec!r}")
    else:
        assert all(i in range(sizes[g]) for g, indices in parsed.groups for i in indices)


@st.composite
def unet_spec(draw: st.DrawFn) -> str:
    items = []
    for _ in range(draw(st.integers(1, 4))):
        group = draw(st.sampled_from(unet_blocks.GROUPS))
        lo = draw(st.integers(0, 12))
        hi = draw(st.integers(lo, 12))
        items.append(draw(st.sampled_from([group, f"{group}:{lo}", f"{group}:{lo}-{hi}", f"{group}:{lo},{hi}"])))
    return ",".join(items)


@settings(max_examples=MANY)
@given(st.one_of(unet_spec(), st.sampled_from(["auto", "all", "", "ALL "])))
def test_unet_block_lists_parse_and_round_trip(spec: str) -> None:
    parsed = unet_blocks.parse_unet_blocks(spec)
    assert unet_blocks.parse_unet_blocks(parsed.describe()) == parsed


@settings(max_examples=MANY)
@given(st.text(alphabet="inputmdlerauo:-,0123456789 ", max_size=30))
def test_unet_block_lists_accept_or_name_the_value(spec: str) -> None:
    try:
        parsed = unet_blocks.parse_unet_blocks(spec)
    except ValueError as error:
        assert str(error).startswith(f"blocks={spec!r}")
    else:
        assert parsed.mode in ("auto", "all", "list")


@settings(max_examples=MANY)
@given(st.one_of(SPEC_TEXT, unet_spec(), st.text(alphabet="inputmdlerauoblcks:-,0123456789 ", max_size=30)))
def test_queued_block_check_refuses_only_what_every_family_refuses(spec: str) -> None:
    """The check of a queued prompt (node/input_checks.py) never refuses a list some model takes:
    a list it refuses, every family refuses when the node runs (the settings, then the family's
    parser: a DiT with 40 blocks per group, the UNet)."""
    parsers = [unet_blocks.parse_unet_blocks] + [
        lambda text, groups=f.groups: dit_blocks.parse_dit_blocks(text, dict.fromkeys(groups, 40))
        for f in registry.FAMILIES if f.streams
    ]
    accepted = []
    for parse in parsers:
        try:
            settings_mod.ToMASettings(blocks=spec)
            parse(spec)
        except ValueError:
            continue
        accepted.append(parse)
    refused = input_checks.queued_input_errors(spec, "auto")
    assert not (refused and accepted), (refused, accepted)


# Settings -----------------------------------------------------------------------------------------

GOOD = {
    "ratio": st.floats(*RATIO_RANGE),
    "tile_size": st.integers(*settings_mod.TILE_SIZE_RANGE),
    "min_tokens": st.one_of(st.integers(*settings_mod.MIN_TOKENS_RANGE), st.sampled_from(["auto", "AUTO"])),
    "temperature": st.floats(*settings_mod.TEMPERATURE_RANGE),
    "tile_frames": st.integers(*settings_mod.TILE_FRAMES_RANGE),
    "similarity": st.sampled_from(SIMILARITIES),
    "budget": st.sampled_from(BUDGETS),
    "unmerge": st.sampled_from(UNMERGES),
    "scope": st.sampled_from(settings_mod.SCOPES),
    "blocks": st.sampled_from(["auto", "all", "double:0-3"]),
    "verbose": st.booleans(),
    "proportional_attention": st.booleans(),
}
BAD = {
    "ratio": st.one_of(NOT_NUMBERS, st.floats(0.951, 1e9), st.floats(-1e9, -1e-9)),
    "tile_size": st.one_of(NOT_NUMBERS, st.integers(-5, 1), st.integers(33, 10**6), st.just(4.0)),
    "min_tokens": st.one_of(NOT_NUMBERS, st.integers(-(10**6), -1), st.just(2**20 + 1)),
    "temperature": st.one_of(NOT_NUMBERS, st.floats(1.001, 1e9), st.floats(-1e9, -1e-9)),
    "tile_frames": st.one_of(NOT_NUMBERS, st.integers(-5, 0), st.integers(17, 100)),
    "similarity": st.sampled_from(["", "COSINE", "dot", None]),
    "budget": st.sampled_from(["", "global", None]),
    "unmerge": st.sampled_from(["", "soft", None]),
    "scope": st.sampled_from(["", "blocks", None]),
    "blocks": st.sampled_from(["", "  ", None, 3]),
    "verbose": st.sampled_from([0, 1, "yes", None]),
    "proportional_attention": st.sampled_from([0, 1, "no", None]),
}


@settings(max_examples=MANY)
@given(st.data(), st.sets(st.sampled_from(sorted(GOOD)), max_size=3))
def test_settings_accept_the_ranges_and_name_a_bad_value(data: st.DataObject, bad: set[str]) -> None:
    values = {name: data.draw((BAD if name in bad else GOOD)[name], label=name) for name in GOOD}
    try:
        made = settings_mod.ToMASettings(**values)
    except ValueError as error:
        assert bad and names(error, *bad), (error, bad)
    else:
        assert not bad
        assert "\n" not in made.describe() and made.merges == (made.ratio > 0)


PERCENT = st.floats(0, 1)
STEPS = st.one_of(st.integers(1, 12), st.integers(1, 12).map(float))


@settings(max_examples=MANY)
@given(
    st.one_of(PERCENT, NOT_NUMBERS, st.floats(1.001, 10)), st.one_of(PERCENT, NOT_NUMBERS, st.floats(-10, -0.001)),
    st.one_of(STEPS, NOT_NUMBERS, st.integers(-3, 0), st.just(2.5)), st.one_of(STEPS, NOT_NUMBERS, st.just(0)),
)
def test_schedule_accepts_or_names_the_value(start: object, end: object, recompute: object, every: object) -> None:
    try:
        schedule = MergeSchedule(start, end, recompute, every)
    except ValueError as error:
        assert names(error, "start_percent", "end_percent", "recompute_every", "merge_every")
    else:
        assert isinstance(schedule.recompute_every, int) and isinstance(schedule.merge_every, int)
        assert schedule.merged_steps_per_plan == math.ceil(schedule.recompute_every / schedule.merge_every)


@settings(max_examples=MANY)
@given(
    st.lists(st.floats(0.01, 100), min_size=2, max_size=30, unique=True), PERCENT, PERCENT,
    st.integers(1, 6), st.integers(1, 6),
)
def test_schedule_merges_the_window_every_nth_step(
    sigmas: list[float], start: float, end: float, recompute: int, every: int,
) -> None:
    """Of the steps in the window, the first and every merge_every-th after it merge; a new epoch
    starts every merged_steps_per_plan merged steps; evaluations at one sigma share a decision."""
    sigmas = sorted(sigmas, reverse=True) + [0.0]
    schedule = MergeSchedule(start, end, recompute, every)
    span = sigmas[0]
    window = schedule.window(lambda p: span * (1 - p))
    decisions = [schedule.decide(s, sigmas, window) for s in sigmas[:-1]]
    inside = [i for i, s in enumerate(sigmas[:-1]) if window.contains(s)]
    merged = [d.step for d in decisions if d.merge]
    assert merged == [i for i in inside if (i - inside[0]) % every == 0] if inside else merged == []
    assert all(d.skipped == (d.step in inside and d.step not in merged) for d in decisions)
    epochs = [d.epoch for d in decisions if d.merge]
    assert epochs == [n // schedule.merged_steps_per_plan for n in range(len(merged))]
    assert [d.reselect for d in decisions if d.merge] == [n % schedule.merged_steps_per_plan == 0 for n in range(len(merged))]
    assert all(schedule.decide(s, sigmas, window) == d for s, d in zip(sigmas, decisions))
    if end <= start:
        assert window == SigmaWindow(0.0, float("inf")) and not merged


# Merge plans --------------------------------------------------------------------------------------

GRID = st.one_of(
    st.tuples(st.just(1), st.integers(1, 40)), st.tuples(st.integers(1, 40), st.just(1)),
    st.tuples(st.integers(1, 12), st.integers(1, 12)),
)
RATIO = st.one_of(st.just(0.0), st.floats(*RATIO_RANGE), st.sampled_from([0.5, 0.75, RATIO_RANGE[1]]))
TEMPERATURE = st.one_of(st.just(0.0), st.floats(1e-6, 10), st.sampled_from([1e-3, 1e-30, 1e-300, 5e-324]))


def random_features(batch: int, tokens: int, channels: int, seed: int, flat: bool) -> torch.Tensor:
    """(B, N, C) normal features, or with many repeated tokens (flat patches: ties everywhere)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, channels, generator=generator)
    if flat:
        x = x[:, torch.randint(0, min(2, tokens), (tokens,), generator=generator)] * (seed % 3)
    return x


def expected_kept(height: int, width: int, tile: int, ratio: float, frames: int = 1, tile_frames: int = 1) -> int:
    """D as make_plan documents it: per tile round(n_real (1 - ratio)), at least 1 (tiles clamped)."""
    th, tw, tt = min(tile, height), min(tile, width), min(tile_frames, frames)
    total = 0
    for f in range(0, frames, tt):
        for r in range(0, height, th):
            for c in range(0, width, tw):
                real = min(tt, frames - f) * min(th, height - r) * min(tw, width - c)
                total += min(real, max(1, math.floor(real * (1 - ratio) + 0.5)))
    return total


def check_plan(plan, x: torch.Tensor, kept: int, unmerge: str) -> None:
    """Shapes, finiteness and the documented identities of a plan built from x (B, N, C)."""
    batch, tokens, channels = x.shape
    assert plan.num_tokens == tokens and plan.num_kept == kept
    merged = plan.merge(x)
    assert merged.shape == (batch, kept, channels) and torch.isfinite(merged).all()
    back = plan.unmerge(merged)
    assert back.shape == x.shape and torch.isfinite(back).all()
    unchanged = plan.unmerge_residual(x, merged, merged)  # a block that changes nothing
    assert torch.allclose(unchanged, back if unmerge == "output" else x, atol=1e-5)
    sizes = plan.cluster_sizes()
    assert sizes.shape == (batch, kept) and torch.isfinite(sizes).all()
    assert torch.allclose(sizes.sum(-1), torch.full((batch,), float(tokens)), rtol=1e-4)
    index = plan.dst_index
    assert index.shape == (batch, kept) and int(index.min()) >= 0 and int(index.max()) < tokens
    assert all(len(set(row.tolist())) == kept for row in index)  # D distinct destination tokens
    ones = torch.ones(batch, tokens, 1)
    assert torch.allclose(plan.merge(ones), torch.ones(batch, kept, 1), atol=1e-5)  # merge rows average
    rows = torch.arange(tokens, dtype=torch.float32).view(1, tokens, 1)
    assert (plan.take(rows).squeeze(-1) == index.float()).all()


@settings(max_examples=SOME)
@given(
    GRID, st.integers(1, 8), RATIO, st.integers(1, 3), st.integers(1, 6), st.integers(0, 10**6), st.booleans(),
    st.sampled_from(SIMILARITIES), TEMPERATURE, st.sampled_from(BUDGETS), st.sampled_from(UNMERGES),
)
def test_make_plan_on_any_grid(
    grid: tuple[int, int], tile: int, ratio: float, batch: int, channels: int, seed: int, flat: bool,
    similarity: str, temperature: float, budget: str, unmerge: str,
) -> None:
    height, width = grid
    x = random_features(batch, height * width, channels, seed, flat)
    plan = make_plan(x, height, width, ratio, tile, similarity=similarity, temperature=temperature,
                     budget=budget, unmerge=unmerge)
    kept = expected_kept(height, width, tile, ratio)
    check_plan(plan, x, kept, unmerge)
    if kept == height * width:  # ratio 0, and any ratio too small to drop a token: the exact no-op
        assert type(plan).__name__ == "MergePlan" and plan.merge(x) is x and plan.unmerge(x) is x
    assert TileGrid(height, width, tile, ratio).num_kept == kept


@settings(max_examples=FEW)
@given(GRID, st.integers(1, 8), st.integers(1, 2), st.integers(0, 10**6), st.sampled_from(BUDGETS))
def test_ratio_zero_is_the_identity(grid: tuple[int, int], tile: int, batch: int, seed: int, budget: str) -> None:
    height, width = grid
    x = random_features(batch, height * width, 4, seed, False)
    plan = make_plan(x, height, width, 0.0, tile, budget=budget)
    assert plan.merge(x) is x and plan.unmerge(x) is x and plan.unmerge_residual(x, x, 2 * x).equal(2 * x)
    assert plan.size_bias() is None and plan.take(x) is x


BAD_PLAN_ARGS = st.one_of(
    st.tuples(st.just("ratio"), st.one_of(st.floats(1.0, 1e9), st.floats(-1e9, -1e-9), st.just(float("nan")))),
    st.tuples(st.just("tile_size"), st.one_of(st.integers(-3, 0), st.sampled_from([2.5, float("nan"), float("inf")]))),
    st.tuples(st.just("temperature"), st.sampled_from([-1.0, -1e-9, float("nan"), float("inf"), -float("inf")])),
    st.tuples(st.just("height"), st.one_of(st.integers(-3, 0), st.sampled_from([2.5, float("nan"), float("inf")]))),
    st.tuples(st.just("width"), st.one_of(st.integers(-3, 0), st.sampled_from([2.5, float("nan"), float("inf")]))),
    st.tuples(st.just("frames"), st.one_of(st.integers(-3, 0), st.sampled_from([1.5, float("nan"), float("inf")]))),
    st.tuples(st.just("tile_frames"), st.one_of(st.integers(-3, 0), st.sampled_from([1.5, float("nan"), float("inf")]))),
    st.tuples(st.just("similarity"), st.sampled_from(["", "dot", "Cosine"])),
    st.tuples(st.just("budget"), st.sampled_from(["", "global"])),
    st.tuples(st.just("unmerge"), st.sampled_from(["", "soft"])),
)


@settings(max_examples=SOME)
@given(BAD_PLAN_ARGS)
def test_make_plan_names_a_bad_value(bad: tuple[str, object]) -> None:
    name, value = bad
    args = dict(height=4, width=6, ratio=0.5, tile_size=2, similarity="cosine", temperature=1e-3, budget="tile",
                unmerge="delta", frames=1, tile_frames=1)
    args[name] = value
    x = torch.randn(1, 24, 4)
    with pytest.raises(ValueError) as raised:
        make_plan(x, args.pop("height"), args.pop("width"), args.pop("ratio"), args.pop("tile_size"), **args)
    assert names(raised.value, name) or (name in ("height", "width") and "grid" in str(raised.value)), raised.value


@settings(max_examples=FEW)
@given(GRID, st.integers(1, 3), st.integers(0, 3))
def test_make_plan_names_a_features_shape_that_does_not_fit(grid: tuple[int, int], batch: int, off: int) -> None:
    height, width = grid
    tokens = height * width + off if off else height * width
    shape = (batch, tokens, 4) if off else (tokens, 4)
    with pytest.raises(ValueError, match="features shape"):
        make_plan(torch.randn(shape), height, width, 0.5, 2)


# Video plans --------------------------------------------------------------------------------------

SEGMENTS = st.lists(
    st.builds(Segment, frames=st.integers(1, 4), merge=st.booleans(), tile_frames=st.integers(1, 3)), min_size=1, max_size=4,
)


@settings(max_examples=SOME)
@given(
    SEGMENTS, st.tuples(st.integers(1, 6), st.integers(1, 6)), st.integers(1, 4), RATIO, st.integers(1, 2),
    st.integers(0, 10**6), st.booleans(), st.sampled_from(BUDGETS), st.sampled_from(UNMERGES),
)
def test_video_plan_over_segments(
    segments: list[Segment], grid: tuple[int, int], tile: int, ratio: float, batch: int, seed: int, flat: bool,
    budget: str, unmerge: str,
) -> None:
    height, width = grid
    per_frame, frames = height * width, sum(s.frames for s in segments)
    x = random_features(batch, frames * per_frame, 4, seed, flat)
    plan = make_video_plan(x, segments, height, width, ratio, tile, budget=budget, unmerge=unmerge)
    kept = sum(
        expected_kept(height, width, tile, ratio, s.frames, s.tile_frames) if s.merge else s.frames * per_frame
        for s in segments
    )
    assert plan.merges == (kept < frames * per_frame)
    check_plan(plan, x, kept, unmerge)
    start = 0
    for segment, part in zip(segments, plan.parts):  # no merged token mixes two segments
        span = segment.frames * per_frame
        inside = torch.zeros(batch, frames * per_frame, 1)
        inside[:, start:start + span] = 1
        weights = plan.merge(inside)
        assert torch.all((weights < 1e-5) | (weights > 1 - 1e-5))
        start += span
    if plan.frame_counts is not None:
        assert len(plan.frame_counts) == frames and sum(plan.frame_counts) == kept
        frame_of = plan.frame_of_kept(per_frame)
        assert all(row.tolist() == sorted(row.tolist()) for row in frame_of)
        counts = [[int((row == f).sum()) for f in range(frames)] for row in frame_of]
        assert all(c == plan.frame_counts for c in counts)


@settings(max_examples=FEW)
@given(SEGMENTS, st.tuples(st.integers(1, 6), st.integers(1, 6)), st.integers(1, 4))
def test_video_ratio_zero_is_the_identity(segments: list[Segment], grid: tuple[int, int], tile: int) -> None:
    height, width = grid
    x = torch.randn(2, sum(s.frames for s in segments) * height * width, 4)
    plan = make_video_plan(x, segments, height, width, 0.0, tile)
    assert not plan.merges and torch.equal(plan.merge(x), x) and torch.equal(plan.unmerge(x), x)
    assert plan.size_bias() is None and plan.frame_counts == [height * width] * sum(s.frames for s in segments)


BAD_SEGMENTS = st.one_of(
    st.tuples(st.just("segments"), st.just([])),
    st.tuples(st.just("frames"), st.sampled_from([[Segment(0)], [Segment(2), Segment(-1, merge=False)], [Segment(1.5)]])),
    st.tuples(st.just("tile_frames"), st.sampled_from([[Segment(2, tile_frames=0)], [Segment(2, merge=False, tile_frames=-1)]])),
    st.tuples(st.just("ratio"), st.sampled_from([1.0, -0.5, float("nan")])),
    st.tuples(st.just("tile_size"), st.sampled_from([0, 2.5, float("inf")])),
    st.tuples(st.just("temperature"), st.sampled_from([-1.0, float("nan")])),
)


@settings(max_examples=FEW)
@given(BAD_SEGMENTS, st.booleans())
def test_video_plan_names_a_bad_value(bad: tuple[str, object], pass_through: bool) -> None:
    """Also when every segment passes through (no make_plan call would check the settings)."""
    name, value = bad
    segments = [Segment(2, merge=not pass_through)]
    args = dict(ratio=0.5, tile_size=2, temperature=1e-3)
    if name in ("segments", "frames", "tile_frames"):
        segments = value
    else:
        args[name] = value
    frames = sum(s.frames for s in segments if isinstance(s.frames, int) and s.frames > 0)
    x = torch.randn(1, frames * 12, 4)
    with pytest.raises(ValueError) as raised:
        make_video_plan(x, segments, 3, 4, args["ratio"], args["tile_size"], temperature=args["temperature"])
    assert names(raised.value, name), raised.value


@settings(max_examples=MANY)
@given(st.integers(1, 4).flatmap(lambda b: st.integers(1, 12).flatmap(
    lambda f: st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=f, max_size=f), min_size=b, max_size=b))),
    st.booleans())
def test_frame_runs_cover_the_frames_where_values_agree(values: list[list[float]], separate_first: bool) -> None:
    runs = frame_runs(values, separate_first)
    count = len(values[0])
    assert runs[0][0] == 0 and sum(n for _, n in runs) == count and all(n >= 1 for _, n in runs)
    assert all(a + n == b for (a, n), (b, _) in zip(runs, runs[1:]))
    for a, n in runs:
        assert all(len(set(v[a:a + n])) == 1 for v in values) or (separate_first and a == 0)
    if separate_first and count > 1:
        assert runs[0] == (0, 1)
    for (a, n), (b, _) in zip(runs, runs[1:]):  # a cut is where some sample's value changes
        assert any(v[b - 1] != v[b] for v in values) or (separate_first and b == 1)


@settings(max_examples=FEW)
@given(GRID, st.integers(2, 6), st.integers(0, 10**6), st.sampled_from(SIMILARITIES), st.sampled_from(BUDGETS),
       st.sampled_from(["bfloat16", "float16"]))
def test_plans_from_half_precision_features_are_fp32(
    grid: tuple[int, int], tile: int, seed: int, similarity: str, budget: str, dtype: str,
) -> None:
    """Similarity, destination choice and softmax run in fp32 whatever the features' dtype: a plan
    from bf16 / fp16 features is the plan of the same values in fp32; only merge/unmerge run in the
    tokens' dtype (finite, as exact as that dtype)."""
    height, width = grid
    low = random_features(2, height * width, 8, seed, False).to(getattr(torch, dtype))
    plan = make_plan(low, height, width, 0.5, tile, similarity=similarity, budget=budget)
    reference = make_plan(low.float(), height, width, 0.5, tile, similarity=similarity, budget=budget)
    if not hasattr(plan, "assign"):
        return
    assert plan.assign.dtype == plan.merge_matrix.dtype == torch.float32
    assert torch.equal(plan.assign, reference.assign) and torch.equal(plan.dst_index, reference.dst_index)
    merged = plan.merge(low)
    assert merged.dtype == low.dtype and torch.isfinite(merged).all()
    assert torch.allclose(merged.float(), reference.merge(low.float()), rtol=1e-2, atol=1e-2)
