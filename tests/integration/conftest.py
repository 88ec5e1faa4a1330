"""Fixtures for tests that run real ComfyUI code on tiny random models.

Every fixture here depends on ``comfy``, which skips the test (with the reason) when no importable
ComfyUI is found; see ``harness/comfy_env.py`` for the search order. Run with::

    COMFYUI_PATH=/path/to/ComfyUI python -m pytest tests/integration -rs

Model fixtures are session-scoped and shared: patch them only through ``clone()`` and the
ModelPatcher APIs, never by writing to their weights (build a fresh model with ``tiny_models``
for that).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import comfy_env

log = logging.getLogger(__name__)

def _limit_threads() -> None:
    """Run torch on one thread unless TOMA_TEST_THREADS says otherwise.

    The tiny models' ops take microseconds, less than torch's intra-op thread synchronisation:
    on a small machine shared with other processes, more threads make each sample many times slower.
    """
    import torch

    torch.set_num_threads(int(os.environ.get("TOMA_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def comfy() -> Path:
    """The ComfyUI root, imported with cpu mode set; skips the test when unavailable (fails it
    where ComfyUI is required: see comfy_env.comfy_required)."""
    result = comfy_env.import_comfy()
    if isinstance(result, str):
        comfy_env.missing(result)
    _limit_threads()
    log.info("ComfyUI %s at %s", comfy_env.comfy_version(result), result)
    return result


@pytest.fixture(scope="session")
def tiny(comfy: Path) -> Any:
    """The ``tiny_models`` module (importable only once ComfyUI is on sys.path)."""
    from harness import tiny_models

    return tiny_models


@pytest.fixture(scope="module")
def toma(comfy: Path) -> Any:
    """The pack's modules (``compat_support.Toma``: patching, settings, runtime, core, unet, nodes),
    loaded as ComfyUI loads them."""
    from compat_support import Toma

    return Toma()


@pytest.fixture(scope="session")
def tiny_flux(tiny: Any) -> Any:
    """A shared tiny Flux ModelPatcher (also serves Kontext: pass reference_latents)."""
    return tiny.build_flux(seed=0)


@pytest.fixture(scope="session")
def tiny_sdxl(tiny: Any) -> Any:
    """A shared tiny SDXL-topology ModelPatcher."""
    return tiny.build_sdxl(seed=0)


@pytest.fixture(scope="session")
def tiny_sd15(tiny: Any) -> Any:
    """A shared tiny SD1.5-topology ModelPatcher."""
    return tiny.build_sd15(seed=0)


@pytest.fixture(params=["flux", "sdxl", "sd15"])
def any_tiny_model(request: pytest.FixtureRequest) -> Iterator[tuple[Any, tuple[int, ...]]]:
    """(model_patcher, latent_shape) for each tiny model family in turn."""
    tiny = request.getfixturevalue("tiny")
    model = request.getfixturevalue(f"tiny_{request.param}")
    yield model, tiny.FLUX_LATENT if request.param == "flux" else tiny.UNET_LATENT


@pytest.fixture(scope="session")
def live_server(comfy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A ComfyUI server (``main.py --cpu``) with this pack in its custom_nodes/, on a free port of
    127.0.0.1, shared by the live tests (live_comfy.py); stopped in every case."""
    import live_comfy

    base = tmp_path_factory.mktemp("comfy_base")
    live_comfy.prepare_base_directory(base)
    server = live_comfy.start_server(comfy, base)
    try:
        waited = live_comfy.wait_until_ready(server)
        log.info("ComfyUI answered /object_info after %.1f s", waited)
        yield server
    finally:
        live_comfy.stop_server(server)


@pytest.fixture(scope="session")
def live_models(live_server: Any) -> Iterator[dict[str, str]]:
    """The live tests' model files (live_prompts.FILES) in the server's models folder; name in
    the loaders' lists by key. Deleted afterwards (2 GB; pytest keeps its last temporary folders)."""
    import live_prompts

    paths = [live_server.models / relative for relative in live_prompts.FILES.values()]
    try:
        live_prompts.make_model_files(live_server.models)
        yield {key: path.name for key, path in zip(live_prompts.FILES, paths)}
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
