"""A detached run in the JupyterLab panel (real JupyterLab, headless Chromium): a notebook starts a ``--detach`` run,
the panel's "Detached runs" lists it — its id, state, step, the notebook that started it and the line that attaches
to it — and its Stop ends the run through the run's own agent."""

from __future__ import annotations

import time

import psutil
import pytest
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
