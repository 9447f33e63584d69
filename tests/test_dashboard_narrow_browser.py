"""The final picture in a narrow notebook (a 600 px wide JupyterLab page, headless Chromium): its legends and labels
stay readable — no text shrinks below 10 px on the page — and the load panels' legend is outside their plots.

The picture's smallest text is read from a final figure drawn here the way the kernel draws it (its text's points at
the figure's DPI, in the PNG's pixels); the page gives the scale the PNG is shown at: together, what a reader sees. Leaves ``final-narrow.png`` (the cell as shown) in the
test's folder, or docs/ with ``NBTRAIN_SCREENSHOTS=1``. Skipped, with the reason, without Chromium or Playwright.
"""

from __future__ import annotations

import time

import pytest
from helpers.labhelp import browser_or_skip, lab_page, screenshot_path

from nbtrain.kernel.dashboard import final
from nbtrain.kernel.dashboard.model import RunModel
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.telemetry import RankUsage, Snapshot
from nbtrain.kernel.observers.events import RankInfo, RunInfo

sync_api = browser_or_skip()

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(240)]

TRAINING = """%%distributed 2 --cpu --keep-alive 0
import time, nbtrain
for step in range(60):
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    if step % 10 == 9:
        nbtrain.log(val_loss=1.5 / (step + 1), step=step)
    time.sleep(0.05)
"""
NARROW = 600  # the notebook's width, in CSS pixels (the page's, less the sidebars' tab bars)
READABLE_PX = 10  # the smallest text a reader should have to read


def smallest_text_px() -> float:
    """The smallest text of a final figure like the run's (two series in a panel, the load of two ranks and the
    machine), in the PNG's pixels."""
    from matplotlib.text import Text

    model = RunModel()
    model.set_info(RunInfo("r/1", 2, "gloo", "cpu", (), (RankInfo(0, 101, "cpu", None), RankInfo(1, 102, "cpu", None)), False))
    model.telemetry_source.set_ranks(())  # made-up pids: keep the sampler off them
    model.add_metrics(0, [(s, 100.0 + s / 20, {"loss": 1.0 / (s + 1), "val_loss": 1.5 / (s + 1)}) for s in range(60)])
    host = HostStatus(cpu_percent=40.0, cpu_count=2, memory_used=2 * 2**30, memory_total=8 * 2**30)
    for t in range(3):
        ranks = (RankUsage(0, 101, "cpu", None, None, 90.0, 2**29), RankUsage(1, 102, "cpu", None, None, 95.0, 2**29))
        model.add_sample(Snapshot(time.time() + t, (), ranks, host, "no NVIDIA driver was found"))
    figure = final.final_figure(model.store, model.telemetry, "nbtrain · 2 ranks · gloo on cpu · finished")
    figure.canvas.draw()  # legends and ticks are laid out
    sizes = [text.get_fontsize() for text in figure.findobj(Text) if text.get_text().strip() and text.get_visible()]
    return min(sizes) * final.DPI / 72


def test_the_final_pictures_text_stays_readable_in_a_narrow_notebook(tmp_path):
    sources, viewport = ["%load_ext nbtrain", TRAINING], {"width": NARROW + 70, "height": 1000}
    with lab_page(tmp_path, "narrow.ipynb", sources, viewport) as (lab, page):
        page.goto(f"{lab.url}/lab/tree/narrow.ipynb?reset&token={lab.token}")
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        cells = page.locator(".jp-Notebook .jp-Cell")
        sync_api.expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
            1, timeout=60_000)
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()  # the file browser closes
        sync_api.expect(page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")).to_have_count(0)
        notebook = page.locator(".jp-NotebookPanel").evaluate("panel => panel.getBoundingClientRect().width")
        assert abs(notebook - NARROW) < 20, f"the notebook is {notebook:.0f} px wide"
        cells.nth(0).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
        page.keyboard.press("Control+Enter")
        picture = cells.nth(1).locator(".jp-OutputArea img")
        sync_api.expect(picture).to_have_count(1, timeout=120_000)
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=picture.element_handle())
        shown, natural = picture.evaluate("img => [img.getBoundingClientRect().width, img.naturalWidth]")
        on_page = smallest_text_px() * shown / natural
        print(f"a {notebook:.0f} px notebook shows the {natural} px picture {shown:.0f} px wide: its smallest text "
              f"is {on_page:.1f} px on the page")
        cells.nth(1).screenshot(path=str(screenshot_path("final-narrow.png", tmp_path)))
        assert on_page >= READABLE_PX, f"the picture's text is {on_page:.1f} px on a {NARROW} px page"
