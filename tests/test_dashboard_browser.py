"""The live dashboard in a real JupyterLab and headless Chromium: it appears under the running cell, updates
while the ranks train, and leaves a picture and a summary in the cell when the run ends.

With ``NBTRAIN_SCREENSHOTS=1`` it refreshes ``docs/dashboard-live.png`` (the widget mid-run). Skipped, with
the reason, without Chromium or Playwright.
"""

from __future__ import annotations

import re

import pytest

from helpers.labhelp import CHROMIUM, LAUNCH_ARGS, JupyterLab, browser_or_skip, screenshot_path, write_notebook

sync_api = browser_or_skip()

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(240)]


TRAINING = """%%distributed 2 --cpu --keep-alive 0
import time, torch, nbtrain
nbtrain.log(total_steps=120)
for step in range(120):
    loss = torch.tensor(2.0 / (step + 1) + 0.05 * rank)
    nbtrain.log(loss=loss, step=step)
    if step % 20 == 19:
        nbtrain.log(val_loss=2.5 / (step + 1), step=step)
    time.sleep(0.1)
"""


def test_the_dashboard_renders_updates_and_leaves_a_picture(tmp_path):
    lab = JupyterLab(tmp_path)
    write_notebook(lab.notebooks / "dash.ipynb", ["%load_ext nbtrain", TRAINING])
    lab.start()
    lab.start_session("dash.ipynb")
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 1000})
                _check(page, lab)
            except BaseException:
                page.screenshot(path=str(tmp_path / "failure.png"))
                print(f"browser at failure: {tmp_path / 'failure.png'}\njupyter lab log:\n{lab.log()}")
                raise
            finally:
                browser.close()
    finally:
        lab.stop()


def _check(page, lab) -> None:
    page.goto(f"{lab.url}/lab/tree/dash.ipynb?reset&token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
    cells = page.locator(".jp-Notebook .jp-Cell")
    sync_api.expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=60_000)
    cells.nth(0).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    page.keyboard.press("Control+Enter")

    output = cells.nth(1).locator(".jp-OutputArea")
    widget = output.locator(".jupyter-widgets").first
    sync_api.expect(widget).to_be_visible(timeout=60_000)  # the widget, while the cell runs
    steps = re.compile(r"step (\d+)")
    sync_api.expect(output).to_contain_text(steps, timeout=60_000)
    first = int(steps.search(output.inner_text()).group(1))
    sync_api.expect(output).not_to_contain_text(f"step {first} ", timeout=20_000)  # it updates in place
    sync_api.expect(output.locator(".widget-image img, img").first).to_be_visible(timeout=30_000)  # curves drawn
    page.wait_for_timeout(2000)
    cells.nth(1).screenshot(path=str(screenshot_path("dashboard-live.png", lab.root)))

    # When the run ends: a static picture and the summary, as ordinary outputs.
    sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)
    sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
    sync_api.expect(cells.nth(1).locator(".jp-InputPrompt")).to_have_text("[2]:", timeout=30_000)
