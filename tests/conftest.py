"""Shared fixtures: every test ends with no nbtrain process left behind."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))


def nbtrain_workers() -> list[psutil.Process]:
    """Every live process on this machine running ``nbtrain.worker`` (ours or orphaned)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = proc.info["cmdline"] or []
            if "nbtrain.worker" in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
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
