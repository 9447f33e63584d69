"""What the tests of detached runs share: a runs directory of the test's own, kernels that load nbtrain and are
shut down after the test, a detached cell started, a step of the run awaited, and nothing of the run left behind."""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.workers import assert_no_workers

from nbtrain.wire import runfolder


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A runs directory of the test's own, which the kernels (and their agents) inherit."""
    directory = tmp_path / "runs"
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(directory))
    return directory


@pytest.fixture
def kernels():
    started: list[Kernel] = []

    def start() -> Kernel:
        kernel = Kernel()
        started.append(kernel)
        kernel.run("%load_ext nbtrain")
        return kernel

    yield start
    for kernel in started:
        kernel.shutdown()


def start_detached(kernel: Kernel, cell: str, steps: int = 100) -> tuple[str, float]:
    began = time.monotonic()
    out = kernel.run(cell.replace("STEPS", str(steps)))
    seconds = time.monotonic() - began
    found = re.search(r"detached run (\S+): it goes on", out)
    assert found, out
    return found.group(1), seconds


def wait_for_step(run_id: str, step: int, timeout: float = 90) -> runfolder.RunSummary:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summary = runfolder.read_manifest(run_id)
        if summary is not None and summary.step is not None and summary.step >= step:
            return summary
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not reach step {step}: {runfolder.read_manifest(run_id)}")


def assert_nothing_left(summary: runfolder.RunSummary) -> None:
    deadline = time.monotonic() + 15
    while psutil.pid_exists(summary.agent_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(psutil.NoSuchProcess):
        if psutil.Process(summary.agent_pid).status() != psutil.STATUS_ZOMBIE:
            raise AssertionError(f"the run's agent {summary.agent_pid} is still running")
        raise psutil.NoSuchProcess(summary.agent_pid)
    assert_no_workers(timeout=5)
    leftovers = [name for name in os.listdir("/dev/shm") if name.startswith(f"nbtrain-{summary.agent_pid}")]
    assert not leftovers
