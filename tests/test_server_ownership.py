"""Which run records and processes the server attributes to its kernels, on real process trees."""

from __future__ import annotations

import os
import subprocess

import pytest

from nbtrain.server.kernels import KernelView, owning_kernel
from nbtrain.server.runs import StopRefused, owned_runs, resolve_stop


@pytest.fixture
def child():
    """A process under this one, standing in for a rank (or a kernel behind a forking wrapper)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _kernels(pid):
    return {"k1": KernelView("k1", pid, "a/train.ipynb", "train.ipynb")}


def test_processes_belong_to_the_kernel_they_descend_from(child):
    kernels = {os.getpid(): _kernels(os.getpid())["k1"]}
    assert owning_kernel(os.getpid(), kernels).kernel_id == "k1"
    assert owning_kernel(child.pid, kernels).kernel_id == "k1"
    assert owning_kernel(os.getppid(), kernels) is None  # an ancestor is not part of the kernel
    for not_a_pid in (None, "12", True, 0, -1, 2**22 + 12345):
        assert owning_kernel(not_a_pid, kernels) is None


def test_a_record_counts_only_when_written_by_the_kernel_or_a_process_under_it(child):
    kernels = _kernels(os.getpid())
    mine = {"kernel_id": "k1", "kernel_pid": os.getpid(), "state": "running"}
    wrapped = {"kernel_id": "k1", "kernel_pid": child.pid, "state": "running"}
    forged = {"kernel_id": "k1", "kernel_pid": os.getppid(), "state": "running"}
    unknown = {"kernel_id": "k2", "kernel_pid": os.getpid(), "state": "running"}
    assert [r.record for r in owned_runs(kernels, [mine, wrapped, forged, unknown])] == [mine, wrapped]
    # A kernel the server knows by id only (remote provisioner): the id decides.
    assert [r.record for r in owned_runs(_kernels(None), [forged])] == [forged]


def test_stop_names_an_active_run_or_is_refused_with_the_reason(child):
    kernels = _kernels(os.getpid())
    running = {"kernel_id": "k1", "kernel_pid": os.getpid(), "state": "running"}
    assert resolve_stop(kernels, [running], pid=child.pid).kernel.kernel_id == "k1"
    assert resolve_stop(kernels, [running], kernel_id="k1").record is running
    with pytest.raises(StopRefused) as refused:
        resolve_stop(kernels, [dict(running, state="finished")], kernel_id="k1")
    assert refused.value.status == 409 and "a/train.ipynb" in refused.value.message
    with pytest.raises(StopRefused) as refused:
        resolve_stop(kernels, [running], pid=os.getppid())
    assert refused.value.status == 404 and str(os.getppid()) in refused.value.message
