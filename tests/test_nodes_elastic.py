"""Elastic ``--nodes MIN:MAX`` on emulated nodes: node agents on 127.0.0.2, .3, .4 (loopback), 1 rank each, gloo.

First the checks that run before anything starts (MIN ≤ MAX, at least 1, no rank count, ``--last-call`` only
with a range) and the formation rule itself. Then real node agents: ``--nodes 1:2`` with one node joined forms
a group of 1 after the last call; once a second node has joined the next cell re-forms with 2, and the cell
after that reuses those warm ranks. Last, the spot-instance case elastic: two nodes, one vanishes mid-run, and
with ``--max-restarts 1`` the group re-forms with the one that is left and resumes from the checkpoint, its
DistributedSampler now splitting the data over a world of 1. And once through a kernel, on an emulated node:
the world size printed, and a group of one rank asked for ``input()`` as one rank is.
"""

from __future__ import annotations

import pytest
from helpers.nodehelp import Nodes
from helpers.restart_cells import lost_node_cell
from helpers.workers import nbtrain_workers

from nbtrain.kernel.cluster.elastic import Formation
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

pytestmark = pytest.mark.timeout(400)


@pytest.mark.parametrize("nodes, extra, message", [
    ("3:1", {}, r"--nodes 3:1: MIN is more than MAX; give --nodes 1:3"),
    ("0:2", {}, r"--nodes 0:2: at least 1 node is needed"),
    ("1:2:3", {}, r"an elastic range MIN:MAX, such as --nodes 1:4 \(got '1:2:3'\)"),
    ("a:2", {}, r"an elastic range MIN:MAX"),
    ("1:2", {"nprocs": 2}, r"2 ranks asked for, but --nodes 1:2 × --nproc-per-node 1 makes a world size decided"),
    ("2", {"last_call": 5.0}, r"--last-call SECONDS \(0 or more\) goes with an elastic --nodes MIN:MAX"),
    ("1:2", {"last_call": -1.0}, r"--last-call SECONDS \(0 or more\)"),
])
def test_elastic_node_counts_are_checked_before_anything_starts(nodes, extra, message):
    with pytest.raises(ConfigError, match=message):
        resolve(LaunchRequest(nodes=nodes, rdzv_host="127.0.0.1", cpu=True, **extra))


def test_a_bad_range_in_the_magic_is_a_usage_error_before_any_process_or_listener(shell, capsys):
    from IPython.core.error import UsageError

    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match="--nodes 2:1: MIN is more than MAX"):
        shell.run_cell_magic("distributed", "--nodes 2:1 --rdzv-host 127.0.0.1 --cpu", "x = world_size\n")
    assert {p.pid for p in nbtrain_workers()} == before
    shell.run_line_magic("distributed_nodes", "")
    assert "no node has joined" in capsys.readouterr().out  # no hub was made: nothing listens


def test_an_elastic_spec_holds_min_and_max_and_its_last_call_does_not_split_warm_pools():
    spec = resolve(LaunchRequest(nodes="1:3", nproc_per_node=2, rdzv_host="127.0.0.1", cpu=True)).pool
    assert (spec.nodes.min_nodes, spec.nodes.count, spec.nprocs, spec.nodes.last_call_s) == (1, 3, 6, 3.0)
    longer = resolve(LaunchRequest(nodes="1:3", nproc_per_node=2, rdzv_host="127.0.0.1", cpu=True, last_call=9)).pool
    assert longer.nodes.last_call_s == 9.0 and longer == spec
    fixed = resolve(LaunchRequest(nodes="2:2", rdzv_host="127.0.0.1", cpu=True)).pool
    assert (fixed.nodes.min_nodes, fixed.nodes.count) == (0, 2)  # MIN = MAX is the fixed size


def test_formation_waits_for_min_then_the_last_call_and_never_exceeds_max():
    formation = Formation(2, 4, last_call_s=3.0)
    assert formation.size(1, now=0.0) == 0  # below MIN
    assert formation.size(2, now=1.0) == 0  # MIN there: the last call opens
    assert formation.size(3, now=3.5) == 0
    assert formation.size(3, now=4.0) == 3  # closed: as many as joined
    assert Formation(2, 4, 3.0).size(6, now=0.0) == 4  # MAX at once, no waiting
    dropped = Formation(2, 4, 3.0)
    dropped.size(2, now=0.0)
    dropped.size(1, now=1.0)  # one left again: the last call starts over once MIN are back
    assert dropped.size(2, now=3.5) == 0 and dropped.size(2, now=6.5) == 2


# ------------------------------------------------------------------------------------- real nodes
def _run(nodes: Nodes, cell: str, **options):
    ns: dict = {}
    request = LaunchRequest(nodes="1:2", rdzv_host="127.0.0.1", cpu=True, start_timeout=120, last_call=1.0, **options)
    result = run_source(cell, request, ns, manager=nodes.manager, write=lambda stream, text: None)
    return result, ns


def test_one_to_two_forms_with_the_nodes_there_and_regrows_when_a_second_joins(nodes, capsys):
    nodes.start("127.0.0.2")
    nodes.wait_joined(1)
    result, ns = _run(nodes, "ws = world_size\n")
    assert ns["ws"] == 1 and len(result.devices) == 1 and not result.warm
    assert "the group forms with 1 node of 1–2 (a): world size 1 (1 node × 1 rank)" in capsys.readouterr().out

    nodes.start("127.0.0.3")  # a second machine joins: the next cell's group has both
    nodes.wait_joined(2)
    result, ns = _run(nodes, "ws = world_size\n")
    assert ns["ws"] == 2 and len(result.devices) == 2 and not result.warm
    assert "the group forms with 2 nodes of 1–2 (a, b): world size 2" in capsys.readouterr().out

    nodes.start("127.0.0.4")  # a third: the group is at MAX already, so it stays as it is and c waits, idle
    nodes.wait_joined(3)
    result, ns = _run(nodes, "ws = world_size\n")  # the same nodes stay: warm
    assert ns["ws"] == 2 and result.warm
    assert [n.name for n in nodes.hub.idle_nodes()] == ["c"]
    _assert_quiet(nodes.consoles())


def test_a_lost_node_re_forms_a_smaller_group_that_resumes_from_the_checkpoint(nodes, tmp_path, capsys):
    nodes.start("127.0.0.2")
    nodes.start("127.0.0.3")
    nodes.wait_joined(2)
    cell = lost_node_cell(tmp_path / "lost-once")
    result, ns = _run(nodes, cell, checkpoint=str(tmp_path / "ckpt"), max_restarts=1,
                      out="steps,world,restart_count,batches")
    out = capsys.readouterr().out
    assert "the group forms with 2 nodes of 1–2" in out and "lost:" in out, out
    assert "the group forms with 1 node of 1–2" in out and "world size 1" in out, out
    assert ns["world"] == 1 and ns["restart_count"] == 1
    # epoch 0 on 2 ranks (16 samples / 2 / batch 4 = 2 steps), epochs 1–2 on 1 rank (4 steps each)
    assert ns["batches"] == [4, 4] and ns["steps"] == 2 + 4 + 4
    assert result.history.series("loss", rank=0).steps == list(range(10))  # the whole curve
    _assert_quiet(nodes.consoles())


def _assert_quiet(consoles: dict[str, str]) -> None:
    """Re-forming and losing a node are events of an elastic run: a line each on the agents' terminals, no stack
    traces (those go to the agent's log file)."""
    for console in consoles.values():
        lines = console.splitlines()
        assert "frame #" not in console and "Traceback" not in console and "Exception raised" not in console, console
        assert len(lines) <= 8 and all(len(line) < 300 for line in lines), console


@pytest.mark.slow
def test_in_a_notebook_a_group_of_one_says_its_world_size_and_asks_without_rank_labels():
    """Through a kernel: an emulated node, ``--nodes 1:2``; the group's size is printed and ``input()`` on its one
    rank is asked as on one rank (no ``[rank 0]``: the run counts the ranks that formed, not MAX)."""
    from helpers.kernelhelp import Kernel

    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --emulate 1")
        reply, out, prompts = kernel.execute_answering(
            "%%distributed --nodes 1:2 --rdzv-host 127.0.0.1 --cpu --last-call 0.5 --start-timeout 120\n"
            "answer = input('your name? ')\nprint('got', answer, 'of', world_size)\n", ["Ada"], timeout=120)
        assert reply["status"] == "ok", out
        assert "the group forms with 1 node of 1–2 (a): world size 1 (1 node × 1 rank)" in out, out
        assert prompts == ["your name? "] and "got Ada of 1" in out, (prompts, out)
    finally:
        kernel.shutdown()
