"""The Advanced node's check of a queued prompt (nodes/node/input_checks.py, the node's
`validate_inputs`): it refuses exactly the `blocks` and `min_tokens` values that every model
refuses, with the message the node gives when it runs; a family's parser then names the groups
this model has. Pure Python; the live server's /prompt answer is tests/integration/test_live_validation.py."""

from __future__ import annotations

import re

import pytest

from harness.pack import pack_module

checks = pack_module("nodes.node.input_checks")
registry = pack_module("nodes.families.registry")
settings = pack_module("nodes.settings")
dit_blocks = pack_module("nodes.machinery.dit_blocks")
unet_blocks = pack_module("nodes.families.unet_blocks")

BLOCKS = 40
"""Blocks per group of the models the family parsers are given: more than any example names."""


def family_parser(family):
    """The `blocks` parser of a family as its adapter calls it, on a model with BLOCKS per group."""
    if not family.streams:
        return unet_blocks.parse_unet_blocks
    return lambda spec: dit_blocks.parse_dit_blocks(spec, {group: BLOCKS for group in family.groups})


def run_time_error(family, spec: str) -> str | None:
    """The message the node raises for `spec` on a model of `family` (settings, then its parser)."""
    try:
        settings.ToMASettings(blocks=spec)
        family_parser(family)(spec)
    except ValueError as error:
        return str(error)
    return None


def head(message: str) -> str:
    """A `blocks` message without its menu of groups (block_lists.list_error: '<what>; <menu>')."""
    return message.split("; ", 1)[0]


REFUSED_BY_ALL = ["", "  ", "triple:1", "double:a", "blocks:1-", "5", "7-9,double", ",", " , ", "double:3-1",
                  "layers:9-2", "input:x", "double;single", "double:1-4;single"]
ACCEPTED_BY_SOME = ["auto", " AUTO ", "all", "ALL", "double", "single:0", "layers:5-25", "blocks:5-29",
                    "input:4-8,middle,output:0-5", "double:0-3, 10-18", "middle", *(f.blocks_example for f in registry.FAMILIES)]


@pytest.mark.parametrize("spec", REFUSED_BY_ALL)
def test_queue_refuses_what_every_family_refuses_with_the_same_message(spec: str) -> None:
    """Same message up to the menu, on each family that has every known group the list names (on
    the others the family's first complaint may be an earlier item's group)."""
    (queued,) = checks.queued_input_errors(spec, "auto")
    named = set(re.findall(r"[a-z_]+", spec.lower())) & set(registry.block_groups())
    for family in registry.FAMILIES:
        at_run = run_time_error(family, spec)
        assert at_run is not None, f"{family.name} accepts {spec!r}"
        if named <= set(family.groups):
            assert head(at_run) == head(queued), family.name


@pytest.mark.parametrize("spec", ACCEPTED_BY_SOME)
def test_queue_passes_what_some_family_accepts(spec: str) -> None:
    assert any(run_time_error(family, spec) is None for family in registry.FAMILIES), spec
    assert checks.queued_input_errors(spec, "auto") == []


def test_a_group_of_another_family_passes_the_queue_and_is_refused_by_this_family() -> None:
    wan = next(f for f in registry.FAMILIES if f.name == "wan")
    assert checks.queued_input_errors("double:5-29", "auto") == []
    assert "this model's only group is 'blocks' (e.g. 'blocks:0-39')" in run_time_error(wan, "double:5-29")


@pytest.mark.parametrize("family", registry.FAMILIES, ids=lambda f: f.name)
def test_the_family_error_names_its_own_groups_and_no_other(family) -> None:
    message = run_time_error(family, "triple:1")
    menu = message.split("; ", 1)[1]
    assert all(f"'{group}'" in menu for group in family.groups), menu
    others = set(registry.block_groups()) - set(family.groups)
    assert not [group for group in others if f"'{group}'" in menu or f"'{group}:" in menu], menu
    assert ("only group" in menu) == (len(family.groups) == 1), menu


def test_the_queued_error_shows_every_familys_example() -> None:
    (message,) = checks.queued_input_errors("triple:1", "auto")
    assert all(f"'{f.blocks_example}'" in message for f in registry.FAMILIES), message


@pytest.mark.parametrize("family", registry.FAMILIES, ids=lambda f: f.name)
def test_block_groups_are_the_groups_the_families_parse(family) -> None:
    assert set(family.groups) <= set(registry.block_groups())
    for group in family.groups:
        family_parser(family)(group)


@pytest.mark.parametrize("value", ["-1", "many", "1e3", "4096.5", str(settings.MIN_TOKENS_RANGE[1] + 1), "", " "])
def test_queue_refuses_a_bad_min_tokens_with_the_settings_message(value: str) -> None:
    with pytest.raises(ValueError) as error:
        settings.ToMASettings(min_tokens=value)
    assert checks.queued_input_errors("auto", value) == [str(error.value)]


@pytest.mark.parametrize("value", ["auto", "Auto ", "0", "4096", str(settings.MIN_TOKENS_RANGE[1])])
def test_queue_passes_a_good_min_tokens(value: str) -> None:
    assert checks.queued_input_errors("auto", value) == []


def test_both_bad_inputs_are_reported_and_linked_inputs_wait_for_the_run() -> None:
    assert [m.split("=", 1)[0] for m in checks.queued_input_errors("triple", "many")] == ["blocks", "min_tokens"]
    assert checks.queued_input_errors(None, None) == []
