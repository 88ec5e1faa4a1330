"""The real ComfyUI frontend in a browser: each shipped template loaded from the template browser

Headless Debian ``chromium`` + ``chromium-driver`` driven by ``selenium`` open the frontend of the
live server (``live_server`` in conftest.py), open "Browse Templates", pick the pack's category
"ComfyUI-ToMA" and click each template's card. Checked: the template dialog closes, no
missing-node report appears (a copy with an unknown node type must raise one: the check can
fail), the frontend's missing-model report names every model file the template links (the server
has none of them), the graph holds the template's nodes, and each ToMA node shows its registered
widgets with the values the template file holds (a template may set other values than the node
defaults, as the Wan template does). A screenshot per workflow goes to ``TOMA_SCREENSHOT_DIR``
(default: a pytest temporary folder; the path is logged).

Two frontends, the same clicks: ``comfyui-frontend-package`` 1.27 (ComfyUI 0.3.64) lists the
template categories as ``aside [role=option]`` entries and reports missing nodes in a PrimeVue
dialog (missing models in another); 1.49 (ComfyUI 0.33) lists them as ``nav [role=button]``
entries of a reka-ui dialog and reports a load's errors in an overlay whose "View details" opens the
errors panel, where missing nodes form the ``error-group-missing-node`` group and missing models the
``error-group-missing-model`` group, each with its Download button. The helpers below accept both.

Templates of models the server's ComfyUI lacks (Flux.2 and Z-Image on 0.3.64, whose core nodes or
model classes it does not have: ``live_prompts.NEEDS_CLASS``) skip by name with the reason.

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
from live_comfy import PACK_DIR_NAME, PACK_ROOT, LiveServer, get_json
from live_prompts import missing_model_reason
from workflow_check import FLUX_TEMPLATE

from harness.comfy_env import skip_or_fail

log = logging.getLogger(__name__)

EXAMPLES = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
TOMA_NODES = ("ToMAPatch", "ToMAPatchAdvanced")
PAGE_TIMEOUT_S = 120.0
UI_TIMEOUT_S = 30.0
SETTLE_S = 8.0
"""How long after a graph load a missing-node report may take to show (frontend 1.49 under load:
up to 3 s measured); the control test waits exactly as long, so a report slower than this fails it."""
CARD_WAIT_S = 10.0
"""How long a template card may take to show after its category is clicked before the click is repeated."""
CLOSE_BUTTONS = "[role=dialog] .p-dialog-close-button, [role=dialog] button[aria-label='Close dialog']"
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


def poll(driver: Any, script: str, timeout_s: float, *args: Any) -> Any:
    """Poll a JavaScript expression until it is truthy; its value, or None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script, *args)
        if value:
            return value
        time.sleep(0.25)
    return None


def wait_for(driver: Any, script: str, what: str, timeout_s: float = UI_TIMEOUT_S, *args: Any) -> Any:
    """``poll`` that raises AssertionError naming ``what`` when the expression stays falsy."""
    value = poll(driver, script, timeout_s, *args)
    if not value:
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
    return value


def open_frontend(driver: Any, server: LiveServer) -> None:
    driver.get(f"{server.url}/")
    wait_for(driver, "return !!(window.app && window.app.graph && window.app.extensionManager && document.querySelector('canvas'))",
             "the frontend to start", PAGE_TIMEOUT_S)
    close_dialogs(driver)


def open_dialogs(driver: Any) -> list[str]:
    """Text of every dialog on screen."""
    return driver.execute_script("return [...document.querySelectorAll('[role=dialog]')].map(d => d.innerText)")


def close_dialogs(driver: Any, quiet_s: float = 2.0) -> None:
    """Click the close button of every dialog until none has been open for ``quiet_s`` (frontend
    1.49 opens the template browser by itself a moment after a first start)."""
    from selenium.common.exceptions import WebDriverException

    deadline = time.monotonic() + UI_TIMEOUT_S
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        if open_dialogs(driver):
            quiet_since = time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"dialogs still open after {UI_TIMEOUT_S:.0f} s: {open_dialogs(driver)}")
            for button in driver.find_elements("css selector", CLOSE_BUTTONS):
                try:
                    button.click()
                except WebDriverException:  # closed meanwhile, or still animating in: the next round
                    pass
        time.sleep(0.25)


def missing_node_reports(driver: Any) -> list[str]:
    """What the frontend reports about missing nodes after a graph load, read as a user reads it.

    Waits up to SETTLE_S for a dialog (frontend 1.27) or the error overlay (1.49). Returns the
    text of each dialog that speaks of missing nodes, and, once the overlay's "View details" is
    clicked, of the errors panel's missing-node group.
    """
    poll(driver, "return document.querySelector('[data-testid=error-overlay-see-errors]') || "
         "document.querySelector('[role=dialog]')", SETTLE_S)
    reports = [text for text in open_dialogs(driver) if "missing" in text.lower() and "node" in text.lower()]
    # Found and clicked in one script: the frontend re-renders the overlay while it settles, so an
    # element handle kept from the poll can be stale by the click (StaleElementReferenceException).
    clicked = driver.execute_script(
        "const b = document.querySelector('[data-testid=error-overlay-see-errors]'); if (b) { b.click(); } return !!b")
    if clicked:
        wait_for(driver, "return document.querySelector('[data-testid=errors-summary-hero]')", "the errors panel")
        reports += driver.execute_script(
            "return [...document.querySelectorAll('[data-testid=error-group-missing-node]')].map(g => g.innerText)")
    return reports


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
    card = "return document.querySelector(`[data-testid='template-workflow-${arguments[0]}']`)"
    deadline = time.monotonic() + 2 * UI_TIMEOUT_S
    while True:  # a click while the browser still fills its lists can be undone by the refill: click again
        click_found(driver, "return [...document.querySelectorAll('[role=dialog] aside [role=option], [role=dialog] nav [role=button]')]"
                    ".find(o => (o.getAttribute('aria-label') || o.innerText.trim()) === arguments[0])",
                    f"the {PACK_DIR_NAME} category", PACK_DIR_NAME)
        if poll(driver, card, CARD_WAIT_S, stem) or time.monotonic() > deadline:
            break
        log.info("no %s card %.0f s after the category click; clicking the category again", stem, CARD_WAIT_S)
    click_found(driver, card, f"the {stem} card", stem)
    wait_for(driver, "return !document.querySelector('[data-testid=template-workflows-content]')", "the template browser to close")


def graph_nodes(driver: Any) -> list[dict[str, Any]]:
    """Id, type and widgets (name, value) of every node in the frontend's graph."""
    return driver.execute_script(
        "return window.app.graph.nodes.map(n => ({id: n.id, type: n.type, widgets: (n.widgets || []).map(w => [w.name, w.value])}))"
    )


def missing_model_reports(driver: Any) -> str:
    """What the frontend reports about missing model files, read as a user reads it: the missing-models
    dialog (1.27), or the errors panel's missing-model group (1.49; ``missing_node_reports`` opened it)."""
    dialogs = [text for text in open_dialogs(driver) if "model" in text.lower()]
    groups = driver.execute_script(
        "return [...document.querySelectorAll('[data-testid=error-group-missing-model]')].map(g => g.innerText)")
    return "\n".join(dialogs + groups)


def registered_defaults(object_info: dict[str, Any], node_type: str) -> list[tuple[str, Any]]:
    node = wa.api_node(object_info, node_type)
    return [(name, node["inputs"][name]) for name in wa.widget_names(object_info[node_type])]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_loads_from_the_template_browser(live_server, browser, object_info, screenshots, path: Path):
    reason = missing_model_reason(path.stem)
    if reason:
        pytest.skip(reason)
    open_frontend(browser, live_server)
    load_from_template_browser(browser, path.stem)
    reports = missing_node_reports(browser)
    offered = missing_model_reports(browser)
    shot = screenshots / f"{path.stem}.png"
    browser.save_screenshot(str(shot))
    log.info("screenshot %s", shot)

    assert not reports, reports
    workflow = json.loads(path.read_text(encoding="utf-8"))
    linked = sorted({entry["name"] for node in workflow["nodes"] for entry in node.get("properties", {}).get("models", [])})
    assert linked and all(name in offered for name in linked), f"the frontend offers {offered!r}, the template links {linked}"
    nodes = graph_nodes(browser)
    assert sorted(n["type"] for n in nodes) == sorted(n["type"] for n in workflow["nodes"])
    toma = [n for n in nodes if n["type"] in TOMA_NODES]
    assert toma, nodes
    saved = {str(n["id"]): n["widgets_values"] for n in workflow["nodes"]}  # frontend 1.49's ids are strings
    for node in toma:
        shown = [tuple(widget) for widget in node["widgets"]]
        stored_values = saved[str(node["id"])]
        assert [name for name, _ in shown] == [name for name, _ in registered_defaults(object_info, node["type"])]
        assert len(stored_values) == len(shown), (node["type"], stored_values)
        for (name, value), stored in zip(shown, stored_values):
            assert value == pytest.approx(stored), f"{node['type']}.{name}: shows {value!r}, the template holds {stored!r}"


def test_unknown_node_type_raises_a_missing_node_report(live_server, browser, screenshots):
    """The check above can fail: the same template with an unregistered node type is flagged."""
    workflow = json.loads((PACK_ROOT / "example_workflows" / f"{FLUX_TEMPLATE}.json").read_text(encoding="utf-8"))
    for node in workflow["nodes"]:
        if node["type"] in TOMA_NODES:
            node["type"] = "ToMANoSuchNode"
    open_frontend(browser, live_server)
    browser.execute_script("return window.app.loadGraphData(arguments[0])", workflow)
    reports = missing_node_reports(browser)
    browser.save_screenshot(str(screenshots / "missing_node_control.png"))
    assert any("ToMANoSuchNode" in text for text in reports), reports
