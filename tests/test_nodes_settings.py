"""ToMASettings validation and the Flux `blocks` parser (no ComfyUI needed)."""

from __future__ import annotations

import pytest

from harness.pack import pack_module

settings_mod = pack_module("nodes.settings")
flux_blocks = pack_module("nodes.machinery.dit_blocks")
core = pack_module("toma_core")
ToMASettings = settings_mod.ToMASettings


def test_defaults_are_valid_and_match_issue():
    s = ToMASettings()
    assert (s.ratio, s.tile_size, s.blocks, s.scope, s.min_tokens) == (0.5, 4, "auto", "block", 0)
    assert s.budget == "tile" == core.BUDGETS[0]
    assert s.schedule == core.MergeSchedule(0.0, 1.0, 1)
    assert s.merges


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"ratio": 0.96}, ["ratio=0.96", "0.95"]),
        ({"ratio": -0.1}, ["ratio=-0.1"]),
        ({"tile_size": 0}, ["tile_size=0", "[2, 32]"]),
        ({"tile_size": 1}, ["tile_size=1", "[2, 32]"]),
        ({"tile_size": 2.5}, ["tile_size=2.5"]),
        ({"min_tokens": -1}, ["min_tokens=-1"]),
        ({"tile_frames": 0}, ["tile_frames=0", "[1, 16]"]),
        ({"tile_frames": 17}, ["tile_frames=17", "[1, 16]"]),
        ({"temperature": -1.0}, ["temperature=-1.0"]),
        ({"similarity": "dot"}, ["similarity='dot'", "cosine"]),
        ({"budget": "global"}, ["budget='global'", "tile", "adaptive"]),
        ({"scope": "ff"}, ["scope='ff'", "block", "attention"]),
        ({"blocks": " "}, ["blocks=' '"]),
        ({"verbose": 1}, ["verbose=1"]),
        ({"proportional_attention": "yes"}, ["proportional_attention='yes'", "True or False"]),
    ],
)
def test_bad_values_name_value_and_range(kwargs, words):
    with pytest.raises(ValueError) as error:
        ToMASettings(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_settings_are_frozen_and_hashable():
    s = ToMASettings()
    with pytest.raises(AttributeError):
        s.ratio = 0.1  # type: ignore[misc]
    assert hash(s) == hash(ToMASettings())


def test_proportional_attention_is_off_by_default_and_described():
    assert ToMASettings().proportional_attention is False
    assert "proportional attention" not in ToMASettings().describe()
    assert "proportional attention" in ToMASettings(proportional_attention=True).describe()


@pytest.mark.parametrize("budget", ["tile", "adaptive"])
def test_budget_choices_and_describe(budget):
    s = ToMASettings(budget=budget)
    assert budget in core.BUDGETS
    assert f"budget {budget}" in s.describe()


def test_merges_false_for_ratio_zero_or_empty_window():
    assert not ToMASettings(ratio=0.0).merges
    assert not ToMASettings(schedule=core.MergeSchedule(0.5, 0.5, 1)).merges


def test_flux_blocks_auto_is_the_later_half_of_each_stream_of_flux1():
    blocks = flux_blocks.parse_flux_blocks("auto", 19, 38)
    assert blocks.describe() == "double:9-18,single:19-37"
    assert blocks.count == 10 + 19


def test_video_blocks_auto_keeps_every_block_but_the_first_five():
    assert flux_blocks.parse_flux_blocks("auto", 19, 38, video=True).describe() == "double:5-18,single:5-37"
    assert flux_blocks.parse_dit_blocks("auto", {"blocks": 40}, video=True).blocks == frozenset(range(5, 40))


@pytest.mark.parametrize("depth", [1, 2, 3, 7, 12, 19, 38, 57, 60])
def test_blocks_auto_at_any_depth_is_the_later_half_and_ends_with_the_last_block(depth: int):
    chosen = flux_blocks.parse_dit_blocks("auto", {"layers": depth}).layers
    assert chosen == frozenset(range(depth // 2, depth))
    assert depth - 1 in chosen and 2 * len(chosen) in (depth, depth + 1)
    video = flux_blocks.parse_dit_blocks("auto", {"blocks": depth}, video=True).blocks
    assert chosen <= video and depth - 1 in video


@pytest.mark.parametrize("spec", ["all", "double:0-3", "double:0,single:2-5", "single"])
def test_explicit_blocks_win_over_auto_on_image_and_video_models(spec: str):
    sizes = {"double": 19, "single": 38}
    image, video = flux_blocks.parse_dit_blocks(spec, sizes), flux_blocks.parse_dit_blocks(spec, sizes, video=True)
    assert image == video != flux_blocks.parse_dit_blocks("auto", sizes)


def test_flux_blocks_auto_in_shallow_models():
    assert flux_blocks.parse_flux_blocks("auto", 2, 2).describe() == "double:1,single:1"
    assert flux_blocks.parse_flux_blocks("auto", 1, 1).count == 2


def test_flux_blocks_all_and_lists():
    assert flux_blocks.parse_flux_blocks("ALL", 3, 4).count == 7
    blocks = flux_blocks.parse_flux_blocks("double:0-1, 3, single", 5, 2)
    assert blocks.double == frozenset({0, 1, 3}) and blocks.single == frozenset({0, 1})
    assert flux_blocks.parse_flux_blocks(blocks.describe(), 5, 2) == blocks


@pytest.mark.parametrize(
    "spec, words",
    [
        ("double:0-19", ["0-19", "0-18"]),
        ("triple:1", ["triple", "groups are 'double' and 'single'"]),
        ("double:3-1", ["3-1"]),
        ("double:a", ["'a'"]),
        ("5", ["'5'"]),
    ],
)
def test_flux_blocks_errors(spec, words):
    with pytest.raises(ValueError) as error:
        flux_blocks.parse_flux_blocks(spec, 19, 38)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize(
    "spec, sizes, message",
    [
        ("blocks:5-39", {"blocks": 30}, "blocks range 5-39 is outside this model's blocks 0-29"),
        ("double:5-18,single:5-37", {"double": 16, "single": 32}, "double range 5-18 is outside this model's double blocks 0-15"),
        ("double:5-19,single:5-37", {"double": 54, "single": 0}, "single range 5-37 is outside this model's single blocks (it has none)"),
    ],
)
def test_out_of_range_error_names_the_models_own_range(spec, sizes, message):
    with pytest.raises(ValueError) as error:
        flux_blocks.parse_dit_blocks(spec, sizes)
    assert message in str(error.value)


@pytest.mark.parametrize("value, parsed", [("auto", "auto"), (" AUTO ", "auto"), ("0", 0), (0, 0), ("4096", 4096), (4096, 4096)])
def test_min_tokens_takes_auto_or_a_number_as_int_or_text(value, parsed):
    assert ToMASettings(min_tokens=value).min_tokens == parsed
    assert ToMASettings(min_tokens=value).token_floor == (0 if parsed == "auto" else parsed)


@pytest.mark.parametrize("value", ["-1", "many", 1.5, True, 1 << 21, "1e3"])
def test_bad_min_tokens_names_the_value_and_what_it_takes(value):
    with pytest.raises(ValueError) as error:
        ToMASettings(min_tokens=value)
    assert "min_tokens=" in str(error.value) and "'auto'" in str(error.value)


def test_a_ratio_a_small_tile_cannot_reach_is_said_with_what_it_merges():
    (note,) = ToMASettings(ratio=0.95, tile_size=2).notes()
    assert "ratio 0.95 at tile_size 2 merges 0.75 of the tokens" in note and "tile_size" in note.split(";")[1]
    assert ToMASettings(ratio=0.95, tile_size=2).effective_ratio == pytest.approx(0.75)
    assert not ToMASettings(ratio=0.5, tile_size=4).notes()
    assert not ToMASettings(ratio=0.0).notes()


def test_start_above_end_is_said():
    (note,) = ToMASettings(schedule=core.MergeSchedule(0.8, 0.5)).notes()
    assert "start_percent 0.8 is above end_percent 0.5" in note and "merges nothing" in note
    assert not ToMASettings(schedule=core.MergeSchedule(0.8, 0.5)).merges
