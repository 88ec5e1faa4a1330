"""The real ComfyUI frontend in a browser: each shipped template loaded from the template browser

Headless Debian ``chromium`` + ``chromium-driver`` driven by ``selenium`` open the frontend of the
live server (``live_server`` in conftest.py), open "Browse Templates", pick the pack's category
"ComfyUI-ToMA" and click each template's card. Checked: the template dialog closes, no
missing-node dialog appears (a copy with an unknown node type must raise one: the check can
fail), the graph holds the template's nodes, and each ToMA node shows its registered widgets with
the values the template file holds (a template may set other values than the node defaults, as
wan_toma.json does). A screenshot per workflow goes to ``TOMA_SCREENSHOT_DIR`` (default: a
pytest temporary folder; the path is logged).

Without chromium, chromedriver or selenium the tests skip with the reason on a developer machine.
``.ci/run`` installs chromium with apt-get; where it could not, it says why in
``TOMA_BROWSER_SKIP_REASON`` and the tests skip with that reason; otherwise, with ``CI=true`` or
``TOMA_REQUIRE_BROWSER=1``, a missing browser fails the tests.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import workflow_api as wa
from bench.harness.comfy_env import skip_or_fail
from live_comfy import PACK_DIR_NAME, PACK_ROOT, LiveServer, get_json

log = logging.getLogger(__name__)

EXAMPLES = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
TOMA_NODES = ("ToMAPatch", "ToMAPatchAdvanced")
PAGE_TIMEOUT_S = 120.0
UI_TIMEOUT_S = 30.0
WINDOW = "1600,1000"


def browser_missing(reason: str) -> None:
    """Skip, or fail where the browser is required (see the module docstring)."""
    ci_reason = os.environ.get("TOMA_BROWSER_SKIP_REASON")
    if ci_reason:
        pytest.skip(f"{reason}; .ci/run: {ci_reason}")
    skip_or_fail("TOMA_REQUIRE_BROWSER", "the browser test is", reason)


def browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        browser_missing(f"no chromium ({chromium}) or chromedriver ({driver}); Debian: apt-get install chromium chromium-driver")
    return chromium, driver


@pytest.fixture(scope="module")
def browser(live_server: LiveServer) -> Iterator[Any]:
    chromium, driver_path = browser_paths()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        browser_missing(f"selenium does not import: {exc}")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={WINDOW}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))  # explicit driver: no download
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("TOMA_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screens"))
    folder.mkdir(parents=True, exist_ok=True)
    log.info("browser screenshots in %s", folder)
    return folder


@pytest.fixture(scope="module")
def object_info(live_server: LiveServer) -> dict[str, Any]:
    return get_json(f"{live_server.url}/object_info")


def wait_for(driver: Any, script: str, what: str, timeout_s: float = UI_TIMEOUT_S, *args: Any) -> Any:
    """Poll a JavaScript expression until it is truthy; its value, or AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script, *args)
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def open_frontend(driver: Any, server: LiveServer) -> None:
    driver.get(f"{server.url}/")
    wait_for(driver, "return !!(window.app && window.app.graph && window.app.extensionManager && document.querySelector('canvas'))",
             "the frontend to start", PAGE_TIMEOUT_S)
    close_dialogs(driver)


def open_dialogs(driver: Any) -> list[str]:
    """Text of every dialog on screen."""
    return driver.execute_script("return [...document.querySelectorAll('[role=dialog]')].map(d => d.innerText)")


def close_dialogs(driver: Any) -> None:
    driver.execute_script("document.querySelectorAll('[role=dialog] .p-dialog-close-button').forEach(b => b.click())")
    wait_for(driver, "return document.querySelectorAll('[role=dialog]').length === 0", "dialogs to close")


def missing_node_dialogs(driver: Any) -> list[str]:
    return [text for text in open_dialogs(driver) if "missing" in text.lower() and "node" in text.lower()]


def click_found(driver: Any, script: str, what: str, *args: Any) -> None:
    """Find an element with ``script``, scroll to it and click it as a user does.

    The template browser re-renders its lists while it fills them, so an element found a moment
    ago can be gone by the click (selenium's StaleElementReferenceException): find it again.
    """
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + UI_TIMEOUT_S
    while True:
        element = wait_for(driver, script, what, max(deadline - time.monotonic(), 1.0), *args)
        try:
            driver.execute_script("arguments[0].scrollIntoView()", element)
            element.click()
            return
        except StaleElementReferenceException:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} kept being replaced for {UI_TIMEOUT_S:.0f} s") from None
            log.info("%s was re-rendered before the click; finding it again", what)


def load_from_template_browser(driver: Any, stem: str) -> None:
    """Browse Templates -> category ComfyUI-ToMA -> the template's card, as a user clicks them."""
    driver.execute_script("window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    wait_for(driver, "return document.querySelector('[data-testid=template-workflows-content]')", "the template browser")
    click_found(driver, "return [...document.querySelectorAll('[data-testid=template-workflows-content] aside [role=option]')]"
                ".find(o => o.getAttribute('aria-label') === arguments[0])", f"the {PACK_DIR_NAME} category", PACK_DIR_NAME)
    click_found(driver, "return document.querySelector(`[data-testid='template-workflow-${arguments[0]}']`)", f"the {stem} card", stem)
    wait_for(driver, "return !document.querySelector('[data-testid=template-workflows-content]')", "the template browser to close")


def graph_nodes(driver: Any) -> list[dict[str, Any]]:
    """Id, type and widgets (name, value) of every node in the frontend's graph."""
    return driver.execute_script(
        "return window.app.graph.nodes.map(n => ({id: n.id, type: n.type, widgets: (n.widgets || []).map(w => [w.name, w.value])}))"
    )


def registered_defaults(object_info: dict[str, Any], node_type: str) -> list[tuple[str, Any]]:
    node = wa.api_node(object_info, node_type)
    return [(name, node["inputs"][name]) for name in wa.widget_names(object_info[node_type])]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_loads_from_the_template_browser(live_server, browser, object_info, screenshots, path: Path):
    open_frontend(browser, live_server)
    load_from_template_browser(browser, path.stem)
    time.sleep(1.0)  # the missing-node dialog, when there is one, opens right after the graph loads
    shot = screenshots / f"{path.stem}.png"
    browser.save_screenshot(str(shot))
    log.info("screenshot %s", shot)

    assert not missing_node_dialogs(browser), missing_node_dialogs(browser)
    workflow = json.loads(path.read_text(encoding="utf-8"))
    nodes = graph_nodes(browser)
    assert sorted(n["type"] for n in nodes) == sorted(n["type"] for n in workflow["nodes"])
    toma = [n for n in nodes if n["type"] in TOMA_NODES]
    assert toma, nodes
    saved = {n["id"]: n["widgets_values"] for n in workflow["nodes"]}
    for node in toma:
        shown = [tuple(widget) for widget in node["widgets"]]
        assert [name for name, _ in shown] == [name for name, _ in registered_defaults(object_info, node["type"])]
        assert len(saved[node["id"]]) == len(shown), (node["type"], saved[node["id"]])
        for (name, value), stored in zip(shown, saved[node["id"]]):
            assert value == pytest.approx(stored), f"{node['type']}.{name}: shows {value!r}, the template holds {stored!r}"


def test_unknown_node_type_raises_the_missing_node_dialog(live_server, browser, screenshots):
    """The check above can fail: the same template with an unregistered node type is flagged."""
    workflow = json.loads(EXAMPLES[0].read_text(encoding="utf-8"))
    for node in workflow["nodes"]:
        if node["type"] in TOMA_NODES:
            node["type"] = "ToMANoSuchNode"
    open_frontend(browser, live_server)
    browser.execute_script("return window.app.loadGraphData(arguments[0])", workflow)
    dialogs = wait_for(browser, "return [...document.querySelectorAll('[role=dialog]')].map(d => d.innerText)"
                       ".filter(t => t.includes('ToMANoSuchNode'))", "a missing-node dialog")
    browser.save_screenshot(str(screenshots / "missing_node_control.png"))
    assert any("missing" in text.lower() for text in dialogs), dialogs
