"""%%distributed in a real Jupyter kernel: notebooks through nbclient, the stop button, a dying kernel."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.outputs import cell_text
from helpers.workers import assert_no_workers, nbtrain_workers
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


def test_notebook_names_reach_the_ranks_and_results_come_back():
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        "import torch\nclass Doubler(torch.nn.Module):\n    def forward(self, x):\n        return 2 * x\n"
        "def shift(v):\n    return v + 100\nsquare = lambda v: v * v\nT = torch.arange(6.0)",
        "%%distributed 2 --cpu\nimport nbtrain\nm = Doubler()\nout = shift(square(m(T)))\nnbtrain.log(score=float(out.sum()))\n"
        "print(f'rank {rank} done')",
        "print(type(m).__name__, out.tolist(), history['score'].values)",
        "%%distributed 2 --cpu\nif rank == 1:\n    raise RuntimeError('rank one fails')\n",
        "%%distributed 2 --cpu --out again\nagain = world_size * 21\n",
        "print('again', again)\n%distributed_shutdown",
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    text = [cell_text(c) for c in nb.cells]
    assert "rank 0 done" in text[2] and "[rank 1] rank 1 done" in text[2]
    assert "Doubler [100.0, 104.0, 116.0, 136.0, 164.0, 200.0]" in text[3] and "[820.0]" in text[3]
    assert "rank 1 raised RuntimeError: rank one fails" in text[4] and "Cell line 3" in text[4]
    assert "again 42" in text[6] and "stopped the warm ranks" in text[6]


DATALOADER_CELL = (
    "%%distributed 2 --cpu\n"
    "import torch, itertools\n"
    "from torch.utils.data import DataLoader\n"
    "loader = DataLoader(list(range(1000)), batch_size=10, num_workers=2, persistent_workers=PERSISTENT)\n"
    "for step in itertools.count():\n"
    "    for batch in loader:\n"
    "        if step == 0:\n"
    "            print('training', flush=True); step = 1\n")


def rank_families(at_least: int, timeout: float = 10.0) -> list[psutil.Process]:
    """The ranks and their descendants, once there are ``at_least`` of them: a loader that is not persistent
    starts new workers at each pass over the data, so one instant may fall between two passes."""
    deadline = time.monotonic() + timeout
    while True:
        family = []
        for worker in nbtrain_workers():
            try:
                family += [worker, *worker.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        if len(family) >= at_least or time.monotonic() > deadline:
            assert len(family) >= at_least, family
            return family
        time.sleep(0.02)


def assert_only_the_stop_report(out: str) -> None:
    assert "stopped by the user" in out and "every rank and its child processes were ended" in out, out[-1500:]
    assert "Traceback" not in out and "Exception ignored" not in out and "[rank0]:" not in out, out[-3000:]


def test_stop_button_ends_every_rank_and_its_dataloader_workers_within_3_s_and_quietly():
    kernel = Kernel()
    try:
        kernel.execute("%load_ext nbtrain")
        for attempt, persistent in enumerate([True, False, False]):  # a stray second SIGINT showed 4 stops in 5
            msg_id = kernel.start(DATALOADER_CELL.replace("PERSISTENT", str(persistent)))
            kernel.collect(msg_id, 60, until=lambda out: out.count("training") >= 2)
            family = rank_families(at_least=6)  # 2 ranks with 2 DataLoader workers each
            started = time.monotonic()
            kernel.km.interrupt_kernel()
            if attempt == 2:  # pressed twice: the stop under way goes on (faster), nothing else happens
                time.sleep(0.2)
                kernel.km.interrupt_kernel()
            gone, alive = psutil.wait_procs(family, timeout=3.0)
            elapsed = time.monotonic() - started
            assert not alive, f"{len(alive)} processes still alive {elapsed:.1f} s after the stop button"
            reply, out = kernel.collect(msg_id, 30)
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", (reply, out[-1500:])
            assert "Where each rank was:" in out and "rank 0: at cell line" in out and "rank 1: at cell line" in out
            assert_only_the_stop_report(out)
        reply, out = kernel.execute("%%distributed 2 --cpu --keep-alive 0\nfine = True\nprint('next cell ok')")
        assert reply["status"] == "ok" and "next cell ok" in out
    finally:
        kernel.shutdown()


def test_stop_while_the_ranks_start_says_so_and_nothing_else():
    kernel = Kernel()
    try:
        kernel.execute("%load_ext nbtrain")
        # spawned: ranks forked from the zygote are through their start before a person could press stop
        msg_id = kernel.start("%%distributed 2 --cpu --spawn\nprint('never')\n")
        deadline = time.monotonic() + 30
        while len(nbtrain_workers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the ranks are importing torch now (that takes seconds)
        workers = nbtrain_workers()
        started = time.monotonic()
        kernel.km.interrupt_kernel()
        gone, alive = psutil.wait_procs(workers, timeout=3.0)
        assert not alive, f"ranks still alive {time.monotonic() - started:.1f} s after the stop button"
        reply, out = kernel.collect(msg_id, 30)
        assert reply["ename"] == "KeyboardInterrupt" and "stopped by the user while the ranks were starting" in out
        assert_only_the_stop_report(out)
        assert "never" not in out
    finally:
        kernel.shutdown()


def test_ranks_exit_by_themselves_when_the_kernel_dies():
    kernel = Kernel()
    try:
        kernel.execute("%load_ext nbtrain")
        msg_id = kernel.start("%%distributed 2 --cpu\nimport time\nprint('up', flush=True)\ntime.sleep(600)\n")
        kernel.collect(msg_id, 60, until=lambda out: "[rank 1] up" in out)
        workers = nbtrain_workers()
        assert len(workers) == 2
        os.kill(kernel.pid(), signal.SIGKILL)
        started = time.monotonic()
        gone, alive = psutil.wait_procs(workers, timeout=5)
        assert not alive, f"ranks still alive {time.monotonic() - started:.1f} s after the kernel died"
    finally:
        kernel.shutdown()
    assert_no_workers()


def test_summaries_keep_a_long_error_to_its_first_sentence_and_ignore_deleted_names():
    advice = "XY" * 30  # made at run time, so the cell's source line shown in the traceback does not hold it
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        "%%distributed 2 --cpu\nbuf = [rank] * 3\ntotal = sum(buf)\ndel buf\n",
        "%%distributed 2 --cpu\nraise RuntimeError('CUDA out of memory. Tried to allocate 20.00 GiB. ' + 'XY' * 30)\n",
        "%distributed_shutdown",
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()

    ran = cell_text(nb.cells[1])
    assert "back in the notebook: total" in ran and "buf" not in ran, ran
    failed = cell_text(nb.cells[2])
    summary = "raised RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB. …"  # what failed, and how much
    assert f"rank 0 {summary}" in failed or f"rank 1 {summary}" in failed, failed
    assert failed.count(advice) == 1, f"the full message is shown once, at the end of the traceback:\n{failed}"
