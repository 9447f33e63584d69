"""``--ft``: each replica group's state, kept by the kernel's ReplicaWatch and shown as the dashboard's badges.

The states follow a loss as the kernel sees it: every group in quorum at the first go; the lost group out while
its ranks are ended; recovering from a peer once new ranks start in its place; rejoined when one of them commits
a step (logs ``ft_groups``). The run test in ``test_torchft_cell.py`` checks the same sequence with real ranks.
"""

from __future__ import annotations

import os

from types import SimpleNamespace

import pytest

from nbtrain.kernel.dashboard import text
from nbtrain.kernel.dashboard.devices_view import DevicePanel
from nbtrain.kernel.dashboard.model import RunModel
from nbtrain.kernel.dashboard.replica_badges import badges_html, groups_words
from nbtrain.kernel.dashboard.text_status import status_line
from nbtrain.kernel.observers.events import GroupState, ReplicaGroupInfo
from nbtrain.kernel.observers.registry import RunRegistry, read_runs
from nbtrain.server.kernels import KernelView
from nbtrain.server.runs import describe_runs

pytest.importorskip("torchft")


class _Pool:
    def __init__(self) -> None:
        self.killed: list[int] = []
        self.replaced: list[tuple[int, int]] = []

    def kill_rank(self, rank: int) -> None:
        self.killed.append(rank)

    def replace_rank(self, rank: int, attempt: int) -> None:
        self.replaced.append((rank, attempt))


class _Run:
    """What ReplicaWatch's hooks read of the run's loop."""

    def __init__(self) -> None:
        self.pool, self.done, self.said = _Pool(), {}, []

    def say(self, text: str) -> None:
        self.said.append(text)

    def cell_running(self) -> bool:
        return True


def _watch(nprocs: int, group_size: int):
    from nbtrain.kernel.lifecycle.ft_run import ReplicaWatch

    told: list[tuple[ReplicaGroupInfo, ...]] = []
    spec = SimpleNamespace(ft_group_size=group_size, nodes=None)
    watch = ReplicaWatch(spec, nprocs, lambda event, groups: told.append(groups) if event == "replica_groups" else None)
    return watch, told


def _states(groups) -> list[str]:
    return [str(g.state) for g in groups]


def test_torchft_group_states_follow_a_loss_from_in_quorum_to_rejoined():
    watch, told = _watch(nprocs=3, group_size=1)
    run = _Run()
    try:
        assert watch.arrived(0) == [] and watch.arrived(1) == [] and not told  # nothing before the first go
        assert watch.arrived(2) == [0, 1, 2]
        assert _states(told[-1]) == ["in quorum"] * 3
        assert watch.exited(run, 2, -9)  # lost: out, and (its only rank gone) new ranks start: recovering
        assert [_states(groups)[2] for groups in told[1:]] == ["out", "recovering from a peer"]
        assert run.pool.replaced == [(2, 1)] and told[-1][2].replaced == 1
        watch.logged(2, [(20, 0.0, {"loss": 0.5})])  # a value, but not a committed step: still recovering
        assert _states(told[-1])[2] == "recovering from a peer"
        watch.logged(0, [(21, 0.0, {"ft_groups": 2.0})])  # another group's step says nothing of group 2
        watch.logged(2, [(21, 0.0, {"ft_groups": 3.0})])
        assert _states(told[-1]) == ["in quorum", "in quorum", "rejoined"]
        assert told[-1][2].since >= told[-2][2].since
    finally:
        watch.close()


def test_torchft_group_states_of_a_group_of_two_wait_for_both_ranks_to_end():
    watch, told = _watch(nprocs=4, group_size=2)
    run = _Run()
    try:
        for rank in range(4):
            watch.arrived(rank)
        assert watch.exited(run, 3, -9)
        assert run.pool.killed == [2] and _states(told[-1]) == ["in quorum", "out"]
        assert told[-1][1].ranks == (2, 3)
        assert watch.exited(run, 2, -15)
        assert _states(told[-1]) == ["in quorum", "recovering from a peer"]
        assert run.pool.replaced == [(2, 1), (3, 1)]
    finally:
        watch.close()


def test_torchft_group_states_a_replacement_too_late_is_out():
    watch, told = _watch(nprocs=2, group_size=1)
    run = _Run()
    try:
        watch.arrived(0), watch.arrived(1)
        watch.exited(run, 1, -9)
        assert watch.too_late({0}, run.say)
        assert _states(told[-1]) == ["in quorum", "out"]
    finally:
        watch.close()


def test_torchft_group_states_a_replacement_with_its_job_gets_a_grace_to_rejoin_then_is_stopped():
    """A new rank that has its job (no longer joining) but has not rejoined when the others finish: it may still be
    in the last step with them (the step saying so on its way), so it gets REJOIN_GRACE_S; then it is stopped."""
    from nbtrain.kernel.lifecycle.ft_run import REJOIN_GRACE_S

    watch, told = _watch(nprocs=2, group_size=1)
    run = _Run()
    try:
        watch.arrived(0), watch.arrived(1)
        watch.exited(run, 1, -9)
        assert watch.joined(1)  # Ready: the job goes to it
        assert not watch.too_late({0}, run.say, now=100.0)
        assert not watch.too_late({0}, run.say, now=100.0 + REJOIN_GRACE_S / 2)
        assert watch.too_late({0}, run.say, now=100.0 + REJOIN_GRACE_S)
        assert watch.abandoned == {1} and _states(told[-1]) == ["in quorum", "out"]
        watch2, _ = _watch(nprocs=2, group_size=1)
        try:  # one that rejoined is not waited for: it finishes with the others
            watch2.arrived(0), watch2.arrived(1)
            watch2.exited(run, 1, -9)
            watch2.joined(1)
            watch2.logged(1, [(5, 0.0, {"ft_groups": 2.0})])
            assert not watch2.too_late({0}, run.say, now=100.0 + 10 * REJOIN_GRACE_S)
        finally:
            watch2.close()
    finally:
        watch.close()


GROUPS = (ReplicaGroupInfo(0, (0,), GroupState.IN_QUORUM, 100.0),
          ReplicaGroupInfo(1, (1,), GroupState.REJOINED, 100.0, replaced=1),
          ReplicaGroupInfo(2, (2,), GroupState.RECOVERING, 110.0, replaced=2))


def test_torchft_group_badges_name_each_group_its_state_and_the_last_quorum():
    model = RunModel()
    model.add_metrics(0, [(40, 0.0, {"ft_groups": 2.0, "loss": 0.3})])
    row = badges_html(GROUPS, model.store, now=112.5)
    for words in ("rank 0 · in quorum", "rank 1 · rejoined", "rank 2 · recovering from a peer", "quorum 2 of 3"):
        assert words in row
    assert f"recovering from a peer for {text.duration(2.5)}, replaced 2×" in row  # on hover
    assert badges_html((), model.store) == ""  # without --ft: nothing
    assert "quorum 2 of" not in badges_html(GROUPS, RunModel().store)  # before the first committed step
    grouped = (ReplicaGroupInfo(1, (2, 3), GroupState.OUT, 0.0),)
    assert "replica group 1 (ranks 2–3) · out" in badges_html(grouped, now=1.0)
    assert groups_words(GROUPS) == "groups 2/3 in quorum (rank 2 recovering from a peer)"


def test_torchft_group_badges_reach_the_device_panel_the_status_line_and_the_registry(tmp_path):
    pytest.importorskip("ipywidgets")
    model = RunModel()
    panel = DevicePanel()
    panel.update(model)
    assert "replica groups" not in panel.widget.value
    model.set_replica_groups(GROUPS)
    panel.update(model)
    assert "rank 2 · recovering from a peer" in panel.widget.value  # a change of state redraws the panel
    for widget in (panel.widget, panel.widget.layout, panel.widget.style):  # not at the interpreter's exit
        widget.close()
    assert "groups 2/3 in quorum" in status_line(model)

    registry = RunRegistry(str(tmp_path))
    registry.replica_groups(GROUPS)  # written at once: a change of state
    this_kernel = {"": KernelView("", os.getpid(), "notebook.ipynb", "notebook")}
    (listed,) = describe_runs(this_kernel, read_runs(registry.directory))  # what JupyterLab's panel receives
    assert [(g["ranks"], g["state"], g["replaced"]) for g in listed["replica_groups"]] == [
        ([0], "in quorum", 0), ([1], "rejoined", 1), ([2], "recovering from a peer", 2)]


def test_torchft_group_states_each_groups_first_rank_hears_which_groups_are_out():
    from nbtrain.kernel.lifecycle.ft_run import ReplicaWatch
    from nbtrain.wire import protocol as P

    sent: list[tuple[int, object]] = []
    watch = ReplicaWatch(SimpleNamespace(ft_group_size=2, nodes=None), 4, send_to=lambda r, m: sent.append((r, m)))
    watch.job_part(7)
    run = _Run()
    try:
        for rank in range(4):
            watch.arrived(rank)
        assert sent == []  # every group in quorum: nothing to say
        watch.exited(run, 1, -9)
        assert sent == [(0, P.FtOut(7, (0,))), (2, P.FtOut(7, (0,)))]
        watch.exited(run, 0, -15)  # out, then recovering: still out, said once
        watch.logged(0, [(5, 0.0, {"ft_groups": 2.0})])  # rejoined
        assert sent[2:] == [(0, P.FtOut(7, ())), (2, P.FtOut(7, ()))]
    finally:
        watch.close()


def test_torchft_group_states_the_summary_counts_every_step_a_survivor_committed():
    from nbtrain.kernel.observers.history import History

    watch, _ = _watch(nprocs=3, group_size=1)
    run = _Run()
    history = History()
    try:
        for rank in range(3):
            watch.arrived(rank)
        watch.exited(run, 2, -9)
        history.add(0, [(step, 0.0, {"ft_groups": 3.0 if step < 20 else 2.0}) for step in range(60) if step != 20])
        history.add(1, [(step, 0.0, {"ft_groups": 3.0 if step < 20 else 2.0}) for step in range(60)])
        assert "40 steps of 60 at fewer than 3 groups" in watch.summary(history)  # rank 0 healed step 20 from rank 1
        each_lacks_one = History()  # on a busy machine: rank 0 healed step 20, rank 1 step 33; no series has 60
        for rank, healed in ((0, 20), (1, 33)):
            each_lacks_one.add(rank, [(step, 0.0, {"ft_groups": 3.0 if step < 20 else 2.0})
                                      for step in range(60) if step != healed])
        assert "0 steps redone; 40 steps of 60 at fewer than 3 groups" in watch.summary(each_lacks_one)
    finally:
        watch.close()
