"""The spot-instance case on emulated nodes: a node disappears mid-training, another joins, the run resumes.

Two node agents (127.0.0.2, 127.0.0.3) × 1 rank on gloo, ``--checkpoint`` and ``--max-restarts 1``: the rank on
the second node kills its own agent (as a preempted machine vanishes) after the first epoch's checkpoint. The
kernel reports the node lost, restarts; a replacement node joins with the same printed command; the group
re-forms (a new pool, each node told its place) and the cell resumes from the checkpoint — the curve whole —
and the observers hear the nodes of each attempt as they go. When no replacement comes, the restart says at
once what it waits for and ends after ``--start-timeout`` saying that no node joined.
"""

from __future__ import annotations

import re
import time

import pytest
from helpers.restart_cells import lost_node_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.observers.events import RunObserver
from nbtrain.kernel.request.config import LaunchRequest

pytestmark = pytest.mark.timeout(400)


class NodesHeard(RunObserver):
    """What the run told its observers of its nodes, and when: each call's (time, {name: state})."""

    def __init__(self) -> None:
        self.heard: list[tuple[float, dict[str, str]]] = []

    def nodes_heard(self, nodes) -> None:
        self.heard.append((time.monotonic(), {node.name: node.state for node in nodes}))


def test_a_lost_node_is_replaced_and_the_run_resumes_from_the_checkpoint(nodes, tmp_path, capsys):
    nodes.start("127.0.0.2")
    nodes.start("127.0.0.3")
    out: list[str] = []
    restarted: list[float] = []

    def write(stream: str, text: str) -> None:
        out.append(text)
        if "restarting the ranks" in text:
            restarted.append(time.monotonic())
            nodes.start("127.0.0.3")  # the replacement machine joins with the same command

    ns: dict = {}
    cell = lost_node_cell(tmp_path / "lost-once")
    request = LaunchRequest(nodes="2", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, start_timeout=120,
                            checkpoint=str(tmp_path / "ckpt"), max_restarts=1, out="steps,restart_count")
    observer = NodesHeard()
    result = run_source(cell, request, ns, manager=nodes.manager, write=write, observers=[observer])
    text = capsys.readouterr().out + "".join(out)  # the pool says at once that a node is lost (print)
    lost = re.search(r"node ([ab]) \(rank 1\) lost: (its connection broke|no heartbeat for 5 s)", text)
    assert lost, text
    assert text.count(f"node {lost.group(1)} (rank 1) lost") == 1, text  # said once, not again on restarting
    assert "restarting the ranks from" in text and "(restart 1 of 1)" in text, text
    assert ns["steps"] == 6 and ns["restart_count"] == 1  # 3 epochs × 2 steps, as if nothing had happened
    assert result.history.series("loss", rank=0).steps == list(range(6))  # the whole curve
    before = [seen for at, seen in observer.heard if at <= restarted[0]]
    assert before and before[-1][lost.group(1)] == "lost", before  # shown lost as soon as it is
    after = [seen for at, seen in observer.heard if at > restarted[0]]
    assert after, observer.heard  # the restarted attempt's nodes reach the observers (dashboard, registry)
    assert lost.group(1) not in after[-1] and "c" in after[-1], after  # the replacement, not the lost node


def test_a_restart_without_a_replacement_node_says_what_it_waits_for_and_why_it_ends(nodes, tmp_path):
    join = nodes.hub.join_command()
    nodes.start("127.0.0.2")
    nodes.start("127.0.0.3")
    said: list[tuple[float, str]] = []
    request = LaunchRequest(nodes="2", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, start_timeout=40,
                            checkpoint=str(tmp_path / "ckpt"), max_restarts=1)
    with pytest.raises(RankFailedError) as failed:
        run_source(lost_node_cell(tmp_path / "lost-once"), request, {}, manager=nodes.manager,
                   write=lambda stream, text: said.append((time.monotonic(), text)))
    text = "".join(t for _, t in said)
    restarted = next(at for at, t in said if "(restart 1 of 1)" in t)
    waiting = next((at, t) for at, t in said if "waiting for a node to replace the lost one" in t)
    assert waiting[0] - restarted < 5, text  # said at once, not after --start-timeout
    assert re.search(r"1 of 2 nodes joined \([ab] from 127\.0\.0\.[23]\)", waiting[1]), text
    assert join in waiting[1] and re.search(r"The restart waits (39|40) s for it", waiting[1]), text
    report = str(failed.value)
    assert report.startswith("no replacement node joined within 40 s; 1 of 2 nodes joined"), report
    assert "raised" not in report and "stopped" not in report, report  # no rank raised; none had started
    assert "raised TimeoutError" not in text, text
