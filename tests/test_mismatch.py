"""Uneven collectives: a rank that finished the cell while another waits in a collective (2 ranks, gloo)."""

from __future__ import annotations

import time

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError


def test_a_rank_slower_than_the_others_is_left_to_finish(pools):
    ns, result = run_cell(pools, """
        import time
        import torch, torch.distributed as dist
        dist.barrier()
        if rank == 1:
            deadline = time.monotonic() + 3    # computing long after rank 0 finished: not a hang
            while time.monotonic() < deadline:
                torch.ones(64, 64) @ torch.ones(64, 64)
            time.sleep(0.5)
        finished = rank
    """, timeout=20)  # the options of the next test: it reuses these warm ranks
    assert ns["finished"] == 0 and set(result.rank_seconds) == {0, 1}
    assert result.rank_seconds[1] > 3


def test_a_collective_only_one_rank_calls_is_reported_within_seconds(pools, tmp_path):
    # runs on the warm ranks of the test above: the clock measures the diagnosis, not a start
    output = Captured()
    started = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        run_cell(pools, """
            import torch, torch.distributed as dist
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            done = True
        """, write=output, checkpoint=str(tmp_path), max_restarts=2, timeout=20)
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"reported after {elapsed:.1f} s"
    assert str(err.value.failures[0].summary()) == (
        "rank 1 finished the cell; rank 0 waits in all_reduce() at cell line 4 "
        "— every rank must call the same collectives")
    report = str(err.value)
    assert "Cell line 4, in <module>\n    dist.all_reduce(torch.ones(1))" in report
    assert "not restarting: the ranks call different collectives" in output.text()


def test_ranks_waiting_for_each_other_with_one_finished_are_reported(pools):
    with pytest.raises(RankFailedError) as err:
        run_cell(pools, """
            import torch.distributed as dist
            if rank == 1:
                dist.barrier()
                dist.barrier()
            print("rank", rank, "done")
        """, timeout=20)
    assert err.value.failures[0].summary().startswith("rank 0 finished the cell; rank 1 waits in barrier() at cell line 4")


@pytest.mark.slow  # starts node agents
def test_a_ranks_end_that_arrives_while_the_slower_ranks_stacks_are_read_on_nodes_is_kept(nodes, tmp_path):
    """On nodes the kernel reads a slower rank's stack over the network (2 s after the first rank finished) and
    keeps what else arrives meanwhile for its loop. Rank 1 ignores the stack signal, so the read lasts its whole
    wait (1 s), and ends 2.5 s after rank 0: its Done comes in the middle of the read and must not be lost (the cell
    then never ended)."""
    import threading

    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    nodes.start("127.0.0.2")
    nodes.start("127.0.0.3")
    nodes.wait_joined(2)
    cell = ("import signal, time\nif rank == 1:\n    signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
            "    time.sleep(2.5)\nfinished = rank\n")
    request = LaunchRequest(nodes="2", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, start_timeout=120,
                            out="finished")
    ns: dict = {}
    ended: list = []
    thread = threading.Thread(target=lambda: ended.append(run_source(cell, request, ns, manager=nodes.manager,
                                                                     write=Captured())), daemon=True)
    thread.start()
    thread.join(90)
    assert ended and ns["finished"] == 0
