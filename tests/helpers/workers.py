"""The rank processes this test run started, found through the mark they inherit from the test process.

conftest sets ``NBTRAIN_TEST_SESSION`` before any rank starts; ranks (and the kernels tests start, and
their ranks) inherit it, so a check sees only this run's processes, orphans included, and not those of
another test run on the same machine.
"""

from __future__ import annotations

import os
import time

import psutil

SESSION_VARIABLE = "NBTRAIN_TEST_SESSION"


def nbtrain_workers() -> list[psutil.Process]:
    """Every live rank process started by this test run, orphaned or not."""
    mark = os.environ.get(SESSION_VARIABLE)
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = proc.info["cmdline"] or []
            if ("nbtrain.worker" in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and proc.environ().get(SESSION_VARIABLE) == mark):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def assert_no_workers(timeout: float = 5.0) -> None:
    """Fail if a rank of this test run is still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while nbtrain_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = nbtrain_workers()
    assert not left, f"worker processes left behind: {[p.pid for p in left]}"
