"""Helpers of the training tests: run a cell on 2 CPU ranks, and check this test run left no rank behind."""

from __future__ import annotations

from conftest import assert_no_workers, nbtrain_workers
from nbtrain.launch.api import run_source
from nbtrain.launch.config import LaunchRequest


# The same leftover check as every other test: ranks of this test run (marked through the environment), orphans too.
own_workers = nbtrain_workers
assert_no_own_workers = assert_no_workers


def run_cell(pools, cell: str, output: list | None = None, **options):
    """Run ``cell`` on 2 CPU ranks with ``pools``; returns (namespace, result). Output goes to ``output``."""
    namespace: dict = {}
    sink = output.append if output is not None else (lambda text: None)
    result = run_source(cell, LaunchRequest(nprocs=2, cpu=True, **options), namespace, manager=pools,
                        write=lambda stream, text: sink(text))
    return namespace, result
