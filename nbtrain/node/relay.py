"""A detached run on several machines: its agent brings up the run's nodes and drives them in the kernel's stead.

``%%distributed --detach --nodes N`` starts the run's agent on this machine as for one machine
(:mod:`nbtrain.kernel.cluster.detached_agent`, with ``--relay``); the kernel sees it as one node holding every
rank. The agent's :class:`RelayRanks` stands where :class:`~.local_ranks.LocalRanks` stands for an agent with
ranks of its own — the same methods, the same messages up — so recording the run, seeing it through alone when
the kernel goes and ``--max-restarts`` (:mod:`.detached`, :mod:`.detached_restarts`) are the same code. Behind it
the nodes are driven by the kernel's own :class:`~nbtrain.kernel.cluster.group.NodePool`, now in the agent: a hub
of the agent's own on ``--rdzv-host`` (TLS, the join token in a 0600 file), the agents started over ssh
(``--hosts``), as a Slurm job (``--slurm``) or by whoever runs the join command, which is said in the cell; the
c10d store on ``--rdzv-host``; lost nodes. The nodes are ordinary agents: they stop their ranks if this agent
goes, never when the kernel does.

A :class:`NodePool` is used by one thread: every call on :class:`RelayRanks` is a command that its pump thread
carries out between two polls of the pool's events, which it turns back into the node messages the kernel and
the run's record read (a rank on another machine has pid 0 there: its process is not this machine's).
"""

from __future__ import annotations

import pickle
import queue
import socket
import threading
import time
from dataclasses import replace

from ..kernel.cluster.group import NodePool
from ..kernel.cluster.hub import Hub
from ..kernel.cluster.slurm import SlurmNodes
from ..kernel.cluster.ssh import SshNodes
from ..kernel.ranks.pool import Exited, Message, Output
from ..kernel.ranks.spec import NodesSpec, PoolSpec
from ..wire import nodes as N
from ..wire import protocol as P
from .console import say

POLL_S = 0.05
SAMPLE_S = 1.0  # the nodes as the kernel's dashboard sees them: refreshed for each heartbeat
CLOSE_WAIT_S = 10.0


class RelayRanks:
    """The run's ranks on its nodes, with :class:`~.local_ranks.LocalRanks`' face (see the module docstring).
    ``send`` puts a message on the kernel's link (and into the run's record)."""

    def __init__(self, send) -> None:
        self.send = send
        self.idle = threading.Event()  # no rank of the run is alive
        self.idle.set()
        self._commands: queue.Queue = queue.Queue()
        self._running = False
        self._hub: Hub | None = None  # the run's nodes join it; it stays for a restart's attempt
        self._ssh, self._slurm = SshNodes(), SlurmNodes()
        self._pool: NodePool | None = None
        self._attempt: _Attempt | None = None
        self.samples: list[dict] = []  # the run's nodes (hub.node_sample), sent with this agent's heartbeats
        self._sampled = 0.0
        self._pump = threading.Thread(target=self._loop, name="nbtrain-relay", daemon=True)
        self._pump.start()

    # ------------------------------------------------------------------------ LocalRanks' face
    def begin(self, start: N.StartRanks) -> None:
        """Bring up the nodes ``start.spread`` names and run the ranks there (a restart: the same nodes, warm)."""
        self._running = True
        self.idle.clear()
        self._commands.put((self._begin, start))

    def deliver(self, message: N.Deliver) -> None:
        self._commands.put((self._call, "deliver", message))

    def send_one(self, message: N.ToRank) -> None:
        self._commands.put((self._call, "send_bytes", message))

    def interrupt(self) -> None:
        self._commands.put((self._call, "interrupt"))

    def shut_down(self) -> None:
        self._commands.put((self._call, "send_all", P.Shutdown()))

    def stop(self, grace: float = 0.0) -> None:
        """Every node stops its ranks (SIGTERM → SIGKILL there); their exits follow as messages."""
        self._commands.put((self._stop,))

    def dump_stacks(self, message: N.DumpStacks) -> None:
        self._commands.put((self._stacks, message))

    def running(self) -> bool:
        return self._running

    def more_telemetry(self) -> dict:
        """The run's nodes (:func:`~nbtrain.kernel.cluster.hub.node_sample`), for the kernel's dashboard: in this
        agent's heartbeats and, for a kernel that attaches later, in the run's recorded telemetry."""
        return {"nodes": self.samples}

    def pids(self) -> list[int]:
        attempt = self._attempt
        return sorted(attempt.running()) if attempt is not None and self._running else []

    def close(self) -> None:
        """The run is over: its nodes leave (Bye), a Slurm job still queued is cancelled."""
        self._commands.put(None)
        self._pump.join(CLOSE_WAIT_S)

    # ---------------------------------------------------------------------------- the pump
    def _loop(self) -> None:
        while True:
            try:
                command = self._commands.get(timeout=POLL_S if self._pool is None else 0)
            except queue.Empty:
                command = ...
            if command is None:
                return self._leave()
            if command is not ...:
                command[0](*command[1:])
            elif self._pool is not None:
                self._relay(self._pool.poll_events(POLL_S))
                self._sample()

    def _sample(self) -> None:
        if self._pool is not None and time.monotonic() - self._sampled > SAMPLE_S:
            self._sampled = time.monotonic()
            self.samples = self._pool.node_samples()  # replaced whole: the heartbeat thread reads it as it is

    def _begin(self, start: N.StartRanks) -> None:
        if not isinstance(start.spread, NodesSpec):
            self.send(N.NodeError("this agent relays to the nodes of a --detach --nodes run, but the kernel named none"))
            self._running = False
            self.idle.set()
            return
        where = replace(start.spread, detached="", restarts=None, checkpoint_dir="")
        if self._hub is None:
            self._hub = Hub(where.rdzv_host)
        spec = PoolSpec(where.count * where.nproc_per_node, start.backend, start.device_type, (), start.timeout_s,
                        start.env, nodes=where)
        self._pool = NodePool(spec, self._hub, self._note, ssh=self._ssh, slurm=self._slurm)
        self._attempt = _Attempt(start.run_id, spec.nprocs, time.monotonic() + start.join_timeout_s)
        self._pool.spawn(None)

    def _call(self, method: str, *args) -> None:
        if self._pool is not None:
            getattr(self._pool, method)(*args)

    def _stop(self) -> None:
        """Stopped while the nodes start the ranks: nothing runs to stop, the start ends; else the nodes stop theirs."""
        attempt = self._attempt
        if self._pool is not None and attempt is not None and not attempt.announced:
            self._fail_start("stopped while the nodes were starting the ranks")
        else:
            self._call("stop_ranks")

    def _stacks(self, message: N.DumpStacks) -> None:
        pool = self._pool
        stacks = pool.dump_stacks(message.wait, message.ranks) if pool is not None else {}
        self.send(N.Stacks(stacks))

    def _note(self, text: str) -> None:
        """What the pool says (the join command, a lost node, the Slurm job's news): the agent's log and the cell."""
        say(text)
        self.send(N.NodeNote(text.removeprefix("nbtrain: ")))

    def _relay(self, events: list) -> None:
        pool, attempt = self._pool, self._attempt
        assert pool is not None and attempt is not None
        for event in events:
            if isinstance(event, Output):
                self.send(N.RankOutput(event.rank, event.stream, event.text))
            elif isinstance(event, Message):
                self.send(N.RankMessage(event.rank, pickle.dumps(event.message, protocol=pickle.HIGHEST_PROTOCOL)))
            elif isinstance(event, Exited) and not attempt.announced:  # a node could not start (ssh, Slurm, rendezvous)
                error, account = pool.exit_words(event.rank)
                return self._fail_start(account or error or f"rank {event.rank} exited with code {event.code} "
                                        "before every rank ran")
            elif isinstance(event, Exited):
                attempt.exits[event.rank] = event.code
                self.send(N.RankExited(event.rank, event.code, *pool.exit_words(event.rank)))
        if not attempt.announced and len(started := pool.started_ranks()) == attempt.nprocs:
            attempt.announce(started)
            self.send(N.RanksStarted("", attempt.placement()))
        elif not attempt.announced and time.monotonic() > attempt.start_deadline:
            return self._fail_start(f"the ranks did not start on the nodes in time{pool.start_hint()}")
        if attempt.ended():
            self._end_attempt()

    def _fail_start(self, why: str) -> None:
        """The ranks could not start on every node: said as the node agent's start failure, and the attempt ends."""
        say(f"the run's ranks did not start: {why}")
        self.send(N.NodeError(why))
        self._end_attempt()

    def _end_attempt(self) -> None:
        pool, attempt = self._pool, self._attempt
        assert pool is not None and attempt is not None
        pool.teardown(graceful=False)  # the nodes stay joined, warm for a restart; the store goes
        self._sampled = 0.0
        self._sample()
        self._pool = None
        self._running = False
        self.idle.set()
        self.send(N.RanksStopped(attempt.run_id))

    def _leave(self) -> None:
        if self._pool is not None:
            self._pool.teardown(graceful=False)
            self._pool = None
        self._running = False
        self.idle.set()
        if self._hub is not None:
            self._hub.close("the detached run ended")
        self._ssh.close()
        self._slurm.close()


class _Attempt:
    """One start of the run's ranks on its nodes: where they run and which have ended."""

    def __init__(self, run_id: str, nprocs: int, start_deadline: float) -> None:
        self.run_id = run_id
        self.nprocs = nprocs
        self.start_deadline = start_deadline  # monotonic: the nodes have joined and started the ranks by then
        self.announced = False
        self.exits: dict[int, int] = {}
        self._where: dict[int, tuple[str, int]] = {}  # rank -> (host, pid)

    def announce(self, started: dict[int, tuple[str, int]]) -> None:
        self.announced = True
        self._where = dict(started)

    def placement(self) -> dict[int, tuple[int, int]]:
        """rank -> (its place in the run, pid): the pid of a rank on another machine is 0, never a local process's."""
        here = socket.gethostname()
        return {rank: (rank, pid if host == here else 0) for rank, (host, pid) in sorted(self._where.items())}

    def running(self) -> set[int]:
        return {pid for rank, (_host, pid) in self._where.items() if rank not in self.exits}

    def ended(self) -> bool:
        """Every rank has exited, or the nodes failed to start them and each has said so."""
        return len(self.exits) == self.nprocs
