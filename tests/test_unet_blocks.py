"""The UNet `blocks` parser and the "auto" rule (pure Python, no ComfyUI needed)."""

from __future__ import annotations

import pytest

from harness.pack import pack_module

unet_blocks = pack_module("nodes.families.unet_blocks")
parse = unet_blocks.parse_unet_blocks

# SDXL's transformer blocks and their downsampling from the latent (comfy.supported_models.SDXL).
SDXL = [("input", 4, 2), ("input", 5, 2), ("input", 7, 4), ("input", 8, 4), ("middle", 0, 4)] + [
    ("output", i, 4) for i in range(3)
] + [("output", i, 2) for i in range(3, 6)]
# SD1.5: levels 1, 1/2, 1/4 with transformers, middle at 1/8.
SD15 = [("input", i, d) for i, d in ((1, 1), (2, 1), (4, 2), (5, 2), (7, 4), (8, 4))] + [("middle", 0, 8)] + [
    ("output", i, d) for i, d in ((3, 4), (4, 4), (5, 4), (6, 2), (7, 2), (8, 2), (9, 1), (10, 1), (11, 1))
]


def selected(spec: str, blocks: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
    parsed = parse(spec)
    return [(g, i) for g, i, d in blocks if parsed.selects((g, i), d)]


def test_auto_is_sdxls_output_half() -> None:
    # On SDXL "auto" is the decoder: output 0-5 (levels 1/4 and 1/2), no input or middle block.
    assert selected("auto", SDXL) == [("output", i) for i in range(6)]


def test_auto_is_sd15s_output_blocks_at_every_level() -> None:
    assert selected("auto", SD15) == [("output", i) for i in range(3, 12)]


@pytest.mark.parametrize("downsample", [1, 2, 4, 8, 16])
def test_auto_takes_no_encoder_block_and_no_level_past_one_quarter(downsample: int) -> None:
    auto = parse("auto")
    assert not auto.selects(("input", 1), downsample) and not auto.selects(("middle", 0), downsample)
    assert auto.selects(("output", 7), downsample) == (downsample <= unet_blocks.AUTO_MAX_DOWNSAMPLE)


@pytest.mark.parametrize("spec", ["", "  AUTO ", "auto"])
def test_auto_spellings(spec: str) -> None:
    assert parse(spec).mode == "auto"


def test_all_selects_everything() -> None:
    assert selected("all", SD15) == [(g, i) for g, i, _ in SD15]


def test_issue_example() -> None:
    chosen = selected("input:4-8,middle,output:0-5", SDXL)
    assert chosen == [(g, i) for g, i, _ in SDXL]
    assert selected("input:4-8,middle,output:0-5", SD15) == [
        ("input", 4), ("input", 5), ("input", 7), ("input", 8), ("middle", 0), ("output", 3), ("output", 4), ("output", 5),
    ]


def test_bare_ranges_continue_the_previous_group() -> None:
    spec = parse("input:4, 5, 8, output:1")
    assert spec.ids == {("input", 4), ("input", 5), ("input", 8), ("output", 1)}
    assert not spec.groups


def test_group_without_range_selects_whole_group() -> None:
    assert selected("output", SDXL) == [(g, i) for g, i, _ in SDXL if g == "output"]
    assert parse("middle").describe() == "middle"


def test_describe_is_canonical() -> None:
    assert parse("output:1, input:5-4".replace("5-4", "4-5")).describe() == "input:4,input:5,output:1"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("double:0-3", ["'double:0-3'", "groups are 'input', 'middle' and 'output'"]),
        ("input:8-4", ["8-4", "low to high"]),
        ("input:a", ["'a'", "5-18 or 7"]),
        ("4-5", ["group before it"]),
        (",", ["selects no block"]),
        ("input:-1", ["'-1'"]),
    ],
)
def test_bad_specs_name_the_item_and_the_forms(spec: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        parse(spec)
    message = str(error.value)
    assert "input:4-8,middle,output:0-5" in message
    for word in words:
        assert word in message
