"""The live dashboard in a real JupyterLab and headless Chromium: it appears under the running cell, updates
while the ranks train — the chart, drawn in the browser, grows several times a second, its linear/log and
smoothing controls redraw it while the cell runs, and its load panels gain a sample a second — and leaves
a picture and a summary in the cell when the run ends.

With ``NBTRAIN_SCREENSHOTS=1`` it refreshes ``docs/dashboard-live.png`` (the widget mid-run). Skipped, with
the reason, without Chromium or Playwright.
"""

from __future__ import annotations

import re
import time

import pytest
from helpers.labhelp import browser_or_skip, lab_page, screenshot_path

sync_api = browser_or_skip()

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(240)]


TRAINING = """%%distributed 2 --cpu --keep-alive 0
import math, time, torch, nbtrain
nbtrain.log(total_steps=300)
for step in range(300):
    loss = torch.tensor(2.0 / (step + 1) * (1 + 0.3 * math.sin(step)) + 0.05 * (rank + 1))
    nbtrain.log(loss=loss, step=step)
    if step % 20 == 19:
        nbtrain.log(val_loss=2.5 / (step + 1), step=step)
    time.sleep(0.05)
"""


def console_errors(page) -> list[str]:
    """The page's console errors and uncaught exceptions from now on, as text (filled as they come)."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(f"console.{message.type}: {message.text} at "
                                                     f"{message.location.get('url', '?')}") if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}\n{getattr(error, 'stack', '')}"))
    return errors


# Errors of the page that are JupyterLab's own, whatever nbtrain does: a resource the offline lab cannot fetch, the
# debugger's state asked of a kernel that is busy with the cell. Any other error fails the test — the widget
# manager's too, which nbtrain's widgets can cause.
NOT_OURS = re.compile(r"Failed to load resource|net::ERR_|Could not restore the debugger state")


def _in_lab(tmp_path, second_cell: str, check, more_cells: tuple[str, ...] = (),
            viewport: tuple[int, int] = (1300, 1000)) -> None:
    """Open a notebook of ``%load_ext nbtrain``, ``second_cell`` and ``more_cells`` in JupyterLab, run the first
    cell, start the second (Ctrl+Enter), then ``check(page, lab, cells)``; on failure, a screenshot and the
    server's log. Any JavaScript error the page logged meanwhile fails the test."""
    sources, size = ["%load_ext nbtrain", second_cell, *more_cells], {"width": viewport[0], "height": viewport[1]}
    with lab_page(tmp_path, "dash.ipynb", sources, size) as (lab, page):
        errors = console_errors(page)
        page.goto(f"{lab.url}/lab/tree/dash.ipynb?reset&token={lab.token}")
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        cells = page.locator(".jp-Notebook .jp-Cell")
        sync_api.expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
            1, timeout=60_000)
        cells.nth(0).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
        page.keyboard.press("Control+Enter")
        check(page, lab, cells)
        errors = [error for error in errors if not NOT_OURS.search(error)]
        assert not errors, "the page logged errors:\n" + "\n".join(errors)


def test_the_dashboard_renders_updates_and_leaves_a_picture(tmp_path):
    _in_lab(tmp_path, TRAINING, _check)


RELOADED = """%%distributed 2 --cpu --keep-alive 0
import time, nbtrain
nbtrain.log(total_steps=250)
for step in range(250):
    nbtrain.log(**{"loss": 1.0 / (step + 1), "<img src=x onerror=alert(1)>": float(step)}, step=step)
    time.sleep(0.08)
if rank == 0:
    print("trained to step", step)
"""


def test_a_page_reloaded_during_the_run_shows_it_live_again_and_keeps_its_picture(tmp_path):
    """A page reloaded mid-run shows the live dashboard again; the final picture and summary then reach the cell
    and the saved notebook, and so do the rest of the cell's output (rank 0's last print, nbtrain's closing lines)
    and its prompt (it stayed "[ ]:", as if never run). A metric named like an HTML tag is shown as text everywhere
    (no tag comes alive)."""
    def check(page, lab, cells) -> None:
        alerts: list[str] = []
        page.on("dialog", lambda dialog: dialog.accept() if dialog.type == "beforeunload"
                else (alerts.append(dialog.message), dialog.dismiss()))
        chart = cells.nth(1).locator(".jp-OutputArea .nbt-chart[data-points]")
        sync_api.expect(chart).to_have_count(1, timeout=60_000)
        _save(page)  # as autosave does: the file holds the live widget's output, and the notebook is trusted
        reloaded = time.monotonic()
        page.reload()
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea")
        chart = output.locator(".nbt-chart[data-points]")
        sync_api.expect(chart).to_have_count(1, timeout=30_000)  # the live dashboard, again
        print(f"live again {time.monotonic() - reloaded:.1f} s after the reload")
        drawn = int(chart.get_attribute("data-points"))
        page.wait_for_function("([chart, drawn]) => Number(chart.dataset.points) > drawn",
                               arg=[chart.element_handle(), drawn], timeout=10_000)  # and live: it grows
        assert chart.locator(".u-title").filter(has_text="<img src=x onerror=alert(1)>").count() == 1
        sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)  # then the final picture
        sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
        sync_api.expect(output).to_contain_text("<img src=x onerror=alert(1)>")  # the name, as text
        sync_api.expect(output).to_contain_text("trained to step 249", timeout=15_000)  # printed after the reload
        sync_api.expect(output).to_contain_text("back in the notebook")  # nbtrain's closing lines
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        sync_api.expect(cell.locator(".jp-InputPrompt")).to_have_text("[2]:", timeout=15_000)
        cell.screenshot(path=str(lab.root / "reloaded-end.png"))
        assert page.locator("img[src='x']").count() == 0 and not alerts, alerts
        _save(page)
        _saved_picture_and_summary(lab.notebooks / "dash.ipynb")

    _in_lab(tmp_path, RELOADED, check)


def _save(page) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+s")
    sync_api.expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=10_000)


def _saved_picture_and_summary(path, timeout: float = 15.0) -> None:
    """The saved cell holds the final picture and the summary, and no widget."""
    import json

    deadline = time.monotonic() + timeout
    while True:
        outputs = json.loads(path.read_text())["cells"][1]["outputs"]
        data = [o.get("data", {}) for o in outputs]
        kinds = [sorted(d) for d in data]
        pngs = [d for d in data if "image/png" in d]
        summaries = ["".join(d["text/markdown"]) for d in data if "text/markdown" in d]  # saved as a list of lines
        if len(pngs) == 1 and len(summaries) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(pngs) == 1 and len(summaries) == 1, f"saved outputs: {kinds}"
    assert "2 ranks on gloo on cpu finished" in summaries[0]
    assert not any("application/vnd.jupyter.widget-view+json" in d for d in data), kinds


def test_gpus_shows_the_machines_load_over_time_then_leaves_a_table(tmp_path):
    def check(page, lab, cells) -> None:
        output = cells.nth(1).locator(".jp-OutputArea")
        chart = output.locator(".nbt-chart")
        sync_api.expect(chart.locator(".nbt-load-busy .u-title")).to_have_text("CPU, % of one core", timeout=60_000)
        sync_api.expect(chart.locator(".nbt-chart-controls")).to_be_hidden()  # no curves in %gpus: no curve controls
        page.wait_for_function("el => Number(el.dataset.loadPoints) >= 4", arg=chart.element_handle(), timeout=15_000)
        assert "CPU (machine)" in chart.locator(".nbt-load-busy .u-legend").inner_text()
        memory_legend = chart.locator(".nbt-load-memory .u-legend").inner_text()
        assert "RAM (machine)" in memory_legend and "CPU (machine)" not in memory_legend, memory_legend
        sync_api.expect(output).to_contain_text("%gpus: stopped at", timeout=30_000)  # --for 6: a table stays
        sync_api.expect(output.locator(".nbt-chart")).to_have_count(0)

    _in_lab(tmp_path, "%gpus --for 6 --interval 0.5", check)


def _check(page, lab, cells) -> None:
    output = cells.nth(1).locator(".jp-OutputArea")
    widget = output.locator(".jupyter-widgets").first
    sync_api.expect(widget).to_be_visible(timeout=60_000)  # the widget, while the cell runs
    steps = re.compile(r"step (\d+)")
    sync_api.expect(output).to_contain_text(steps, timeout=60_000)
    first = int(steps.search(output.inner_text()).group(1))
    sync_api.expect(output).not_to_contain_text(f"step {first} ", timeout=20_000)  # it updates in place
    chart = output.locator(".nbt-chart[data-points]")
    sync_api.expect(chart).to_have_count(1, timeout=30_000)  # drawn once points arrived
    _check_growth(page, chart)
    _check_controls(chart)
    page.wait_for_timeout(1000)
    cells.nth(1).screenshot(path=str(screenshot_path("dashboard-live.png", lab.root)))

    # When the run ends: a static picture and the summary, as ordinary outputs.
    sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)
    sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
    sync_api.expect(cells.nth(1).locator(".jp-InputPrompt")).to_have_text("[2]:", timeout=30_000)


def _check_growth(page, chart) -> None:
    """Over 3 s the drawn point count grows at least four times: the curve moves as the loss does; the load
    panels below (CPU and RAM over the run, without a GPU) gain a sample a second."""
    counts, samples = [], []
    for _ in range(30):
        counts.append(int(chart.get_attribute("data-points")))
        samples.append(int(chart.get_attribute("data-load-points") or 0))
        page.wait_for_timeout(100)
    increases = sum(1 for a, b in zip(counts, counts[1:], strict=False) if b > a)
    assert increases >= 4, f"the chart's points grew {increases} times in 3 s: {counts}"
    assert samples[-1] - samples[0] >= 2, f"the load panels' samples over 3 s: {samples}"
    sync_api.expect(chart.locator(".nbt-load-busy .u-title")).to_have_text("CPU, % of one core")
    sync_api.expect(chart.locator(".nbt-load-memory .u-title")).to_have_text("RAM, % of the machine")
    legend = chart.locator(".nbt-load-busy .u-legend").inner_text()
    assert "rank 0" in legend and "rank 1" in legend and "CPU (machine)" in legend, legend
    _check_device_styles(chart)


def _check_device_styles(chart) -> None:
    """Each device's line is drawn in the colour and dash the final picture gives it (theme.device_style)."""
    from matplotlib import colors

    from nbtrain.kernel.dashboard.telemetry_series import MACHINE, DeviceKey
    from nbtrain.kernel.dashboard.theme import device_style

    for key in (MACHINE, DeviceKey.rank(0), DeviceKey.rank(1)):
        row = chart.locator(".nbt-load-memory .u-legend .u-series").filter(has_text=key.memory_label)
        border = row.locator(".u-marker").evaluate("m => getComputedStyle(m).borderTopColor + ' ' + getComputedStyle(m).borderTopStyle")
        red, green, blue = (round(255 * c) for c in colors.to_rgb(device_style(key)["color"]))
        dash = "dashed" if device_style(key)["dash"] else "solid"
        assert border == f"rgb({red}, {green}, {blue}) {dash}", f"{key.label}: {border}"


def _check_controls(chart) -> None:
    """linear/log, the smoothing slider, step/wall time, zoom and hover act in the browser while the cell runs."""
    sync_api.expect(chart).to_have_attribute("data-distr", "1")  # linear
    chart.locator("button.nbt-log").click()
    sync_api.expect(chart).to_have_attribute("data-distr", "3", timeout=5000)  # drawn on a log scale
    chart.locator("button.nbt-linear").click()
    sync_api.expect(chart).to_have_attribute("data-distr", "1", timeout=5000)
    slider = chart.locator("input.nbt-smoothing")
    slider.fill("0")
    sync_api.expect(chart).to_have_attribute("data-smoothing", "0", timeout=5000)
    assert float(chart.get_attribute("data-smooth-gap")) == 0, "no smoothing: the bold curve is the raw one"
    slider.fill("0.95")
    sync_api.expect(chart).to_have_attribute("data-smoothing", "0.95", timeout=5000)
    assert float(chart.get_attribute("data-smooth-gap")) > 0, "smoothed: the bold curve leaves the raw one"
    slider.fill("0.6")
    chart.locator("button.nbt-walltime").click()
    sync_api.expect(chart).to_have_attribute("data-x", "time", timeout=5000)  # x: seconds since the first value
    chart.locator("button.nbt-step").click()
    sync_api.expect(chart).to_have_attribute("data-x", "step", timeout=5000)
    over = chart.locator(".u-over").first
    box = over.bounding_box()
    over.page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
    over.page.mouse.down()
    over.page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2, steps=5)
    over.page.mouse.up()
    sync_api.expect(chart).to_have_attribute("data-zoomed", "true", timeout=5000)  # and stays zoomed as points arrive
    over.dblclick()
    sync_api.expect(chart).to_have_attribute("data-zoomed", "false", timeout=5000)
    over.hover()  # the legend reads the values under the cursor
    sync_api.expect(chart.locator(".u-legend .u-series").nth(4).locator(".u-value")).to_have_text(
        re.compile(r"^\d"), timeout=5000)
    print(f"chart: {chart.get_attribute('data-points')} points; last update {chart.get_attribute('data-prepare-ms')} ms "
          f"to prepare, {chart.get_attribute('data-draw-ms')} ms to draw")


EARLIER = """%%distributed 2 --cpu --keep-alive 0
import time, nbtrain
for step in range(40):
    nbtrain.log(loss=3.0 / (step + 1), step=step)
    time.sleep(0.02)
"""
LATER = EARLIER.replace("--keep-alive 0", "--keep-alive 0 --grad-accum 2").replace("range(40)", "range(400)")


def _run_and_wait(page, cell) -> None:
    """Start ``cell`` once the one before it has finished, then wait for its live chart."""
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    sync_api.expect(cell.locator(".nbt-chart[data-points]")).to_have_count(1, timeout=60_000)


def test_earlier_runs_are_drawn_faded_labelled_grouped_and_hidden_from_the_legend(tmp_path):
    """Three runs in one kernel: the third's chart draws the first two's loss faded and dashed beside its own; both
    differed from it alike, so one legend row stands for both (it had a row each, near-identical), labelled with the
    option they lacked; a click on that row hides both, another shows them again."""
    def check(page, lab, cells) -> None:
        sync_api.expect(cells.nth(1).locator(".jp-OutputArea img")).to_have_count(1, timeout=90_000)  # run 1 ended
        cells.nth(2).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        sync_api.expect(cells.nth(2).locator(".jp-OutputArea img")).to_have_count(1, timeout=90_000)  # run 2 ended
        _run_and_wait(page, cells.nth(3))
        chart = cells.nth(3).locator(".nbt-chart[data-points]")
        sync_api.expect(chart).to_have_attribute("data-overlays", "2", timeout=10_000)
        sync_api.expect(chart).to_have_attribute("data-overlays-shown", "2")
        row = chart.locator(".u-legend .u-series.nbt-overlay").filter(visible=True)
        sync_api.expect(row).to_have_count(1)
        sync_api.expect(row).to_contain_text("loss · runs 1, 2: finished · no --grad-accum")
        border = row.locator(".u-marker").evaluate("m => getComputedStyle(m).borderTopColor")
        assert border.startswith("rgba(") and border.endswith(", 0.4)"), f"not faded: {border}"
        row.locator(".u-label").click()
        sync_api.expect(chart).to_have_attribute("data-overlays-shown", "0", timeout=5000)
        chart.locator("button.nbt-log").click()  # a rebuilt panel keeps them hidden
        sync_api.expect(chart).to_have_attribute("data-distr", "3", timeout=5000)
        sync_api.expect(chart).to_have_attribute("data-overlays-shown", "0")
        chart.locator(".u-legend .u-series.nbt-overlay").filter(visible=True).locator(".u-label").click()
        sync_api.expect(chart).to_have_attribute("data-overlays-shown", "2", timeout=5000)

    _in_lab(tmp_path, EARLIER, check, (EARLIER, LATER))


def test_the_toolbar_downloads_the_series_as_csv_and_the_panels_as_png(tmp_path):
    """CSV: one row per bucket drawn (series, step, time, mean, min, max); PNG: the panels as shown, in colour."""
    import csv
    import io

    import numpy
    from PIL import Image

    def check(page, lab, cells) -> None:
        chart = cells.nth(1).locator(".nbt-chart[data-points]")
        sync_api.expect(chart).to_have_count(1, timeout=60_000)
        page.wait_for_function("el => Number(el.dataset.points) >= 40", arg=chart.element_handle(), timeout=30_000)
        with page.expect_download() as info:
            chart.locator("button.nbt-export-csv").click()
        assert info.value.suggested_filename == "nbtrain-chart.csv"
        points = int(chart.get_attribute("data-points"))
        rows = list(csv.DictReader(io.StringIO(open(info.value.path(), encoding="utf-8").read())))
        assert list(rows[0]) == ["series", "step", "time", "mean", "min", "max"]
        names = {row["series"] for row in rows}
        assert names == {"loss", "val_loss"} and points <= len(rows) <= points + 4, (names, len(rows), points)
        first = next(row for row in rows if row["series"] == "loss")
        assert float(first["step"]) == 0 and float(first["time"]) > 1e9  # unix seconds
        with page.expect_download() as info:
            chart.locator("button.nbt-export-png").click()
        assert info.value.suggested_filename == "nbtrain-chart.png"
        image = Image.open(info.value.path()).convert("RGB")
        box = chart.locator(".nbt-chart-grid").bounding_box()
        assert image.width >= box["width"] * 0.9 and image.height >= 200, (image.size, box)
        red, green, blue = image.getpixel((0, 0))
        assert (red, green, blue) == (255, 255, 255)
        pixels = numpy.asarray(image, dtype=int)
        colored = int(((abs(pixels[..., 0] - pixels[..., 1]) > 60) | (abs(pixels[..., 1] - pixels[..., 2]) > 60)).sum())
        assert colored > 100, "the curves are drawn in colour"

    _in_lab(tmp_path, TRAINING, check)


# The README's quickstart as one cell: about a second of training, 160 steps, on two ranks.
QUICKSTART = """%%distributed 2 --cpu --keep-alive 0
import torch, nbtrain
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
g = torch.Generator().manual_seed(0)
X = torch.randn(4096, 2, generator=g)
Y = ((X ** 2).sum(1) < 1.0).long()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 2)))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
x, y = X[rank::world_size], Y[rank::world_size]
for epoch in range(20):
    for i in range(0, len(x), 256):
        loss = nn.functional.cross_entropy(model(x[i:i + 256]), y[i:i + 256])
        opt.zero_grad(); loss.backward(); opt.step()
        nbtrain.log(loss=loss)
"""


def test_a_newcomers_quickstart_ends_with_its_load_drawn_one_step_count_and_a_short_summary(tmp_path):
    """The quickstart, as a newcomer runs it with the nbtrain panel open: the final picture draws the load over the
    run as lines (it had empty panels: one sample), the summary is a few short lines in the dashboard's units and
    plain words, the panel's run card counts the steps as the summary does, and the page logs no error.
    Its screenshot (first-run.png beside the test's lab) is what a newcomer sees."""
    import base64
    import io

    import numpy
    from matplotlib import colors
    from PIL import Image

    from nbtrain.kernel.dashboard.telemetry_series import MACHINE
    from nbtrain.kernel.dashboard.theme import device_style

    def check(page, lab, cells) -> None:
        page.locator("#nbtrain-status").click()
        panel = page.locator("#nbtrain-panel")
        sync_api.expect(panel).to_be_visible(timeout=30_000)
        output = cells.nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)
        sync_api.expect(output).to_contain_text("2 ranks on gloo on cpu finished", timeout=30_000)
        summary = output.locator(".jp-RenderedMarkdown").inner_text()
        print(f"summary ({len(summary.split())} words):\n{summary}")
        assert len(summary.split()) <= 60 and "NVMLError" not in summary and "No GPU on this machine" in summary
        assert "of a core" in summary and len(summary.splitlines()) == len(set(summary.splitlines())) >= 3
        step = re.search(r"step (\d+)", summary).group(1)
        card = panel.locator(".nbtrain-Run", has=page.locator(".nbtrain-Notebook", has_text="dash"))
        sync_api.expect(card.locator(".nbtrain-Run-facts")).to_contain_text(f"step {step} ·", timeout=15_000)
        cells.nth(1).screenshot(path=str(lab.root / "first-run.png"))

        source = output.locator("img").get_attribute("src")
        image = numpy.asarray(Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))).convert("RGB"), dtype=int)
        grey = numpy.array([round(255 * c) for c in colors.to_rgb(device_style(MACHINE)["color"])])
        load_row = image[image.shape[0] // 2:]  # the load panels, under the curves
        machine_pixels = int((numpy.abs(load_row - grey).sum(axis=2) < 30).sum())
        assert machine_pixels > 300, f"the machine's load line: {machine_pixels} pixels of its grey (a legend's swatch alone ~40)"

    _in_lab(tmp_path, QUICKSTART, check, viewport=(1400, 1000))


def test_the_machines_row_wraps_beside_the_open_side_panel_and_is_never_cut(tmp_path):
    """With the nbtrain side panel open in a 1200-pixel window the machine's row ("… RAM 4.3 GiB / 23.5 Gi") was cut
    at the output's edge: it wraps between its parts now, each part whole. Screenshot: narrow-machine-row.png."""
    def check(page, lab, cells) -> None:
        page.locator("#nbtrain-status").click()
        sync_api.expect(page.locator("#nbtrain-panel")).to_be_visible(timeout=30_000)
        output = cells.nth(1).locator(".jp-OutputArea")
        machine = output.locator(".nbt-row", has_text="machine")
        sync_api.expect(machine).to_contain_text(re.compile(r"RAM .* / [\d.]+ GiB"), timeout=60_000)
        page.wait_for_timeout(500)
        cells.nth(1).screenshot(path=str(lab.root / "narrow-machine-row.png"))
        for row in output.locator(".nbt-row").all():
            width = row.evaluate("r => [r.scrollWidth, r.clientWidth, r.getBoundingClientRect().right]")
            edge = output.evaluate("o => o.getBoundingClientRect().right")
            assert width[0] <= width[1] + 1 and width[2] <= edge + 1, f"{row.inner_text()!r} is cut: {width}, edge {edge}"
        assert "of a core" in machine.inner_text(), "the machine's CPU in the load panels' unit"

    _in_lab(tmp_path, "%gpus --for 8", check, viewport=(1200, 1000))


def test_the_kernel_indicator_says_busy_while_the_ranks_train(tmp_path):
    """The notebook's kernel status read "Idle" while the ranks trained: JupyterLab opens a kernel subshell for the
    dashboard's widgets, and that request's status messages set the page's kernel status. The server now leaves
    them untracked: the status bar says Busy until the cell ends, then Idle."""
    def check(page, lab, cells) -> None:
        output = cells.nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator(".nbt-chart[data-points]")).to_have_count(1, timeout=60_000)
        status = page.locator(".jp-StatusBar-TextItem", has_text="ipykernel")
        seen = []
        for _ in range(12):
            page.wait_for_timeout(500)
            seen.append(status.inner_text())
        assert all(text.endswith("| Busy") for text in seen), seen
        sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)
        sync_api.expect(status).to_have_text(re.compile(r"\| Idle$"), timeout=30_000)

    _in_lab(tmp_path, TRAINING.replace("range(300)", "range(240)"), check)


def test_a_reloaded_page_says_busy_until_the_cell_ends(tmp_path):
    """A page reloaded mid-run asks the kernel, on a subshell, to show its dashboard again; that request's own status
    messages ("busy", then "idle") must not set the page's kernel status: it says Busy until the cell ends."""
    def check(page, lab, cells) -> None:
        page.on("dialog", lambda dialog: dialog.accept())
        sync_api.expect(cells.nth(1).locator(".jp-OutputArea .nbt-chart[data-points]")).to_have_count(1, timeout=60_000)
        _save(page)  # as autosave does: the reloaded page opens the notebook trusted, its dashboard output in it
        page.reload()
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea")
        sync_api.expect(output.locator(".nbt-chart[data-points]")).to_have_count(1, timeout=30_000)
        status = page.locator(".jp-StatusBar-TextItem", has_text="ipykernel")
        seen = []
        for _ in range(10):
            page.wait_for_timeout(500)
            seen.append(status.inner_text())
        assert all(text.endswith("| Busy") for text in seen), seen
        sync_api.expect(output.locator("img")).to_have_count(1, timeout=90_000)
        sync_api.expect(status).to_have_text(re.compile(r"\| Idle$"), timeout=30_000)

    _in_lab(tmp_path, RELOADED, check)
