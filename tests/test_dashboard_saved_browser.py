"""A notebook saved while its run trained, opened later in JupyterLab (headless Chromium): it shows the run's latest
state in words where the live widget cannot be drawn, never "Error displaying widget: model not found"; the live
page shows the dashboard once (the words are hidden under the live widget); the finished run's notebook holds the
final picture and the summary.

Skipped, with the reason, without Chromium or Playwright.
"""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest
from helpers.labhelp import browser_or_skip, lab_page

sync_api = browser_or_skip()

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(300)]

TRAINING = """%%distributed 2 --cpu --keep-alive 0
import time, nbtrain
nbtrain.log(total_steps=400)
for step in range(400):
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    time.sleep(0.06)
"""
WIDGET = "application/vnd.jupyter.widget-view+json"
STEP = re.compile(r"step (\d+) of 400")


def _open(page, lab, name: str):
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
    sync_api.expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=60_000)
    return page.locator(".jp-Notebook .jp-Cell")


def _save(page) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+s")
    sync_api.expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=10_000)


def _outputs(path) -> list[dict]:
    return [o.get("data", {}) for o in json.loads(path.read_text())["cells"][1]["outputs"]]


def _text(data: dict) -> str:
    return "".join(data.get("text/plain", ""))  # saved as a list of lines


def test_a_notebook_saved_mid_run_shows_the_latest_state_when_opened_later(tmp_path):
    sources, viewport = ["%load_ext nbtrain", TRAINING], {"width": 1100, "height": 1000}
    with lab_page(tmp_path, "dash.ipynb", sources, viewport) as (lab, page):
        cells = _open(page, lab, "dash.ipynb")
        cells.nth(0).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
        page.keyboard.press("Control+Enter")
        output = cells.nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator(".nbt-chart[data-points]")).to_have_count(1, timeout=60_000)
        words = output.locator(".jp-OutputArea-child").filter(has=page.locator(".nbtrain-snapshot"))
        # the ticker's refresh reached the page: its words name a step (they said "starting" at first)
        sync_api.expect(words).to_contain_text(STEP, timeout=30_000)
        sync_api.expect(words).to_be_hidden()  # the live page shows the dashboard once
        _save(page)  # as autosave does while the run goes on
        shutil.copy(lab.notebooks / "dash.ipynb", lab.notebooks / "saved.ipynb")
        saved = _outputs(lab.notebooks / "saved.ipynb")
        assert any(WIDGET in d for d in saved), [sorted(d) for d in saved]
        step = next(int(m.group(1)) for d in saved if (m := STEP.search(_text(d))))
        assert 0 < step < 399, step  # saved mid-run, with a step the ranks had reached

        sync_api.expect(output.locator("img")).to_have_count(1, timeout=120_000)  # the run's end
        sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
        _save(page)
        finished = _outputs(lab.notebooks / "dash.ipynb")
        kinds = [sorted(d) for d in finished]
        summaries = ["".join(d["text/markdown"]) for d in finished if "text/markdown" in d]
        assert sum("image/png" in d for d in finished) == 1 and len(summaries) == 1, kinds
        assert "finished" in summaries[0] and "nbtrain-snapshot" not in summaries[0], summaries
        assert not any(WIDGET in d for d in finished), kinds

        cells = _open(page, lab, "saved.ipynb")  # opened later: its widget's models are gone
        output = cells.nth(1).locator(".jp-OutputArea")
        widget = output.locator(".jp-OutputArea-output").filter(has_text="model not found")
        sync_api.expect(widget).to_have_count(1, timeout=60_000)  # the widget manager gave up on it
        sync_api.expect(widget).to_be_hidden()
        sync_api.expect(page.get_by_text("model not found")).to_be_hidden()
        shown = output.locator(".jp-OutputArea-child").filter(has=page.locator(".nbtrain-snapshot"))
        sync_api.expect(shown).to_be_visible()
        sync_api.expect(shown).to_contain_text(f"step {step} of 400")
        sync_api.expect(shown).to_contain_text("Logged: loss")
        sync_api.expect(shown).to_contain_text("Last seen at")
        cells.nth(1).screenshot(path=str(tmp_path / "saved-mid-run.png"))
        print(f"the reopened cell: {tmp_path / 'saved-mid-run.png'}; it shows step {step}")


BACKGROUND = """%%distributed 2 --cpu --background
import time, nbtrain
nbtrain.log(total_steps=100)
for step in range(100):
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    time.sleep(0.05)
"""


def test_a_background_run_that_ended_with_no_page_open_leaves_its_final_picture_in_the_reopened_notebook(tmp_path):
    sources, viewport = ["%load_ext nbtrain", BACKGROUND], {"width": 1100, "height": 1000}
    with lab_page(tmp_path, "bg.ipynb", sources, viewport) as (lab, page):
        first = page.context.browser.new_page(viewport=viewport)  # the page that starts the run, closed as it trains
        cells = _open(first, lab, "bg.ipynb")
        cells.nth(0).locator(".jp-InputArea-editor").click()
        first.keyboard.press("Shift+Enter")
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
        first.keyboard.press("Control+Enter")
        output = cells.nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator(".nbt-chart[data-points]")).to_have_count(1, timeout=60_000)
        _save(first)
        first.close()  # the kernel stays
        deadline = time.monotonic() + 90
        while any(run["active"] for run in lab.api("GET", "nbtrain/runs")["runs"]):
            assert time.monotonic() < deadline, "the background run did not end"
            time.sleep(0.5)
        assert not any("image/png" in d for d in _outputs(lab.notebooks / "bg.ipynb"))  # nothing reached the file

        cells = _open(page, lab, "bg.ipynb")  # the same kernel, idle: it gives the page the run's final picture
        output = cells.nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator("img")).to_have_count(1, timeout=60_000)
        sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
        _save(page)
        finished = _outputs(lab.notebooks / "bg.ipynb")
        assert sum("image/png" in d for d in finished) == 1, [sorted(d) for d in finished]
        assert any("finished" in "".join(d.get("text/markdown", "")) for d in finished)

        page.reload()  # opened once more: the same picture again changes nothing
        cells = _open(page, lab, "bg.ipynb")
        sync_api.expect(cells.nth(1).locator(".jp-OutputArea img")).to_have_count(1, timeout=60_000)
        page.wait_for_timeout(3000)
        sync_api.expect(page.locator(".jp-mod-dirty")).to_have_count(0)
