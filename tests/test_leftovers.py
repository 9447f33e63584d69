"""What killed kernels and agents leave behind is swept — only this user's, and one stuck entry stops nothing.

``/dev/shm`` and ``/tmp`` are shared by every user of a machine: a file named like nbtrain's but owned by
someone else (planted, or theirs) must be left alone, and an entry that cannot be removed must not stop the
sweep (before, either made every node agent of the machine die right after joining). A kernel that JupyterLab
shuts down while it holds emulated nodes leaves nothing: its agents, their logs, its run record, its token.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.workers import assert_no_workers

from nbtrain.launch.observers.registry import runs_dir
from nbtrain.wire.shm import sweep_orphans

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _make(path: str, folder: bool = False, owner: int | None = None) -> str:
    if folder:
        os.mkdir(path)
    else:
        open(path, "w").close()
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def _remove(*paths: str) -> None:
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.unlink(path)


@needs_root
def test_the_shared_memory_sweep_skips_other_users_files_and_what_it_cannot_remove():
    dead = _dead_pid()
    mine, foreign, stuck = (f"/dev/shm/nbtrain-{dead}-{name}" for name in ("mine", "foreign", "stuck"))
    _make(mine), _make(foreign, owner=NOBODY), _make(stuck, folder=True)
    try:
        sweep_orphans()  # no error, whatever it met
        assert not os.path.exists(mine)
        assert os.path.exists(foreign) and os.path.exists(stuck)
    finally:
        _remove(mine, foreign, stuck)


@pytest.mark.slow  # a real kernel
@needs_root
def test_load_ext_sweeps_what_dead_agents_and_kernels_left_and_nothing_else():
    dead, tmp = _dead_pid(), tempfile.gettempdir()
    swept = [_make(os.path.join(tmp, f"nbtrain-{kind}-{dead}-x"), folder=True) for kind in ("node", "emulated", "ssh")]
    os.makedirs(runs_dir(), exist_ok=True)
    swept.append(_make(os.path.join(runs_dir(), f"kernel-{dead}.json")))
    kept = [_make(os.path.join(tmp, f"nbtrain-node-{dead}-theirs"), folder=True, owner=NOBODY),
            _make(os.path.join(tmp, f"nbtrain-node-{os.getpid()}-alive"), folder=True)]
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain")
        assert not [path for path in swept if os.path.exists(path)]
        assert all(os.path.exists(path) for path in kept)
    finally:
        kernel.shutdown()
        _remove(*swept, *kept)


def _agents_of(join: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if f"--join {join}" in " ".join(p.info["cmdline"] or ())]


@pytest.mark.slow  # a real kernel
def test_what_a_kernel_shut_down_with_emulated_nodes_leaves_is_gone_after_the_next_load_ext():
    """JupyterLab's shutdown gives a kernel 2.5 s before SIGTERM, which runs no cleanup: the agents leave on
    their own (their link breaks) and the next kernel's ``%load_ext nbtrain`` sweeps the rest."""
    kernel = Kernel()
    out = kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --emulate 2")
    token_file, join = re.search(r"--token-file (\S+)", out).group(1), re.search(r"--join (\S+)", out).group(1)
    deadline = time.monotonic() + 120
    while kernel.run("%distributed_nodes").count("idle") < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    kernel.run("%%distributed --nodes 2 --nproc-per-node 1 --rdzv-host 127.0.0.1 --cpu\nx = 1", timeout=240)
    pid = kernel.pid()
    left = [os.path.join(runs_dir(), f"kernel-{pid}.json"), token_file,
            *glob.glob(os.path.join(tempfile.gettempdir(), f"nbtrain-emulated-{pid}-*"))]
    assert len(left) == 3 and all(os.path.exists(path) for path in left)
    kernel.kc.stop_channels()
    kernel.km.shutdown_kernel(now=False)  # as JupyterLab's "Shut Down Kernel" does
    after = Kernel()
    try:
        after.run("%load_ext nbtrain")
        assert not [path for path in left if os.path.exists(path)]
    finally:
        after.shutdown()
    deadline = time.monotonic() + 15
    while _agents_of(join) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _agents_of(join)
    assert_no_workers(10)
