"""The run registry: what a kernel's runs look like to the Jupyter server, kept current, stale records ignored."""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers.runhelp import run_cell

from nbtrain.kernel.observers.registry import RunRegistry, read_runs

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


def test_a_run_is_recorded_from_start_to_finish(fresh_pools, tmp_path):
    registry = RunRegistry(str(tmp_path))
    began = time.time()
    _, result = run_cell(fresh_pools, "import nbtrain\nnbtrain.log(total_steps=3)\n"
                                      "for i in range(3):\n    nbtrain.log(loss=1.0 / (i + 1))\n", observers=[registry])
    pids = fresh_pools.pool.pids()
    fresh_pools.shutdown()
    record = json.loads((tmp_path / f"kernel-{os.getpid()}.json").read_text())
    assert record["state"] == "finished" and record["nprocs"] == 2 and record["backend"] == "gloo"
    assert [r["pid"] for r in record["ranks"]] == pids and record["ranks"][0]["device"] == "cpu"
    assert record["step"] == 3 and record["metrics"] == {"loss": pytest.approx(1 / 3)}  # total_steps: no series
    assert record["total_steps"] == 3 and result.history.names == ["loss"] and result.history.total_steps == 3
    # the run's time counts from the cell's start, its ranks' start-up (seconds, on fresh ranks) included
    assert record["started"] - began < 0.5 and record["ended"] - record["started"] >= result.seconds - 0.1, record
    assert oct(os.stat(tmp_path).st_mode & 0o777) == "0o700"
    assert read_runs(str(tmp_path))[0]["run_id"] == record["run_id"]
    registry.remove()
    assert read_runs(str(tmp_path)) == []


def test_records_of_dead_kernels_and_broken_files_are_ignored(tmp_path):
    (tmp_path / "kernel-1.json").write_text("{not json")
    (tmp_path / "kernel-999999.json").write_text(json.dumps({"version": 1, "kernel_pid": 999999999}))
    assert read_runs(str(tmp_path)) == []
