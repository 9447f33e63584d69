"""Helpers of the training tests: run a cell on 2 CPU ranks, and check this test process left no rank behind.

:func:`assert_no_own_workers` looks only at this process's children, so other test runs on the same
machine (with their own warm ranks) do not make it fail; conftest's ``no_leftover_workers`` looks at
every rank on the machine.
"""

from __future__ import annotations

import os
import time

import psutil

from nbtrain.launch.api import run_source
from nbtrain.launch.config import LaunchRequest


def own_workers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "nbtrain.worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            pass
    return found


def assert_no_own_workers(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while own_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = own_workers()
    assert not left, f"worker processes left behind: {[p.pid for p in left]}"


def run_cell(pools, cell: str, output: list | None = None, **options):
    """Run ``cell`` on 2 CPU ranks with ``pools``; returns (namespace, result). Output goes to ``output``."""
    namespace: dict = {}
    sink = output.append if output is not None else (lambda text: None)
    result = run_source(cell, LaunchRequest(nprocs=2, cpu=True, **options), namespace, manager=pools,
                        write=lambda stream, text: sink(text))
    return namespace, result
