"""NodePool: the second rank group — its ranks run on joined nodes, each under torch elastic's agent.

:class:`NodePool` is a :class:`~nbtrain.kernel.ranks.rankgroup.RankGroup` beside the local
:class:`~nbtrain.kernel.ranks.pool.LocalPool` (it shares only :class:`~nbtrain.kernel.ranks.rankgroup.GroupState`, the
state both keep); :mod:`nbtrain.kernel.lifecycle.run` drives it exactly as it drives local ranks and sees the same events (:class:`Message`, :class:`Output`, :class:`Exited`):

* **start** (:meth:`NodePool.spawn`, through its :class:`~.launcher.NodeLauncher`): the c10d store listens on ``--rdzv-host``, hosted by a process of its own
  with a memory limit (:mod:`~nbtrain.kernel.ranks.storehost`), never by the kernel; once ``--nodes``
  nodes have joined the hub (:mod:`.hub`; the join command is printed once) — or, elastic ``--nodes MIN:MAX``,
  once MIN have and the last call for more is over (:mod:`.elastic`; ``spec`` then becomes the group's size
  and the job is sent only now, so the run knows its world size) — each gets
  :class:`~nbtrain.wire.nodes.StartRanks` and runs torch elastic's ``LocalElasticAgent`` with the
  rendezvous the kernel decided (each node's group rank, sent over the authenticated link: nothing of the
  rendezvous is read from the store, which has no authentication). Global ranks are
  elastic's (group rank × nproc-per-node + local rank), group ranks in join order; each node reports its own
  (:class:`~nbtrain.wire.nodes.RanksStarted`), which names output ``[node b rank 3]``;
* **the job** goes once per node (:meth:`send_all`), with the bytes of its shared-memory input files; the
  node writes them to its own ``/dev/shm`` and its local ranks map them as on one machine. Results come
  back in the pickle (no kernel file can be written from another machine);
* **events**: each node's link queues what its ranks said, printed and how they ended; a node silent for
  :data:`~.hub.LOST_AFTER_S` (or whose link broke) is *lost*: each of its ranks becomes an exit whose
  failure reads "node b (ranks 2–3) lost: no heartbeat for 5 s", and the run stops the others as for any
  failed rank; a node with a preemption notice (its agent got SIGTERM or the cloud's notice) is said as a
  :class:`~nbtrain.wire.protocol.PreemptNotice` of its first rank, and let go (:meth:`release_node`) once the
  checkpoint is written (:mod:`nbtrain.kernel.lifecycle.preemption`);
* **stop** (:meth:`interrupt`, :meth:`teardown`): one SIGINT through each node to its ranks, then
  :class:`~nbtrain.wire.nodes.StopRanks` (SIGTERM → SIGKILL on the node); the nodes stay joined, warm for the
  next pool.

Stacks (:meth:`dump_stacks`: for failures, the stop button and uneven collectives) are dumped on each node and
sent back. Under ``--ft`` each node is a replica group: a lost group's ranks start again (:meth:`replace_rank`).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..diagnostics.failures import RankFailure, rank_failure
from ..ranks.pool import Exited, Message, Output
from ..ranks.zygote_handle import ZygoteHandle
from ..ranks.rankgroup import GroupState
from ..ranks.spec import PoolSpec
from ...wire import nodes as N
from ...wire import protocol as P
from ...wire.restart_policy import FT_ATTEMPT_ENV
from ...wire.run_control import following_only
from ...gpu import jsonfields as J
from .hub import LOST_AFTER_S, MAX_NODES, Hub, NodeConn, node_sample, sampled_info
from .launcher import NodeLauncher
from .remote_rank import rank_span
from .slurm import SlurmNodes
from .ssh import SshNodes

STOP_WAIT_S = 2.5  # a node answers StopRanks within this (its own SIGTERM → SIGKILL takes about 1.5 s)


@dataclass
class RemoteRank:
    """One rank of the group, as its node reports it: the record that every per-rank question reads."""

    node: NodeConn | None = None  # known once its node said RanksStarted
    pid: int = 0  # on its node's machine
    exit_code: int | None = None  # None while it runs
    error: str | None = None  # its node's account of an exit (torch elastic's error file)
    account: str | None = None  # why its node is gone (lost, let go, never started)

    def exited(self) -> bool:
        return self.exit_code is not None


class NodePool(GroupState):
    """Ranks on ``spec.nodes.count`` joined nodes, a :class:`~nbtrain.kernel.ranks.rankgroup.RankGroup` (see the module
    docstring)."""

    def __init__(self, spec: PoolSpec, hub: Hub, say: Callable[[str], None] | None = None,
                 ssh: SshNodes | None = None, slurm: SlurmNodes | None = None) -> None:
        super().__init__(spec)
        assert spec.nodes is not None, "a NodePool runs on several machines: its spec has nodes"
        self.where = spec.nodes
        self._say = say or (lambda text: print(text, flush=True))
        self.launcher = NodeLauncher(spec.nodes, hub, self._say, ssh, slurm)  # the nodes' coming, until the group forms
        self.hub = hub
        self.nodes: list[NodeConn] = []
        self._ranks: dict[int, RemoteRank] = {}  # rank -> what its node said of it
        self._pending: list[N.Deliver] = []  # to the ranks, once the nodes run them
        self._stopped: set[str] = set()  # nodes whose ranks have all ended
        self._lost: set[str] = set()
        self._started = False
        self._last_poll = time.monotonic()
        self._backlog: list = []  # events that arrived while stacks were awaited
        self._awaiting_stacks: set[str] = set()
        self._stacks: dict[int, str] = {}
        self._wanted: dict[int, tuple[set[int], int]] = {}  # --ft: group -> (its ranks to start again, attempt)
        self._delivered: set[tuple[str, int]] = set()  # --ft: (node, job id) a replacement's job went to
        self._waiting_said = False

    # ------------------------------------------------------------------------------- start
    def spawn(self, zygote: ZygoteHandle | None = None, fork_ranks: bool = True) -> None:
        """Start the agents (or wait for them) and the pool's store (forked by ``zygote`` where it can); the ranks
        are the agents' to start, so ``fork_ranks`` changes nothing here."""
        self.launcher.begin(zygote)
        self._start_if_joined()

    def _start_if_joined(self) -> None:
        if self._started:
            return
        nodes = self.launcher.form()
        if not nodes:
            return
        self.nodes = nodes
        if self.where.min_nodes:  # elastic: the world size is decided now
            self.formed(len(nodes) * self.where.nproc_per_node)
        start = self._start_message(len(nodes))
        for group_rank, node in enumerate(nodes):
            while not node.link.incoming.empty():  # what an earlier pool's ranks said last; the agent's notes are said
                self._note(node, node.link.incoming.get_nowait())
            self.hub.mark_running(node)
            node.link.send(replace(start, group_rank=group_rank))  # the rendezvous, decided here (node/rendezvous.py)
            for deliver in self._pending:
                node.link.send(deliver)
        self._started = True

    def _start_message(self, nnodes: int, attempt: int = 0) -> N.StartRanks:
        env = self.spec.env
        if self.spec.ft:  # a replica group per node: its ranks' process group (rank/main.py), torchft's logs quiet
            env = (("RUST_LOG", "warn"), *env, ("NBTRAIN_FT", str(self.spec.ft_group_size)),
                   (FT_ATTEMPT_ENV, str(attempt)))
        return N.StartRanks(self.run_id, self.launcher.store_address(), nnodes, self.where.nproc_per_node,
                            self.spec.backend, self.spec.device_type, self.spec.timeout_s, env, os.getpid(),
                            detached_run=self.where.detached, restarts=self.where.restarts,
                            leased_gpus=self.spec.gpu_ids if self.where.detached else (), spread=self.where.spread)

    def serves(self, spec: PoolSpec) -> bool:
        """Warm for ``spec`` while its nodes stay; an elastic group that formed below MAX re-forms when more have
        joined since (torch elastic's scale-up restarts the workers too)."""
        if spec != self.spec:
            return False
        return not (self.where.min_nodes and self._started and len(self.nodes) < self.where.count
                    and self.hub.idle_nodes())

    def start_hint(self) -> str:
        return "" if self._started else self.launcher.start_hint()

    def nodes_joined(self) -> str:
        return "" if self._started else self.launcher.nodes_joined()

    # --------------------------------------------------------------------------------- state
    def alive(self) -> bool:
        return (self.ready and not self.broken and not any(r.exited() for r in self._ranks.values()) and not self._lost
                and all(not n.lost() for n in self.nodes))

    def pids(self) -> list[int]:
        """Each rank's pid where it means something here: ranks on another machine are 0 (the dashboard's
        per-process telemetry must not read an unrelated local process)."""
        here = socket.gethostname()
        return [r.pid if (r := self._ranks.get(rank)) is not None and r.node is not None and r.node.hello.host == here
                else 0 for rank in range(self.world_size)]

    def rank_label(self, rank: int) -> str:
        node = self._known(rank).node
        return f"node {node.name} rank {rank}" if node is not None and not self.where.detached else f"rank {rank}"

    def failure(self, rank: int, cause: P.RemoteError | int, output_tail=(), diagnosis: str | None = None) -> RankFailure:
        """As on one machine, named by its node, with the node's account of an exit (its error file, a loss)."""
        record = self._known(rank)
        recorded = None if isinstance(cause, P.RemoteError) else record.error
        return rank_failure(cause, RankFailure(rank, output_tail=list(output_tail), starting=rank not in self.devices,
                                               error_file_message=recorded, diagnosis=diagnosis,
                                               label=self.rank_label(rank), account=record.account))

    def spawn_reason(self) -> str:
        return ""  # the agents start the ranks: the kernel's zygote forks none

    def local_start(self) -> None:
        return None  # ranks on other machines: their start is not on this clock

    def dump_stacks(self, wait: float = 0.5, ranks=None) -> dict[int, str]:
        """Live ranks' Python stacks, dumped on their nodes (SIGUSR1, faulthandler) and sent back within ``wait``
        (plus the network's time); what else arrives meanwhile is kept for the next :meth:`poll_events`."""
        asked: dict[str, tuple[NodeConn, list[int]]] = {}
        for rank, r in self._ranks.items():
            if r.node is not None and (ranks is None or rank in ranks) and not r.exited() and r.node.name not in self._lost:
                asked.setdefault(r.node.name, (r.node, []))[1].append(rank)
        for node, wanted in asked.values():
            node.link.send(N.DumpStacks(tuple(wanted), wait))
        self._awaiting_stacks, self._stacks = set(asked), {}
        deadline = time.monotonic() + wait + 1.0
        while self._awaiting_stacks and time.monotonic() < deadline:
            arrived = self.poll_events(0.05)  # the backlog so far and what came since: poll_events takes the list
            self._backlog.extend(arrived)  # (so bound after it returns, never before: the events would be lost)
        self._awaiting_stacks = set()
        return dict(sorted(self._stacks.items()))

    # -------------------------------------------------------------------------------- events
    def connected(self) -> bool:
        return self._started  # the job goes once the group has formed: the run then knows its world size

    def send_all(self, message) -> None:
        files: tuple = ()
        if isinstance(message, P.Job):
            files = tuple((path, _read(path)) for path in message.shared_files)
            message = replace(message, result_prefix="", shared_files=())  # results come back in the pickle
        self.deliver(N.Deliver(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), files))

    def deliver(self, deliver: N.Deliver) -> None:
        """The job as nodes take it, to every node (kept for them until the group has formed)."""
        if not self._started:
            self._pending.append(deliver)
            return
        for node in self.nodes:
            node.link.send(deliver)

    def send_to(self, rank: int, message) -> None:
        if isinstance(message, P.Job):  # --ft: a replacement group's job, to its node once, with the input files
            return self._deliver_job_to(rank, message)
        self.send_bytes(N.ToRank(rank, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)))

    def send_bytes(self, message: N.ToRank) -> None:
        """One rank's message, pickled already, to its node; a rank not started yet (or gone) gets none."""
        node = self._known(message.rank).node
        if node is not None:
            node.link.send(message)

    def started_ranks(self) -> dict[int, tuple[str, int]]:
        """The ranks whose node has said where they run: rank -> (that node's host, pid there)."""
        return {rank: (r.node.hello.host, r.pid) for rank, r in self._ranks.items() if r.node is not None}

    def exit_words(self, rank: int) -> tuple[str | None, str | None]:
        """What was said of ``rank``'s end: its node's error (torch elastic's error file), and why its node is gone
        (lost, let go, never started)."""
        record = self._known(rank)
        return record.error, record.account

    def output_open(self) -> bool:
        return any(n.name not in self._stopped and n.name not in self._lost for n in self.nodes)

    def poll_events(self, timeout: float) -> list:
        self._start_if_joined()
        events, self._backlog = self._backlog, []
        events += self._collect()
        if not events:
            select.select([self.hub.wake_r], [], [], timeout)
            self.hub.drain_wake()
            self._start_if_joined()
            events = self._collect()
        if self._wanted:
            self._start_replacements()
        return events + self._check_lost() + self._start_failures()

    def _start_failures(self) -> list:
        """Before the ranks start: the ranks of a node that could not be started (ssh, Slurm) end, in its words."""
        if self._started:
            return []
        return [self._end(rank, code, text) for ranks, code, text in self.launcher.start_failures()
                for rank in ranks if not self._rank(rank).exited()]

    def _collect(self) -> list:
        events: list = []
        for node in self.nodes:
            while not node.link.incoming.empty():
                message = node.link.incoming.get_nowait()
                if message is not None:
                    events.extend(self._translate(node, message))
        return events

    def _translate(self, node: NodeConn, message) -> list:
        if isinstance(message, N.RankOutput):
            return [Output(message.rank, message.stream, message.text)]
        if isinstance(message, N.RankMessage):
            said = pickle.loads(message.data)  # from an authenticated node
            if isinstance(said, P.PreemptNotice):  # a rank got SIGTERM (Slurm signals the whole job step)
                said = replace(said, node=node.name)
            return [Message(message.rank, said)]
        if isinstance(message, N.PreemptionNotice):  # the run's loop has every rank save, then releases the node
            first = min(self._node_ranks(node))
            return [Message(first, P.PreemptNotice(first, message.source, message.noticed_at, message.ends_at,
                                                   node.name))]
        if isinstance(message, N.RankExited):
            record = self._rank(message.rank)
            record.exit_code = message.code
            if message.error:
                record.error = message.error
            if message.lost:  # a detached run's agent drives the node that was lost: said here, once, as if its own
                if message.lost not in (r.account for r in self._ranks.values()):
                    self._say(f"nbtrain: {message.lost}; stopping the other ranks")
                record.account = message.lost
            if message.code == -signal.SIGTERM:
                self._account_slurm_end(node, message.rank)
            return [Exited(message.rank, message.code)]
        if isinstance(message, N.RanksStarted):
            for rank, (_local, pid) in message.ranks.items():
                record = self._rank(rank)
                record.node, record.pid = node, pid
        elif isinstance(message, N.RanksStopped) and message.run_id in ("", self.run_id):  # not a late one of an earlier pool
            self._stopped.add(node.name)
            self.hub.mark_idle(node)
        elif isinstance(message, N.Stacks):
            self._stacks.update(message.stacks)
            self._awaiting_stacks.discard(node.name)
        elif isinstance(message, N.NodeNote):
            self._note(node, message)
        elif isinstance(message, N.NodeError):  # said now, as a lost node is: stopping the others takes seconds
            text = f"node {node.name} could not start its ranks: {message.text}"
            self._say(f"nbtrain: {text}")
            return self._node_failed(node, text, 1)
        return []

    def _note(self, node: NodeConn, message) -> None:
        """An agent's note (:class:`~nbtrain.wire.nodes.NodeNote`), said in the cell; other messages are dropped."""
        if isinstance(message, N.NodeNote):
            self._say(f"nbtrain: node {node.name}: {message.text}")

    def _account_slurm_end(self, node: NodeConn, rank: int) -> None:
        """A rank SIGTERMed from outside while its Slurm job ends (someone's ``scancel``: Slurm signals every process
        of the job) is its node lost, in Slurm's words — whether its agent was killed first or not."""
        if self.broken or self._rank(rank).account is not None:
            return  # the pool's own stop; or its account is known (a preempted node let go)
        why = self.launcher.end_reason()  # "" without a Slurm job
        if why:
            self._rank(rank).account = f"node {node.name} ({rank_span(self._node_ranks(node))}) lost: {why}"

    def node_infos(self) -> tuple:
        if self.where.spread is not None:  # the run's agent drives its nodes: each as the agent's heartbeat says
            return self._relayed_infos()
        return tuple(node.info(self._node_ranks(node), node.name in self._lost or node.lost()) for node in self.nodes)

    def node_samples(self) -> list[dict]:
        """Each node as plain values (:func:`~.hub.node_sample`), for a detached run's agent to send its kernel."""
        return [node_sample(node, self._node_ranks(node), node.name in self._lost or node.lost()) for node in self.nodes]

    def _relayed_infos(self) -> tuple:
        beat = self.nodes[0].link.last_heartbeat if self.nodes else None
        sample = beat.telemetry if beat is not None and isinstance(beat.telemetry, dict) else {}
        return tuple(i for i in map(sampled_info, J.items(sample.get("nodes"), MAX_NODES) or []) if i is not None)

    def _node_ranks(self, node: NodeConn) -> list[int]:
        ranks = [rank for rank, r in self._ranks.items() if r.node is node]
        if not ranks:  # before the rendezvous told us: the ranks it would have had, in join order
            first = self.nodes.index(node) * self.where.nproc_per_node
            ranks = list(range(first, first + self.where.nproc_per_node))
        return ranks

    def _node_failed(self, node: NodeConn, text: str, code: int) -> list:
        events = []
        for rank in self._node_ranks(node):
            if not self._rank(rank).exited():
                events.append(self._end(rank, code, text))
        return events

    def _rank(self, rank: int) -> RemoteRank:
        """``rank``'s record, made on first mention (a rank may be failed before its node reported it)."""
        return self._ranks.setdefault(rank, RemoteRank())

    def _known(self, rank: int) -> RemoteRank:
        """What is known of ``rank`` (nothing yet: an empty record), without recording it."""
        return self._ranks.get(rank) or RemoteRank()

    def _end(self, rank: int, code: int, account: str) -> Exited:
        """``rank`` ended with ``code`` for a reason its node could not tell (lost, never started)."""
        record = self._rank(rank)
        record.exit_code, record.account = code, account
        return Exited(rank, code)

    # ---------------------------------------------------------------------------- --ft: a replica group per node
    def replace_rank(self, rank: int, attempt: int) -> int:
        """--ft: once every rank of a lost group (a node's) is asked for, they start again — on the same node if its
        agent is still there, else on a node that joined since, or as soon as one does. No pid here: 0."""
        group = rank // self.where.nproc_per_node
        self._wanted.setdefault(group, (set(), attempt))[0].add(rank)
        self._start_replacements()
        return 0

    def kill_rank(self, rank: int) -> None:
        """--ft: nothing to do — a node's agent ends its other ranks itself when one fails (torch elastic's)."""

    def _start_replacements(self) -> None:
        for group, (ranks, attempt) in list(self._wanted.items()):
            node = self._free_node(group) if len(ranks) == self.where.nproc_per_node else None
            if node is None:
                continue
            del self._wanted[group]
            self.nodes[group] = node
            self._stopped.discard(node.name)
            for rank in ranks:
                self._ranks.pop(rank, None)  # the new ranks' node reports them (RanksStarted)
            self.hub.mark_running(node)
            node.link.send(replace(self._start_message(len(self.nodes), attempt), group_rank=group))
            self._say(f"nbtrain: --ft: node {node.name} starts {rank_span(ranks)} again")
            self._waiting_said = False

    def _free_node(self, group: int) -> NodeConn | None:
        old = self.nodes[group]
        if old.name not in self._lost and not old.lost() and old.name in self._stopped:
            return old  # its agent stays: its ranks failed, the machine did not
        if old.name not in self._lost and not old.lost():
            return None  # its agent is still stopping them
        spare = next((n for n in self.hub.idle_nodes() if n not in self.nodes), None)
        if spare is None and not self._waiting_said:
            self._waiting_said = True
            self._say(f"nbtrain: --ft: waiting for a node to take node {old.name}'s place; the others keep stepping. "
                      f"Start one with:\n  {self.hub.join_command()}")
        return spare

    def _deliver_job_to(self, rank: int, job: P.Job) -> None:
        node = self._known(rank).node
        if node is None or (node.name, job.job_id) in self._delivered:
            return
        self._delivered.add((node.name, job.job_id))
        files = tuple((path, _read(path)) for path in job.shared_files)
        job = replace(job, result_prefix="", shared_files=())
        node.link.send(N.Deliver(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL), files))

    def release_node(self, name: str, account: str) -> list:
        """A preempted node whose checkpoint is written (or whose grace ran out): its agent leaves now, its ranks
        end the run with ``account``, and the next group forms without it."""
        node = next(n for n in self.nodes if n.name == name)
        self._lost.add(name)  # gone on purpose: not reported lost
        self.hub.mark_leaving(node)
        node.link.send(N.Bye(f"preempted: {account}"))
        return self._node_failed(node, account, -signal.SIGTERM)

    def _check_lost(self) -> list:
        now = time.monotonic()
        stalled, self._last_poll = now - self._last_poll > 1.0, now
        if stalled:
            return []  # this kernel itself was busy (an import holding the GIL): its links had no chance to read
        events: list = []
        for node in self.nodes:
            if node.name in self._lost or node.name in self._stopped or not node.lost():
                continue
            self._lost.add(node.name)
            why = "its connection broke" if node.link.closed.is_set() else f"no heartbeat for {LOST_AFTER_S:.0f} s"
            why = self.launcher.end_reason() or why  # TIMEOUT, CANCELLED by …
            text = f"node {node.name} ({rank_span(self._node_ranks(node))}) lost: {why}"
            if not self.spec.ft:  # under --ft the others go on (the run says so, nbtrain.kernel.lifecycle.ft_run)
                self._say(f"nbtrain: {text}; stopping the other ranks")  # now: stopping them takes seconds more
            events.extend(self._node_failed(node, text, -9))
        return events

    # ------------------------------------------------------------------------------ stopping
    def interrupt(self) -> None:
        for node in self.nodes:
            node.link.send(N.Interrupt())

    def stop_ranks(self) -> None:
        """SIGTERM → SIGKILL on every node still running ranks; their exits come as events (:meth:`teardown` waits
        for them instead)."""
        for node in self.nodes:
            if node.name not in self._stopped and node.name not in self._lost:
                node.link.send(N.StopRanks())

    def stopped_elsewhere(self) -> str:
        """A detached run another live kernel has taken control of (:mod:`nbtrain.wire.run_control`)."""
        return following_only(self.where.detached) if self.where.detached else ""

    def teardown(self, graceful: bool = True, grace: float = 1.0, drain: Callable[[], None] | None = None) -> None:
        if self.stopped_elsewhere():  # the run is another kernel's to stop: say Bye, its agent goes on alone
            self.mark_broken()
            self.launcher.close()
            return
        if not self._started:
            self.launcher.say_job_kept()
        polite = graceful and self.alive()
        self.mark_broken()
        try:
            if polite:
                self.send_all(P.Shutdown())
                self._wait_stopped(grace * 2)
            self.stop_ranks()
            if drain is not None:
                drain()
            self._wait_stopped(STOP_WAIT_S)
        finally:
            for node in self.nodes:
                if node.name in self._lost:
                    node.link.close()
                self.hub.mark_idle(node)  # a node slow to confirm still ends its ranks; the next pool may use it
            self.launcher.close()

    def _wait_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.output_open() and time.monotonic() < deadline:
            self.poll_events(0.05)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:  # removed already: the ranks will say which input failed to load
        print(f"nbtrain: could not read the shared input file {path} ({exc})", file=sys.stderr)
        return b""
