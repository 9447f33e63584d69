"""The live dashboard in Notebook 7 (a real ``jupyter notebook`` server and headless Chromium), as in JupyterLab:
the widget appears under the running cell, its chart is drawn in the browser and grows while the ranks train, and
the run leaves its picture and summary in the cell."""

from __future__ import annotations

import re

import pytest
from helpers.labhelp import browser_or_skip, lab_page
from test_dashboard_browser import NOT_OURS, TRAINING, _check_growth, console_errors

sync_api = browser_or_skip()
pytest.importorskip("notebook", reason="Notebook 7 is not installed (pip install 'notebook>=7')")

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(240)]

# Notebook 7.6's own: its shortcuts plugin reads the schema of a settings plugin its registry does not hold; the page
# logs it with nbtrain's extension disabled too.
NOTEBOOK_OWN = re.compile(r"Cannot read properties of undefined \(reading 'schema'\)[\s\S]*notebook_core")


def test_the_live_chart_draws_in_notebook_7(tmp_path):
    sources = ["%load_ext nbtrain", TRAINING]
    with lab_page(tmp_path, "dash.ipynb", sources, {"width": 1300, "height": 1000}, app="notebook") as (nb, page):
        errors = console_errors(page)
        page.goto(f"{nb.url}/notebooks/dash.ipynb?token={nb.token}")
        cells = page.locator(".jp-Notebook .jp-Cell")
        cells.nth(0).locator(".jp-InputArea-editor").click(timeout=90_000)
        page.keyboard.press("Shift+Enter")
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=90_000)
        page.keyboard.press("Control+Enter")  # the training cell, selected by the first one's Shift+Enter
        output = cells.nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator(".jupyter-widgets").first).to_be_visible(timeout=60_000)
        chart = output.locator(".nbt-chart[data-points]")
        sync_api.expect(chart).to_have_count(1, timeout=30_000)  # drawn in the browser once points arrived
        _check_growth(page, chart)
        sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)  # the run's picture, at its end
        sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
        errors = [error for error in errors if not NOT_OURS.search(error) and not NOTEBOOK_OWN.search(error)]
        assert not errors, "the page logged errors:\n" + "\n".join(errors)
