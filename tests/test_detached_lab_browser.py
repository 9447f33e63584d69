"""A detached run in the JupyterLab panel (real JupyterLab, headless Chromium): a notebook starts a ``--detach`` run,
the panel's "Detached runs" lists it — its id, state, step, the notebook that started it and the line that attaches
to it — and its Stop ends the run through the run's own agent."""

from __future__ import annotations

import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.labhelp import lab_page
from helpers.workers import assert_no_workers

from nbtrain.wire.runfolder import RecordedState, read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CELLS = ["%load_ext nbtrain",
         "%%distributed 2 --cpu --detach --run-id lab-run --no-dashboard\nimport time, nbtrain\n"
         "for step in range(5000):\n    nbtrain.log(seen=step)\n    time.sleep(0.05)"]


def test_the_panel_lists_a_detached_run_with_its_notebook_and_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))  # the lab, its kernels and the run's agent
    with lab_page(tmp_path, "detached.ipynb", CELLS, {"width": 1400, "height": 900}) as (lab, page):
        page.goto(f"{lab.url}/lab/tree/detached.ipynb?reset&token={lab.token}")
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
        for _ in CELLS:
            page.keyboard.press("Shift+Enter")
        page.locator("#nbtrain-status").click()
        row = page.locator("#nbtrain-panel .nbtrain-DetachedRun[data-run-id='lab-run']")
        row.wait_for(state="visible", timeout=60_000)
        page.wait_for_function("/step [0-9]+/.test(document.querySelector("
                               "\"#nbtrain-panel .nbtrain-DetachedRun[data-run-id='lab-run'] .nbtrain-Run-facts\").textContent)",
                               timeout=60_000)
        assert row.locator(".nbtrain-State").inner_text() == "running"
        assert row.locator(".nbtrain-Notebook").inner_text() == "detached.ipynb"
        assert row.locator(".nbtrain-DetachedRun-attach").inner_text() == "%distributed_attach lab-run"
        assert "2 ranks" in row.locator(".nbtrain-Run-facts").inner_text()
        summary = read_manifest("lab-run")
        row.locator(".nbtrain-Stop").click()
        deadline = time.monotonic() + 30
        while read_manifest("lab-run").state is RecordedState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.2)
        assert read_manifest("lab-run").state is RecordedState.STOPPED
        page.wait_for_function("document.querySelector(\"#nbtrain-panel .nbtrain-DetachedRun[data-run-id='lab-run'] "
                               ".nbtrain-State\").textContent == 'stopped'", timeout=30_000)
        assert not row.locator(".nbtrain-Stop").is_visible()
        agent = psutil.Process(summary.agent_pid) if psutil.pid_exists(summary.agent_pid) else None
        if agent is not None:
            agent.wait(15)  # the run's agent exits after its run (a TimeoutExpired fails the test)
    assert_no_workers(timeout=10)


FOLLOWED = ("%%distributed 2 --cpu --detach --run-id lab-gone --no-dashboard\nimport time, nbtrain\n"
            "for step in range(120):\n    nbtrain.log(seen=step)\n    time.sleep(0.05)\nlast = step")


def test_a_run_whose_notebook_is_gone_is_followed_from_the_notebook_in_front(tmp_path, monkeypatch):
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    with lab_page(tmp_path, "other.ipynb", ["print('the notebook in front')"], {"width": 1400, "height": 900}) as (lab, page):
        starter = Kernel(notebook=str(lab.notebooks / "deleted.ipynb"))  # its notebook was removed since
        try:
            starter.run("%load_ext nbtrain")
            starter.run(FOLLOWED)
            page.goto(f"{lab.url}/lab/tree/other.ipynb?reset&token={lab.token}")
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
            page.locator("#nbtrain-status").click()
            row = page.locator("#nbtrain-panel .nbtrain-DetachedRun[data-run-id='lab-gone']")
            row.wait_for(state="visible", timeout=60_000)
            assert not row.locator(".nbtrain-Notebook").is_visible()  # nothing to open
            row.locator(".nbtrain-DetachedRun-follow").click()
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(1).locator(".jp-OutputArea-output").first.wait_for(timeout=60_000)
            assert 'nbtrain.attach("lab-gone")' in cells.nth(1).locator(".jp-InputArea-editor").inner_text()
            page.wait_for_function("document.querySelectorAll('.jp-Notebook .jp-Cell')[1].textContent"
                                   ".includes('back in the notebook')", timeout=90_000)
            text = cells.nth(1).locator(".jp-OutputArea").inner_text()
            assert "attached to detached run lab-gone" in text
            assert "controls this run: this kernel follows it" in text  # the kernel that started it lives
        finally:
            starter.shutdown()
    assert_no_workers(timeout=10)
