"""RunObserver: how the dashboard (and anything else) follows a run without knowing the run loop.

The run calls these methods from the kernel's main thread, between reading events, so they must return
quickly (queue work for a thread of their own if it is slow). An observer that raises is detached with
a one-line note; the run goes on.

:class:`FanOut` is the one place that hands an event to a run's observers: the run loop notifies
through it, and the ``--max-restarts`` wrapper (:mod:`nbtrain.kernel.lifecycle.restarts`) is one, holding back only the
ending of an attempt. It forwards each event :class:`RunObserver` declares (:data:`EVENTS`, read from the
class), so an event added there reaches every observer through every path.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from enum import Enum

from ...gpu.devices import GpuStatus
from ...gpu.health import describe
from ...wire.payload import reason
from .cost import Metering


class NamedState(str, Enum):
    """A state whose members are their names in records and JSON: printed and formatted as ``"finished"``,
    not ``"RunState.FINISHED"`` (the standard library's StrEnum, for Python 3.10 too)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class RunState(NamedState):
    """A run's state, one set of names for the run, its observers, the run registry and the JupyterLab panel
    (``labextension/src/types.ts``'s ``RunState``; ``tests/test_lab_contract.py`` checks they agree)."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class NodeState(NamedState):
    """What a joined node is doing. The hub is the one writer of a node's own state (:meth:`~nbtrain.kernel.cluster.hub.Hub.
    mark_running`, ``mark_idle``, ``mark_leaving``); ``LOST`` is what observers and the run registry are told of a
    node whose link closed or that went silent too long (:meth:`~nbtrain.kernel.cluster.hub.NodeConn.info`)."""

    IDLE = "idle"
    RUNNING = "running"
    LEAVING = "leaving"  # preempted: its agent was told to leave; no group takes it again
    LOST = "lost"


class GroupState(NamedState):
    """A ``--ft`` replica group's state. :class:`~nbtrain.kernel.lifecycle.ft_run.ReplicaWatch` is its one writer;
    observers hear each change (:meth:`RunObserver.replica_groups`)."""

    IN_QUORUM = "in quorum"  # steps with the others
    OUT = "out"  # lost: its ranks are being ended, or it was not brought back
    RECOVERING = "recovering from a peer"  # new ranks started in its place, yet to commit a step
    REJOINED = "rejoined"  # those new ranks committed a step with the others


def replica_group_name(group: int, ranks) -> str:
    """How messages and the dashboard name a ``--ft`` replica group: by its rank where it has one."""
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"replica group {group} (ranks {ranks[0]}–{ranks[-1]})"


@dataclass(frozen=True)
class ReplicaGroupInfo:
    group: int
    ranks: tuple[int, ...]
    state: GroupState
    since: float  # unix time it entered ``state``
    replaced: int = 0  # times new ranks took its place

    @property
    def name(self) -> str:
        return replica_group_name(self.group, self.ranks)

    def record(self) -> dict:
        """As the run registry lists it."""
        return {"group": self.group, "ranks": list(self.ranks), "state": str(self.state), "since": self.since,
                "replaced": self.replaced}


@dataclass(frozen=True)
class RankInfo:
    rank: int
    pid: int
    device: str | None  # "cuda:0" (as the rank sees it) | "cpu" | None before it is ready
    gpu_index: int | None  # the physical (NVML) index of its GPU


@dataclass(frozen=True)
class NodeGpu:
    """One GPU of a node, as its last heartbeat described it: the node's own reading, decoded and checked
    (:meth:`~nbtrain.gpu.devices.GpuStatus.from_json`; its processes stay on the node), and, from agents that
    send the older form, their health line instead of the structured health."""

    status: GpuStatus
    health_line: str = ""  # an older agent's describe() of its health; "" from newer ones (status.health)

    @property
    def health_text(self) -> str:
        """The health line (clocks, PCIe, NVLink, ECC, Xid), written here from the structured health."""
        return describe(self.status.health) if self.status.health is not None else self.health_line

    def record(self) -> dict:
        """As the run registry lists it (the JupyterLab panel's ``INodeGpu``)."""
        s = self.status
        return {"index": s.index, "utilization": s.utilization, "memory_used": s.memory_used,
                "memory_total": s.memory_total, "health": self.health_text}


@dataclass(frozen=True)
class NodeInfo:
    """A machine of a ``--nodes`` run, as its last heartbeat described it (telemetry None before the first)."""

    name: str  # "a", "b", … in join order
    host: str  # its hostname
    address: str  # the address it joined from
    ranks: tuple[int, ...]
    state: NodeState
    last_heard: float  # unix time
    cpu_percent: float | None
    ram_percent: float | None
    gpus: tuple[NodeGpu, ...]
    cpus: int | None = None  # the machine's cores, as its agent said when it joined

    def record(self) -> dict:
        """As the run registry lists it: plain values, each GPU as :meth:`NodeGpu.record`."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "ranks": list(self.ranks),
                "gpus": [gpu.record() for gpu in self.gpus]}


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    nprocs: int
    backend: str
    device_type: str
    gpu_ids: tuple[int, ...]
    ranks: tuple[RankInfo, ...]
    warm: bool
    nodes: tuple[NodeInfo, ...] = ()  # a --nodes run's machines; () on one machine
    started: float = 0.0  # unix time the cell began, before its ranks started (0: not known)
    metering: Metering | None = None  # the GPUs or cores the run holds, and their price (nbtrain.kernel.observers.cost)
    telemetry_recorded: bool = False  # its load comes as recorded samples (``sampled``): nothing to sample here


class RunObserver:
    _shown_as = ""  # how a message names nbtrain's own observers; "" : by its class (a user's tracker)

    def earlier_runs(self, runs: tuple) -> None:
        """Before the ranks start: this kernel's last runs that logged series (:class:`~.runlog.EarlierRun`, oldest
        first), each labelled with what differed from this run — for a chart to draw beside it."""

    def run_started(self, info: RunInfo) -> None:
        """The job was sent; ``info.ranks`` may update again in :meth:`ranks_ready`."""

    def ranks_ready(self, info: RunInfo) -> None:
        """Every rank has joined the process group and chosen its device."""

    def metrics(self, rank: int, records: list) -> None:
        """``records``: ``(step, unix_time, {name: float})`` logged by ``rank``."""

    def setup(self, rank: int, facts: dict) -> None:
        """What ``nbtrain.prepare()`` set up for one model on ``rank``: AMP, channels_last, compile time
        (a :class:`~nbtrain.wire.protocol.Setup`'s facts)."""

    def nodes_heard(self, nodes: tuple[NodeInfo, ...]) -> None:
        """A ``--nodes`` run's machines, about once a second, with what their heartbeats said (CPU, RAM, GPUs)."""

    def replica_groups(self, groups: tuple[ReplicaGroupInfo, ...]) -> None:
        """A ``--ft`` run's replica groups (:class:`ReplicaGroupInfo`, every one), when the first quorum is taken and
        whenever one changes state: lost, recovering from a peer, rejoined."""

    def sampled(self, snapshot) -> None:
        """A sample of the run's load its agent recorded (a detached run followed through its record: a
        :class:`~nbtrain.gpu.telemetry.Snapshot`); such a run's ``info.telemetry_recorded`` says they come."""

    def cold_start(self, split) -> None:
        """New ranks on this machine reached the cell's first step: where the time went
        (a :class:`~nbtrain.kernel.observers.coldstart.ColdStart`); before :meth:`run_finished`."""

    def run_finished(self, status: RunState, summary: str) -> None:
        """``status``: :attr:`RunState.FINISHED`, ``FAILED`` or ``INTERRUPTED``; ``summary``: one line for people."""


EVENTS = tuple(name for name in vars(RunObserver) if not name.startswith("_"))  # every event a run sends


class FanOut(RunObserver):
    """An observer that passes every event on to ``followers``; one that raises is detached with a one-line
    note (a broken observer must not break the run)."""

    def __init__(self, followers=()) -> None:
        self.followers: list[RunObserver] = list(followers)

    def notify(self, event: str, *args) -> None:
        for follower in list(self.followers):
            try:
                getattr(follower, event)(*args)
            except Exception as exc:
                self.followers.remove(follower)
                name = follower._shown_as or type(follower).__name__
                print(f"nbtrain: {name} stopped following this run ({reason(exc)})", file=sys.stderr)


def _forward(event: str):
    def forward(self: FanOut, *args) -> None:
        self.notify(event, *args)

    forward.__name__ = forward.__qualname__ = event
    return forward


for _event in EVENTS:  # FanOut's methods: each forwards its event (a subclass may still hold one back)
    setattr(FanOut, _event, _forward(_event))
