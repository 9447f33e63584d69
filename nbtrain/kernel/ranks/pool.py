"""LocalPool: N ranks, the store they meet at, and the channel to each — kept warm between cells.

The pool is a small composition, split along torch elastic's lines:

* the **process group** (:mod:`.procs`, torch elastic's ``PContext``): starts the rank processes,
  polls their output pipes and exits, signals them (one SIGINT for the stop button; SIGTERM → SIGKILL
  to end them) and reads torch elastic's error files;
* the **channel** (:mod:`.channel`): the authenticated UNIX socket each rank connects to, and the
  messages on it (:mod:`.protocol`);
* the **rendezvous store**: a c10d ``TCPStore`` on 127.0.0.1, port chosen by the OS — never a fixed 29500 that
  another notebook may hold — hosted by a process of its own with a memory limit, not by the kernel
  (:mod:`.storehost`: a flood of writes must not grow the notebook's kernel). The ranks join it as torchrun's
  ranks join the agent's store (``TORCHELASTIC_USE_AGENT_STORE=True``, ``init_method="env://"``);
* and the pool's own state (:class:`~.rankgroup.GroupState`, written only through its methods): each rank's
  device once it is ready, whether the pool is broken (a failure, a stop — never reused), the user's modules
  the ranks imported.

It is one :class:`~.rankgroup.RankGroup`; its sibling for several machines, :class:`~nbtrain.kernel.cluster.group.NodePool`,
runs the ranks under torch elastic's agent on joined nodes. The run (:mod:`nbtrain.kernel.lifecycle.run`) drives either.

Both halves share a private directory (mode 0700): the channel's socket, the ranks' error files and
their stack dumps (:mod:`nbtrain.kernel.diagnostics.stacks`).

Events: :meth:`LocalPool.poll_events` waits on every socket and pipe at once and returns what arrived:
:class:`~.rank_events.Message`, :class:`~.rank_events.Output` and :class:`~.rank_events.Exited` (:data:`~.rank_events.RankEvent`). The run decides what
they mean; :meth:`LocalPool.failure` is the one place a rank's error or exit becomes a
:class:`~nbtrain.kernel.diagnostics.failures.RankFailure`.

Teardown (:meth:`LocalPool.teardown`, the only way a pool ends): a polite Shutdown (barrier, destroy the
group) when the pool is healthy and the caller is not in a hurry; then SIGTERM → SIGKILL to everything
left; then what the ranks still had in their pipes (the caller's ``drain``); then the pipes, the socket,
the store's process and the directory go.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from ...wire import protocol as P
from ...wire.restart_policy import FT_ATTEMPT_ENV
from ..diagnostics.failures import RankFailure, rank_failure
from ..diagnostics.stacks import request_stacks
from .spec import PoolSpec
from .channel import Channel
from .rank_events import Exited, Message, Output, RankEvent
from .procs import RankProcesses, stack_file_path, worker_env
from .rankgroup import GroupState, LocalStart
from .storehost import StoreHost
from .zygote_handle import ZygoteHandle

__all__ = ["LocalPool", "Message", "Output", "Exited"]

class LocalPool(GroupState):
    """Ranks on this machine (a :class:`~.rankgroup.RankGroup`; see the module docstring)."""

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        self._dir = tempfile.mkdtemp(prefix="nbtrain-")
        os.chmod(self._dir, 0o700)
        self.channel = Channel(self._dir)
        self.procs = RankProcesses(self._dir)
        self._store: StoreHost | None = None
        self._zygote: ZygoteHandle | None = None  # what the ranks were forked from (a replacement is too)

    def spawn(self, zygote: ZygoteHandle | None = None, fork_ranks: bool = True) -> None:
        """Start the store's process and the ranks (forked from ``zygote`` where it can; ``fork_ranks=False``:
        only the store); the ranks connect and rendezvous in the background (see :meth:`poll_events`)."""
        self.channel.listen(self.spec.nprocs)
        self._store = StoreHost("127.0.0.1", zygote)
        self._zygote = zygote if fork_ranks else None
        self.procs.start([self._env(rank) for rank in range(self.spec.nprocs)], self.channel.key, self._zygote)
        if self.spec.ft:
            self.channel.keep_listening()
        self.channel.accept(self.procs.pids())

    def _env(self, rank: int, attempt: int = 0) -> dict:
        assert self._store is not None
        env = worker_env(self.spec, rank, self._store.port, self.channel.address, self.run_id, self._dir)
        if attempt:  # --ft: a replica group started again meets under a prefix of its own (rank/main.py)
            env[FT_ATTEMPT_ENV] = str(attempt)
        return env

    def replace_rank(self, rank: int, attempt: int) -> int:
        """``--ft``: a new process in place of ``rank``, which exited (its group's ``attempt``-th start after a
        loss); it connects and says Ready as the others did. Returns its pid."""
        assert self.spec.ft, "only a --ft pool replaces its ranks"  # its slot keeps its device meanwhile
        pid = self.procs.replace(rank, self._env(rank, attempt), self.channel.key, self._zygote)
        self.channel.expect(rank, pid)
        return pid

    def kill_rank(self, rank: int) -> None:
        """``--ft``: end one rank and its children now (its replica group lost another rank); its exit follows."""
        self.procs.kill(rank)

    # ---------------------------------------------------------------------------------- state
    def alive(self) -> bool:
        """Ready, not broken, every rank running, and their store too (a flood may have ended its process)."""
        store = self._store
        return self.ready and not self.broken and self.procs.all_running() and store is not None and store.alive()

    def serves(self, spec: PoolSpec) -> bool:
        """Whether a cell asking for ``spec`` may run on these warm ranks (if they are alive)."""
        return self.spec == spec

    def node_infos(self) -> tuple:
        """The machines of a ``--nodes`` pool (:class:`~nbtrain.kernel.observers.events.NodeInfo`); one machine: none."""
        return ()

    def pids(self) -> list[int]:
        return self.procs.pids()

    def rank_label(self, rank: int) -> str:
        """How output and reports name ``rank`` (``rank 3``; on several machines ``node b rank 3``)."""
        return f"rank {rank}"

    def start_hint(self) -> str:
        """What the ranks are still waiting for, when they are slow to start (several machines: nodes)."""
        return ""

    def nodes_joined(self) -> str:
        """Before the ranks of a ``--nodes`` pool start: how many of its nodes have joined ("1 of 2 nodes joined
        (a from 10.0.0.2)"); "" once they started, and on one machine."""
        return ""

    def failure(self, rank: int, cause: P.RemoteError | int, output_tail=(), diagnosis: str | None = None) -> RankFailure:
        """How ``rank`` failed: an exception it reported, or its exit code (with its ``@record`` error file)."""
        recorded = None if isinstance(cause, P.RemoteError) else self.procs.error_file_message(rank, cause)
        return rank_failure(cause, RankFailure(rank, output_tail=list(output_tail), starting=rank not in self._devices,
                                               error_file_message=recorded, diagnosis=diagnosis))

    # --------------------------------------------------------------------------------- events
    def connected(self) -> bool:
        """Every rank has connected to the channel."""
        return self.channel.connected()

    def send_all(self, message) -> None:
        self.channel.send_all(message)

    def send_to(self, rank: int, message) -> None:
        self.channel.send_to(rank, message)

    def output_open(self) -> bool:
        """Whether some rank's stdout, stderr or channel may still have something (a stopped rank's channel can
        hold several messages, its last metrics among them, until its end of the connection is read)."""
        return self.procs.output_open() or bool(self.channel.waitables())

    def poll_events(self, timeout: float) -> list[RankEvent]:
        """Wait up to ``timeout`` for anything from the ranks; return the events (exits last)."""
        admissions = self.channel.admissions()  # connections still arriving through the accept thread
        conns, pipes = self.channel.waitables(), self.procs.waitables()
        sources = list(conns) + list(pipes) + ([admissions] if admissions is not None else [])
        events: list[RankEvent] = []
        if not sources:
            time.sleep(timeout)
        try:
            readable = wait(sources, timeout) if sources else []
        except (OSError, ValueError):  # a pipe or connection closed under the wait: the pool is being ended
            readable = []
        for ready in readable:
            if ready == admissions:
                self.channel.woken()
            elif ready in conns:
                events.extend(self.channel.receive(conns[ready]))
            else:
                events.extend(self.procs.read(*pipes[ready]))
        events.extend(self.procs.reap())
        return events

    def dump_stacks(self, wait: float = 0.5, ranks=None) -> dict[int, str]:
        """Live ranks' Python stacks (faulthandler on SIGUSR1), collected within ``wait`` seconds."""
        targets = {rank: (pid, stack_file_path(self._dir, rank)) for rank, pid in self.procs.running().items()
                   if ranks is None or rank in ranks}
        return request_stacks(targets, wait)

    def spawn_reason(self) -> str:
        return self.procs.spawn_reason

    def local_start(self) -> LocalStart:
        return LocalStart(self.procs.started_at, dict(self.procs.forked))

    def release_node(self, name: str, account: str) -> list:
        """Ranks on this machine belong to no node: there is none to release (a run names none for them)."""
        raise KeyError(f"no node {name!r}: this group's ranks run on this machine")

    def interrupt(self) -> None:
        """The stop button: exactly one SIGINT to each process of the pool (see :meth:`RankProcesses.interrupt`)."""
        self.procs.interrupt()

    # ------------------------------------------------------------------------------- teardown
    def teardown(self, graceful: bool = True, grace: float = 1.0, drain: Callable[[], None] | None = None) -> None:
        """End every process of this pool, politely if it is healthy and ``graceful``, surely in any case.

        ``drain`` runs after the processes ended and before their pipes close: the caller shows their last
        output. Then everything the pool held is freed.
        """
        polite = graceful and self.alive()
        self.mark_broken()
        if polite:
            with contextlib.suppress(OSError):
                self.channel.send_all(P.Shutdown())
                self.procs.wait_exit(grace * 2)
        with contextlib.suppress(OSError):
            self.channel.send_all(P.Stopping())  # its SIGTERM is no preemption notice (nbtrain.rank.stop)
        try:
            self.procs.stop(grace)
            if drain is not None:
                drain()
        finally:
            self.procs.close()
            self.channel.close()
            if self._store is not None:
                self._store.close()
            self._store = None
            shutil.rmtree(self._dir, ignore_errors=True)
