"""The spot-instance case on emulated nodes: a node disappears mid-training, another joins, the run resumes.

Two node agents (127.0.0.2, 127.0.0.3) × 1 rank on gloo, ``--checkpoint`` and ``--max-restarts 1``: the rank on
the second node kills its own agent (as a preempted machine vanishes) after the first epoch's checkpoint. The
kernel reports the node lost, restarts; a replacement node joins with the same printed command; the group
re-forms through torch elastic's c10d rendezvous and the cell resumes from the checkpoint — the curve whole.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers.restart_cells import lost_node_cell
from helpers.workers import assert_no_workers
from nbtrain.cluster import Cluster
from nbtrain.launch.api import run_source
from nbtrain.launch.config import LaunchRequest
from nbtrain.launch.run import PoolManager

pytestmark = pytest.mark.timeout(400)


def test_a_lost_node_is_replaced_and_the_run_resumes_from_the_checkpoint(tmp_path):
    cluster, manager = Cluster(), None
    nodes: list[subprocess.Popen] = []
    try:
        hub = cluster.hub("127.0.0.1")
        join = hub.join_command().split()[1:]

        def start_node(address: str) -> None:
            nodes.append(subprocess.Popen([sys.executable, *join, "--address", address],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        start_node("127.0.0.2")
        start_node("127.0.0.3")
        out: list[str] = []

        def write(stream: str, text: str) -> None:
            out.append(text)
            if "restarting the ranks" in text:
                start_node("127.0.0.3")  # the replacement machine joins with the same command

        manager = PoolManager(cluster.make_pool)
        ns: dict = {}
        cell = lost_node_cell(tmp_path / "lost-once")
        request = LaunchRequest(nodes="2", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, start_timeout=120,
                                checkpoint=str(tmp_path / "ckpt"), max_restarts=1, out="steps,restart_count")
        result = run_source(cell, request, ns, manager=manager, write=write)
        text = "".join(out)
        assert re.search(r"node [ab] \(rank 1\) lost: (its connection broke|no heartbeat for 5 s)", text), text
        assert "restarting the ranks from" in text and "(restart 1 of 1)" in text, text
        assert ns["steps"] == 6 and ns["restart_count"] == 1  # 3 epochs × 2 steps, as if nothing had happened
        assert result.history.series("loss", rank=0).steps == list(range(6))  # the whole curve
    finally:
        if manager is not None:
            manager.shutdown()
        cluster.close()
        for node in nodes:
            try:
                node.wait(10)
            except subprocess.TimeoutExpired:
                node.kill()
    assert_no_workers(10)
