"""The JupyterLab extension in a real browser: status bar item, panel, a run listed and stopped from the panel.

Runs a real ``jupyter lab`` (nbtrain installed in this environment: the prebuilt extension and the
server extension are picked up from the environment's share/ and etc/ folders, nothing is enabled by
hand) and headless Chromium through Playwright. Needs the system ``chromium`` (``apt-get install -y
chromium``); skipped, with the reason, where it or the ``playwright`` package is missing.
With ``NBTRAIN_SCREENSHOTS=1`` it refreshes ``docs/jupyterlab-panel.png``.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import pytest
from helpers.labhelp import CHROMIUM, LAUNCH_ARGS, JupyterLab, browser_or_skip, screenshot_path, write_notebook
from helpers.serverhelp import ENDLESS_RUN
from helpers.workers import assert_no_workers

sync_api = browser_or_skip()

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(240)]

# A name as long as people give them: the panel at its default width still shows the whole Stop button.
NOTEBOOK = "image_classifier_resnet18_cifar10.ipynb"


@pytest.fixture
def lab(tmp_path):
    server = JupyterLab(tmp_path, extension_under_test=True)
    write_notebook(server.notebooks / NOTEBOOK, ["%load_ext nbtrain", ENDLESS_RUN])
    server.nbtrain_settings({"refreshInterval": 1, "historyLength": 30})
    server.start()
    server.start_session(NOTEBOOK)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(lab, browser_page):
    return browser_page  # after the lab: the browser closes first


@pytest.fixture
def browser_page():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            yield browser.new_page(viewport={"width": 1500, "height": 900})
        finally:
            browser.close()


@contextlib.contextmanager
def explained_failure(page, lab, directory: Path):
    """On failure, keep what the browser showed and what the server logged, for the report."""
    try:
        yield
    except BaseException:
        page.screenshot(path=str(directory / "failure.png"))
        print(f"browser at failure: {directory / 'failure.png'}\njupyter lab log:\n{lab.log()}")
        raise


def test_the_panel_lists_a_run_and_stops_it(lab, page, tmp_path):
    with explained_failure(page, lab, tmp_path):
        _panel_lists_a_run_and_stops_it(lab, page)


def _panel_lists_a_run_and_stops_it(lab, page):
    # The settings schema ships with the extension; the test's refresh interval passes its validation.
    settings = lab.api("GET", "lab/api/settings/nbtrain:plugin")
    assert settings["settings"] == {"refreshInterval": 1, "historyLength": 30}
    assert settings["schema"]["properties"]["refreshInterval"]["default"] == 2
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
    _loads_the_extension_under_test(lab, page)

    status = page.locator("#nbtrain-status")
    status_text = re.compile(r"^(GPU\d+ \d+% · [\d.]+/[\d.]+ GiB|CPU \d+% · RAM [\d.]+/[\d.]+ GiB)")
    sync_api.expect(status).to_have_text(status_text, timeout=30_000)
    status.click()
    panel = page.locator("#nbtrain-panel")
    sync_api.expect(panel).to_be_visible()
    devices = 1 if status.inner_text().startswith("CPU") else len(lab.api("GET", "nbtrain/gpus")["gpus"])
    sync_api.expect(panel.locator(".nbtrain-Device")).to_have_count(devices)

    _run_cells(page)
    run = panel.locator(".nbtrain-Run-running", has=page.locator(".nbtrain-Notebook", has_text="image_classifier"))
    sync_api.expect(run).to_be_visible(timeout=90_000)
    _the_whole_row_fits(panel, run)
    progress = re.compile(r"2 ranks on cpu · step [1-9]\d* · loss 0\.")
    sync_api.expect(run.locator(".nbtrain-Run-facts")).to_contain_text(progress, timeout=30_000)
    # Which process is which, in words (it read "ranks 0:15792 1:15793"); no GPU processes listed without a GPU.
    sync_api.expect(run.locator(".nbtrain-Run-pids")).to_have_text(
        re.compile(r"^process ids: kernel \d+ · rank 0 \d+ · rank 1 \d+$"))
    if devices == 1 and status.inner_text().startswith("CPU"):
        sync_api.expect(panel.locator(".nbtrain-Processes")).to_be_hidden()
    time.sleep(6)  # a few more samples in the sparklines for the picture
    page.screenshot(path=str(screenshot_path("jupyterlab-panel.png", lab.root)))

    held = _stop_from_the_keyboard_and_hold_the_request(page, run)
    clicked = time.monotonic()
    held.continue_()
    page.unroute(STOP_URL)
    output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea")
    sync_api.expect(output).to_contain_text("KeyboardInterrupt", timeout=30_000)
    print(f"stop sent -> KeyboardInterrupt shown in {time.monotonic() - clicked:.2f} s")
    sync_api.expect(panel.locator(".nbtrain-Run .nbtrain-State")).to_have_text("interrupted", timeout=15_000)
    sync_api.expect(panel.locator(".nbtrain-Run .nbtrain-Stop")).to_be_hidden()  # nothing left to stop
    sync_api.expect(page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputPrompt")).not_to_contain_text("*")
    assert_no_workers()


def _the_whole_row_fits(panel, run) -> None:
    """At the sidebar's default width a long notebook name gives way (cut with an ellipsis, whole in its
    tooltip): the state and the Stop button are shown whole, inside the panel."""
    stop, state, name = run.locator(".nbtrain-Stop"), run.locator(".nbtrain-State"), run.locator(".nbtrain-Notebook")
    sync_api.expect(stop).to_have_text("Stop")
    for part in (stop, state):
        assert part.evaluate("e => e.scrollWidth <= e.clientWidth"), f"{part.inner_text()!r} is cut: {part.evaluate('e => e.scrollWidth')} px of text in {part.evaluate('e => e.clientWidth')} px"
    edge = panel.bounding_box()
    button = stop.bounding_box()
    assert button["x"] + button["width"] <= edge["x"] + edge["width"], f"the Stop button {button} leaves the panel {edge}"
    assert name.get_attribute("title") == f"Open {NOTEBOOK}", "the whole name is in the tooltip"


def _loads_the_extension_under_test(lab, page) -> None:
    """The page runs the extension built in this checkout (labhelp links it), not an installed copy."""
    if lab.extension is None:
        return  # nbtrain installed from a wheel: its installed extension is the one under test
    config = page.evaluate("() => JSON.parse(document.getElementById('jupyter-config-data').textContent)")
    (loaded,) = [e["load"] for e in config["federated_extensions"] if e["name"] == "nbtrain"]
    built = json.loads((lab.extension / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    assert loaded == built, f"the page loads nbtrain's {loaded}, the build in {lab.extension} is {built}"


# The stop route, with or without the query JupyterLab adds to defeat caches.
STOP_URL = re.compile(r"/nbtrain/stop(\?|$)")


def _stop_from_the_keyboard_and_hold_the_request(page, run):
    """Press Stop with the keyboard; while the stop request is held back, the panel polls at least twice
    and the button keeps saying "Stopping…" (aria-disabled) and keeps the focus. Returns the held request."""
    held = []

    def hold(route):
        held.append(route)

    page.route(STOP_URL, hold)
    stop = run.locator(".nbtrain-Stop")
    name_width = run.locator(".nbtrain-Notebook").bounding_box()["width"]
    stop.focus()
    page.keyboard.press("Enter")
    facts = run.locator(".nbtrain-Run-facts")
    for _ in range(2):
        shown = facts.inner_text()
        sync_api.expect(facts).not_to_have_text(shown, timeout=10_000)  # a poll came back and was drawn
        sync_api.expect(stop).to_have_text("Stopping…", timeout=1)
        sync_api.expect(stop).to_have_attribute("aria-disabled", "true", timeout=1)
        assert stop.evaluate("button => button === document.activeElement"), "the Stop button lost the focus"
        squeezed = run.locator(".nbtrain-Notebook").bounding_box()["width"]
        assert abs(squeezed - name_width) < 1, f"'Stopping…' took the notebook name's room: {name_width} -> {squeezed} px"
    page.keyboard.press("Enter")  # a second press while stopping sends nothing more
    sync_api.expect(facts).not_to_have_text(facts.inner_text(), timeout=10_000)
    assert len(held) == 1, f"{len(held)} stop requests sent"
    return held[0]


def _run_cells(page) -> None:
    """Shift+Enter through both cells once the kernel is idle: the first loads nbtrain, the second trains."""
    cells = page.locator(".jp-Notebook .jp-Cell")
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    sync_api.expect(idle).to_have_count(1, timeout=60_000)
    cells.nth(0).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    page.keyboard.press("Control+Enter")  # the last cell: run it without adding a new one below
    sync_api.expect(cells.nth(1).locator(".jp-InputPrompt")).to_have_text("[*]:", timeout=10_000)


SHORT_RUN = """%%distributed 2 --cpu
import time
import nbtrain
for step in range(40):
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    time.sleep(0.1)
"""
BADGE_LAG_S = 0.9  # half a second's poll plus one answer on a busy machine; the idle pace (2 s) misses it


@pytest.fixture
def default_pace_lab(tmp_path):
    """A lab at the default refresh interval (2 s), with a cell that trains for a few seconds and ends."""
    server = JupyterLab(tmp_path, extension_under_test=True)
    write_notebook(server.notebooks / NOTEBOOK, ["%load_ext nbtrain", SHORT_RUN])
    server.start()
    server.start_session(NOTEBOOK)
    try:
        yield server
    finally:
        server.stop()


def test_the_badge_follows_a_run_within_half_a_second(default_pace_lab, browser_page, tmp_path):
    lab, page = default_pace_lab, browser_page
    with explained_failure(page, lab, tmp_path):
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}")
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        status = page.locator("#nbtrain-status")
        sync_api.expect(status).to_have_attribute("title", re.compile("0 nbtrain runs active"), timeout=30_000)
        flips = _server_flips(lab)
        badge = page.evaluate_handle(_BADGE_FLIPS)  # the badge's own times, taken in the page every 20 ms
        _run_cells(page)
        sync_api.expect(page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputPrompt")).to_have_text(
            re.compile(r"\[\d+\]:"), timeout=90_000)
        server_times = flips.result(timeout=30)
        sync_api.expect(status).to_have_attribute("title", re.compile("0 nbtrain runs active"), timeout=5_000)
        badge_times = badge.json_value()
        started, ended = (badge_times[0] - server_times[0], badge_times[1] - server_times[1])
        print(f"badge after the server: run active {started:.2f} s, run over {ended:.2f} s")
        assert started <= BADGE_LAG_S and ended <= BADGE_LAG_S, f"the badge lagged: {started:.2f} s, {ended:.2f} s"


# Records (in the page, Date.now() in seconds) when the badge's title first says a run is active, then none.
_BADGE_FLIPS = """() => {
  const flips = [];
  const watch = () => {
    const title = document.querySelector('#nbtrain-status')?.getAttribute('title') ?? '';
    const wanted = flips.length === 0 ? '1 nbtrain run active' : '0 nbtrain runs active';
    if (title.includes(wanted)) flips.push(Date.now() / 1000);
    if (flips.length < 2) setTimeout(watch, 20);
  };
  watch();
  return flips;
}"""


def _server_flips(lab):
    """When the server's run list first has an active run, then none (asked every 20 ms on a thread of its own)."""
    import concurrent.futures

    def watch() -> list[float]:
        flips: list[float] = []
        deadline = time.monotonic() + 150
        while len(flips) < 2 and time.monotonic() < deadline:
            active = any(run["active"] for run in lab.api("GET", "nbtrain/runs")["runs"])
            if active == (len(flips) == 0):
                flips.append(time.time())
            time.sleep(0.02)
        return flips

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(watch)
    pool.shutdown(wait=False)
    return future
