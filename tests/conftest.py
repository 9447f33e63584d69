"""Shared fixtures: every test ends with no nbtrain process left behind."""

from __future__ import annotations

import os
import sys
import time
import uuid

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))

# Ranks (and kernels started by tests) inherit this, so a check only sees this test run's processes.
SESSION_MARK = os.environ.setdefault("NBTRAIN_TEST_SESSION", uuid.uuid4().hex)


def nbtrain_workers() -> list[psutil.Process]:
    """Every live rank process started by this test run, orphaned or not."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = proc.info["cmdline"] or []
            if ("nbtrain.worker" in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and proc.environ().get("NBTRAIN_TEST_SESSION") == SESSION_MARK):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def assert_no_workers(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while nbtrain_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = nbtrain_workers()
    assert not left, f"worker processes left behind: {[p.pid for p in left]}"


@pytest.fixture
def no_leftover_workers():
    """Use in a test (or autouse in a module) to check that its ranks are all gone afterwards."""
    yield
    assert_no_workers()


@pytest.fixture(scope="module")
def pools():
    """One warm pool of ranks per test module; afterwards, no rank of this test run is left."""
    from nbtrain.launch.run import PoolManager

    manager = PoolManager()
    yield manager
    manager.shutdown()
    assert_no_workers()
