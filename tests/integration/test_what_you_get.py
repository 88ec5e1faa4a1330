"""docs/what_you_get.md's table and the README's summary of it are what their generator prints from the committed cost-model cache and
fixture record (bench/speed/what_you_get.py): a changed probe, setting or row without `--write` fails."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bench.speed import realsize
from bench.speed import what_you_get as wyg


def test_the_tables_are_the_generated_ones(comfy: Path) -> None:
    if not hasattr(importlib.import_module("comfy.supported_models"), "Flux2"):
        pytest.skip("the table prices ComfyUI 0.33's models (Flux.2, Kandinsky 5, ...), which this ComfyUI lacks")
    cache = realsize.load_cache(realsize.CACHE)
    plans, kvs = realsize.PlanTimes(cache, "cpu"), realsize.KvTimes(cache, "cpu")
    quality = wyg.fixture_record()
    generated = wyg.section(cache, quality, plans, kvs)
    assert plans.timed == kvs.timed == 0, "the cache lacks a plan or K / V merge: run `python -m bench.speed.what_you_get --write`"
    table = wyg.TABLE.read_text(encoding="utf-8")
    assert wyg.part(table, wyg.START, wyg.END) == generated
    readme = wyg.README.read_text(encoding="utf-8")
    assert wyg.part(readme, wyg.SUMMARY_START, wyg.SUMMARY_END) == wyg.summary(cache, plans, kvs)
