"""What a run needs from the ranks it drives, wherever they come from: the :class:`RankGroup` protocol.

Two implementations stand side by side, neither inheriting the other's parts:

* :class:`~nbtrain.kernel.ranks.pool.LocalPool` — ranks on this machine: a process group (torch elastic's
  ``PContext``), an authenticated UNIX-socket channel, a store on loopback;
* :class:`~nbtrain.kernel.cluster.group.NodePool` — ranks on joined nodes, each under torch elastic's agent, reached
  through the nodes' authenticated links.

:mod:`nbtrain.kernel.lifecycle.run` and :class:`~nbtrain.kernel.lifecycle.pools.PoolManager` know only this protocol.
:class:`GroupState` is the state both keep alike, written only through its methods: its :class:`GroupPhase`
(forming → ready → broken, broken final: a failure or a stop, never reused), each rank's device once it is
ready, the user's modules its ranks imported, and the job ids.
"""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...wire import protocol as P
from ..diagnostics.failures import RankFailure
from .spec import PoolSpec
from .zygote_handle import ZygoteHandle

_group_ids = itertools.count(1)


class GroupPhase(enum.Enum):
    """A rank group's life, written only by :meth:`GroupState._enter` (as torch elastic's ``WorkerState``)."""

    FORMING = "forming"  # started; not every rank has joined the process group yet
    READY = "ready"  # every rank joined: the group can run cells, and stays warm between them
    BROKEN = "broken"  # a rank failed or a run was stopped: final, the group is never reused


_NEXT = {GroupPhase.FORMING: {GroupPhase.READY, GroupPhase.BROKEN}, GroupPhase.READY: {GroupPhase.BROKEN},
         GroupPhase.BROKEN: set()}


class IllegalGroupChange(RuntimeError):
    """A change of a group's phase that its life does not have (a bug in nbtrain, never the user's)."""


class GroupState:
    """The state every rank group keeps, and the only code that writes it."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec  # what the cell asked for; never replaced
        self._world_size = spec.nprocs  # an elastic group decides it when it forms (:meth:`formed`)
        self.pool_id = next(_group_ids)
        self.run_id = f"nbtrain-{os.getpid()}-{self.pool_id}"
        self._devices: dict[int, str] = {}
        self._phase = GroupPhase.FORMING
        self._job_ids = itertools.count(1)
        self._module_stamps: dict[str, tuple] = {}  # path -> stamp of the user's modules the ranks imported
        self._rank_path: tuple[str, ...] = ()  # the ranks' own sys.path (see nbtrain.kernel.request.notebook_modules)

    @property
    def world_size(self) -> int:
        """The ranks of this group: the spec's, or the size an elastic group formed with."""
        return self._world_size

    def formed(self, world_size: int) -> None:
        """An elastic group formed with ``world_size`` ranks (from ``spec.nodes.min_nodes`` to ``spec.nodes.count`` nodes)."""
        self._world_size = world_size
        if self.ready:
            self._enter(GroupPhase.READY)

    @property
    def phase(self) -> GroupPhase:
        return self._phase

    def _enter(self, phase: GroupPhase) -> None:
        """The one place the phase changes. BROKEN is final: a rank's late Ready does not make a broken group ready."""
        if phase is self._phase or self._phase is GroupPhase.BROKEN:
            return
        if phase not in _NEXT[self._phase]:
            raise IllegalGroupChange(f"a rank group cannot go from {self._phase.name} to {phase.name}")
        self._phase = phase

    def next_job_id(self) -> int:
        return next(self._job_ids)

    @property
    def ready(self) -> bool:
        """Every rank has joined the process group (a fact that stays true once the group breaks: see :attr:`phase`)."""
        return len(self._devices) == self.world_size

    @property
    def devices(self) -> dict[int, str]:
        """rank -> device of the ranks that are ready."""
        return dict(sorted(self._devices.items()))

    def mark_ready(self, rank: int, device: str) -> bool:
        """Rank ``rank`` joined the process group on ``device``; returns whether every rank now has."""
        self._devices[rank] = device
        if self.ready:
            self._enter(GroupPhase.READY)
        return self.ready

    def not_ready(self) -> list[int]:
        return [rank for rank in range(self.world_size) if rank not in self._devices]

    @property
    def broken(self) -> bool:
        return self._phase is GroupPhase.BROKEN

    def mark_broken(self) -> None:
        """A rank failed or the run was stopped: this group is never reused."""
        self._enter(GroupPhase.BROKEN)

    @property
    def module_stamps(self) -> dict[str, tuple]:
        return dict(self._module_stamps)

    @property
    def rank_path(self) -> tuple[str, ...]:
        return self._rank_path

    def record_modules(self, stamps, rank_path: tuple[str, ...]) -> None:
        """What a finished job's ranks said they imported (``(name, path, …)`` stamps) and their sys.path."""
        self._module_stamps.update((stamp[1], stamp) for stamp in stamps)
        self._rank_path = tuple(rank_path)

    def stopped_elsewhere(self) -> str:
        """Why this kernel's stop button does not reach the ranks ("": it does — the ranks are this kernel's)."""
        return ""

    def ran_before(self) -> float:
        """Seconds the ranks had been running the cell before this kernel took them up (0: it started them)."""
        return 0.0


class RankGroup(Protocol):
    """The ranks of one pool, as a run drives them (see the module docstring)."""

    spec: PoolSpec
    pool_id: int
    run_id: str

    # lifecycle
    def spawn(self, zygote: ZygoteHandle | None = None, fork_ranks: bool = True) -> None: ...
    def spawn_reason(self) -> str: ...  # why ranks the zygote was asked to fork were spawned instead ("": none)
    def serves(self, spec: PoolSpec) -> bool: ...
    def alive(self) -> bool: ...
    def interrupt(self) -> None: ...
    def stopped_elsewhere(self) -> str: ...  # why this kernel's stop does not stop the ranks ("": it does)
    def ran_before(self) -> float: ...  # seconds the ranks ran the cell before this kernel took them up
    def teardown(self, graceful: bool = True, grace: float = 1.0, drain: Callable[[], None] | None = None) -> None: ...

    # state (GroupState)
    @property
    def world_size(self) -> int: ...  # the ranks it runs: spec.nprocs, or what an elastic group formed with
    def next_job_id(self) -> int: ...
    @property
    def phase(self) -> GroupPhase: ...
    @property
    def ready(self) -> bool: ...
    @property
    def devices(self) -> dict[int, str]: ...
    def mark_ready(self, rank: int, device: str) -> bool: ...
    def not_ready(self) -> list[int]: ...
    @property
    def broken(self) -> bool: ...
    def mark_broken(self) -> None: ...
    @property
    def module_stamps(self) -> dict[str, tuple]: ...
    @property
    def rank_path(self) -> tuple[str, ...]: ...
    def record_modules(self, stamps, rank_path: tuple[str, ...]) -> None: ...

    # messages and events
    def connected(self) -> bool: ...
    def send_all(self, message) -> None: ...
    def send_to(self, rank: int, message) -> None: ...
    def output_open(self) -> bool: ...
    def poll_events(self, timeout: float) -> list: ...

    # describing the ranks
    def pids(self) -> list[int]: ...
    def rank_label(self, rank: int) -> str: ...
    def node_infos(self) -> tuple: ...
    def start_hint(self) -> str: ...
    def nodes_joined(self) -> str: ...
    def failure(self, rank: int, cause: P.RemoteError | int, output_tail=(),
                diagnosis: str | None = None) -> RankFailure: ...
    def dump_stacks(self, wait: float = 0.5, ranks=None) -> dict[int, str]: ...
    def local_start(self) -> LocalStart | None: ...  # ranks started on this machine (one clock), else None

    # nodes (a group of ranks on this machine has none: the run names no node to release)
    def release_node(self, name: str, account: str) -> list: ...

    # --ft (ranks on this machine only: the request refuses it elsewhere)
    def replace_rank(self, rank: int, attempt: int) -> int: ...
    def kill_rank(self, rank: int) -> None: ...


@dataclass(frozen=True)
class LocalStart:
    """When ranks on this machine were started, for the cold start's split: ``started_at`` (unix time) and, for
    each forked rank, the seconds the zygote spent importing for it."""

    started_at: float
    forked: dict[int, float]
