"""Attacks through a pool's c10d store, performed by a network peer: another process that reaches its port.

The store has no authentication (as under torchrun): whoever reaches it may write any key. What a run takes
from it must therefore be nothing more than torch's own process-group bootstrap needs:

* values planted for the keys a preemption's agreement once read (``x``, or a step) neither fail nor freeze a
  ``--checkpoint`` cell of a warm pool: the ranks agree on the step over their authenticated channels;
* a flood of large values grows a process of the store's own, up to its memory limit, never the notebook's
  kernel: the notebook's variables survive and its next cells run (through a real kernel);
* a store process that ended (a flood it could not survive) is not reused: the next cell starts fresh ranks.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import torch
from helpers.kernelhelp import nbtrain_kernel
from helpers.preempt_cells import training_cell
from helpers.runhelp import run_cell
from helpers.storepeer import STORE_PORT, plant

from nbtrain.rank.store_server import MEMORY_BUDGET

pytestmark = pytest.mark.timeout(240)

PREEMPT_KEYS = ("default_pg/0//nbtrain/preempt/{job}", "nbtrain/preempt/{job}")


def _planted(value: str) -> list[tuple[str, str]]:
    """``value`` under the preemption keys of jobs 1–20: every cell a warm pool runs for a while."""
    return [(key.format(job=job), value) for job in range(1, 21) for key in PREEMPT_KEYS]


def test_values_planted_in_the_store_neither_fail_nor_freeze_a_checkpoint_cell(fresh_pools, tmp_path):
    port = run_cell(fresh_pools, STORE_PORT, out="port")[0]["port"]  # a warm pool, its store listening
    cell = training_cell(tmp_path / "marks", epochs=2, samples=32, step_s=0.01)  # 4 steps an epoch per rank
    for value in ("x", "4"):  # a ValueError in every rank; both ranks saving at step 4 and waiting for ever
        assert plant(port, _planted(value)) == {"accepted": 2 * 20, "error": None}
        ckpt = tmp_path / f"ckpt-{value}"
        ns, result = run_cell(fresh_pools, cell, checkpoint=str(ckpt), out="steps")
        assert ns["steps"] == 8 and result.history.series("loss", rank=0).steps == list(range(8))
        saved = torch.load(ckpt / "checkpoint.pt", map_location="cpu", weights_only=False)
        assert saved["step"] == 8  # the last epoch's own checkpoint, not one at the planted step


@pytest.mark.slow  # a real kernel
def test_a_flood_of_writes_to_the_store_grows_neither_the_kernel_nor_touches_the_notebook():
    flood, size = 100, 8 * 2**20  # 800 MB offered
    with nbtrain_kernel() as kernel:
        kernel.run("kept = list(range(1000))")
        kernel.run("%%distributed 2 --cpu --out port\n" + STORE_PORT)
        port = int(kernel.run("print(port)"))
        before = psutil.Process(kernel.pid()).memory_info().rss
        took = plant(port, [("flood/{n}", size)], repeat=flood)
        grown = psutil.Process(kernel.pid()).memory_info().rss - before
        assert grown < 64 * 2**20, (grown >> 20, took)  # the kernel holds no value written to the store
        assert took["accepted"] * size <= MEMORY_BUDGET and took["error"], took  # the store's process took its budget
        assert kernel.run("print(len(kept))").strip() == "1000"
        out = kernel.run("%%distributed 2 --cpu\nimport torch, torch.distributed as dist\n"
                         "t = torch.ones(1); dist.all_reduce(t); print('sum', int(t))\n")
    assert "sum 2" in out, out


def test_warm_ranks_whose_store_ended_are_not_reused(fresh_pools):
    port = run_cell(fresh_pools, STORE_PORT, out="port")[0]["port"]
    old = fresh_pools.pool.pids()
    host = [c.pid for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert host and host[0] != os.getpid(), host  # the store is another process's
    hosting = psutil.Process(host[0])  # before the kill: its parent may reap it before a lookup after
    os.kill(host[0], signal.SIGKILL)
    psutil.wait_procs([hosting], timeout=5)
    ns, result = run_cell(fresh_pools, STORE_PORT, out="port")
    assert not result.warm and fresh_pools.pool.pids() != old and ns["port"] != port
