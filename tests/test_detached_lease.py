"""A detached run's GPUs stay leased when its kernel goes: the run's agent takes over the kernel's lease
(``leases.take_over``) and gives it back with the run. Real holder processes and lease files; the GPUs are lease
numbers here (no GPU is touched)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal

import pytest

from nbtrain.gpu import leases
from nbtrain.node.detached import DetachedRecorder
from nbtrain.wire import nodes as N
from tests.test_gpu_leases import start_holder


@pytest.fixture
def lease_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    path = f"/tmp/nbtrain-leases-test-{secrets.token_hex(4)}"
    monkeypatch.setenv("NBTRAIN_LEASE_DIR", path)
    yield leases.lease_dir()
    shutil.rmtree(path, ignore_errors=True)


def _start(run_id: str, gpus: tuple[int, ...]) -> N.StartRanks:
    return N.StartRanks(run_id, "", 1, len(gpus), "nccl", "cuda", 60.0, (), 0, detached_run=run_id, leased_gpus=gpus)


def test_a_detached_runs_agent_keeps_its_gpus_leased_when_the_kernel_goes(lease_directory):
    directory = lease_directory
    kernel = start_holder("0,1", directory)  # the kernel that leased the run's GPUs
    recorder = DetachedRecorder(_start("gpu-run", (0, 1)))  # its agent, here in this process
    try:
        holders = {(held.gpu, held.pid) for held in leases.held(directory)}
        assert holders == {(0, kernel.pid), (1, kernel.pid), (0, os.getpid()), (1, os.getpid())}
        kernel.send_signal(signal.SIGKILL)  # the kernel goes; the run goes on
        kernel.wait()
        assert [(held.gpu, held.notebook) for held in leases.held(directory)] == [(0, "detached run gpu-run"),
                                                                                 (1, "detached run gpu-run")]
        with pytest.raises(leases.LeaseBusy, match="GPU 0"):
            leases.take([0], directory=directory)  # another cell is refused, naming the run
    finally:
        recorder.close()
    assert leases.held(directory) == []  # given back with the run
    assert leases.free_gpus([0, 1], directory) == [0, 1]

