"""The rank processes this test run started, found through the mark they inherit from the test process.

conftest sets ``NBTRAIN_TEST_SESSION`` before any rank starts; ranks (and the kernels tests start, and
their ranks) inherit it, so a check sees only this run's processes, orphans included, and not those of
another test run on the same machine.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil

SESSION_VARIABLE = "NBTRAIN_TEST_SESSION"
FORKED_RANK_NAME = "nbtrain-rank"  # a rank forked by the zygote keeps the zygote's command line, not its name


def nbtrain_workers() -> list[psutil.Process]:
    """Every live rank process started by this test run, orphaned or not."""
    mark = os.environ.get(SESSION_VARIABLE)
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "name"]):
        try:
            cmd = proc.info["cmdline"] or []
            rank = "nbtrain.rank" in cmd or proc.info["name"] == FORKED_RANK_NAME  # spawned, or forked by a zygote
            if (rank and proc.info["status"] != psutil.STATUS_ZOMBIE
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


def parent_code(child_code: str, seconds: float = 60) -> str:
    """Python code that starts a child running ``child_code``, prints the child's pid, then sleeps ``seconds``."""
    return (f"import subprocess, sys, time\nchild = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
            f"print(child.pid, flush=True)\ntime.sleep({seconds})\n")


@contextlib.contextmanager
def parent_and_child(child_code: str, seconds: float = 60) -> Iterator[tuple[int, int]]:
    """A real process that starts a child running ``child_code`` and then sleeps (as a rank with a DataLoader
    worker); yields ``(parent pid, child pid)``, and kills both on leaving."""
    parent = subprocess.Popen([sys.executable, "-c", parent_code(child_code, seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        yield parent.pid, child
    finally:
        for process in psutil.Process(parent.pid).children() + [psutil.Process(parent.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        parent.wait(5)
