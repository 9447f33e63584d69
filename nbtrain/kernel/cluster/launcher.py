"""NodeLauncher: how a node group's machines come to be there — the agents started (emulated, ssh, Slurm) or
waited for, the group formed from those that joined, and the c10d store the ranks bootstrap from.

:class:`~.group.NodePool` owns the ranks once they run; this layer owns everything before: it knows the hub
(:mod:`.hub`), the ssh sessions (:mod:`.ssh`), the Slurm job (:mod:`.slurm`) and the formation rule
(:mod:`.elastic`), and answers the pool in nodes, ranks and plain words. Nothing here reads or writes a rank's
record, so a new way of bringing machines (a detached local agent) is one more launcher, not a change to the group.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...common.words import count
from ..ranks.spec import NodesSpec
from ..ranks.storehost import StoreHost
from ..ranks.zygote_handle import ZygoteHandle
from ...wire.runfolder import reserved_path
from ..lifecycle.checkpoint_lock import descriptor_of
from .detached_agent import DetachedAgent
from .elastic import Formation
from .hub import Hub, NodeConn
from .slurm import SlurmNodes
from .ssh import SshNodes, loopback

# What a launcher reports before the ranks start: these ranks ended with this exit code, for this reason.
StartFailure = tuple[list[int], int, str]


class NodeLauncher:
    """Brings ``where.count`` node agents to the hub and forms the group from them (see the module docstring)."""

    def __init__(self, where: NodesSpec, hub: Hub, say: Callable[[str], None], ssh: SshNodes | None = None,
                 slurm: SlurmNodes | None = None) -> None:
        self.where = where
        self.hub = hub
        self.ssh = ssh  # with --hosts: the sessions that start the agents (the Cluster's, kept between pools)
        self.slurm = slurm if where.slurm is not None else None  # with --slurm: the job that runs the agents
        self.formation = Formation(where.min_nodes or where.count, where.count, where.last_call_s)
        self._say = say
        self._store: StoreHost | None = None  # the c10d store the group's ranks bootstrap from, on --rdzv-host
        self.agent: DetachedAgent | None = None  # --detach: the run's own agent (it hosts the store itself)

    # ------------------------------------------------------------------------------- start
    def begin(self, zygote: ZygoteHandle | None) -> None:
        """Start the agents (or say how to), then the store (forked by ``zygote`` where it can)."""
        where, hub = self.where, self.hub
        if where.detached:
            self.agent = DetachedAgent(hub, reserved_path(where.detached), descriptor_of(where.checkpoint_dir),
                                       relay=where.spread is not None)
            return
        if where.hosts and self.ssh is not None:  # first: the agents start while this kernel imports torch
            if len(hub.idle_nodes()) < where.count:
                started = self.ssh.start(where.hosts, f"{hub.host}:{hub.port}", hub.valid_token(),
                                         where.ssh_options, where.remote_python, where.preemption_url)
                if started:
                    self._say(f"nbtrain: starting node agents over ssh on {', '.join(started)}")
        elif self.slurm is not None:
            self._start_slurm()
        elif len(hub.idle_nodes()) < where.count and hub.announce():
            self._say(f"nbtrain: waiting for {self.wanted()}; on each node run:\n  {hub.join_command()}\n"
                      f"{hub.join_help()}")
        self._store = StoreHost(where.rdzv_host, zygote)

    def _start_slurm(self) -> None:
        """Submit the agents' job unless one runs or waits already (it was kept when a cell was stopped)."""
        where, hub = self.where, self.hub
        assert self.slurm is not None and where.slurm is not None
        if len(hub.idle_nodes()) >= where.count:
            return
        if self.slurm.active():
            self._say(self.slurm.news(again=True) or f"nbtrain: waiting for the nodes of Slurm job {self.slurm.job_id}")
            return
        hub.valid_token()  # the file the agents read holds a live token
        self._say(self.slurm.start(where.count, where.min_nodes, f"{hub.host}:{hub.port}", hub.token_path,
                                   where.slurm, where.remote_python, bool(loopback(hub.host)), where.preemption_url))

    def form(self) -> list[NodeConn]:
        """The nodes the group starts on, once enough have joined (elastic: once the last call is over); [] until then."""
        idle = self.hub.idle_nodes()
        if self.agent is not None:  # a detached run: its own agent alone
            return [node for node in idle if node.hello.pid == self.agent.pid][:1]
        size = self.formation.size(len(idle), time.monotonic())
        if size == 0:
            return []
        if self.slurm is not None and (news := self.slurm.news(ask_now=True)):  # nodes joined before a poll saw it run
            self._say(news)
        nodes = idle[:size]
        if self.where.min_nodes:  # elastic: said now, with the world size it decided
            self._say(self.formation.announce([n.name for n in nodes], self.where.nproc_per_node))
        return nodes

    def store_address(self) -> str:
        if self.agent is not None:
            return ""  # a detached run's agent hosts the store (nbtrain.node.detached)
        assert self._store is not None, "begin() starts the store"
        return f"{self.where.rdzv_host}:{self._store.port}"

    def start_failures(self) -> list[StartFailure]:
        """Before the ranks start: a host whose ssh session failed, or a Slurm job that ended, fails those ranks in
        ssh's or Slurm's words (the job's changes of state are said as they come); a detached run's agent that
        exited before joining, in its log's words."""
        return self._ssh_failures() + self._slurm_failures() + self._agent_failures()

    def _agent_failures(self) -> list[StartFailure]:
        if self.agent is None or self.agent.alive() or self.hub.idle_nodes():
            return []
        text = f"the detached run's agent exited before it joined (its log: {self.agent.log_tail()})"
        return [(list(range(self.where.nproc_per_node)), 1, text)]

    def _ssh_failures(self) -> list[StartFailure]:
        where = self.where
        if self.ssh is None or not where.hosts:
            return []
        failures: list[StartFailure] = []
        for host, why in self.ssh.failed():
            if host not in where.hosts:
                continue
            first = where.hosts.index(host) * where.nproc_per_node
            text = f"the node on {host} could not be started over ssh: {why}"
            self._say(f"nbtrain: {text}")
            failures.append((list(range(first, first + where.nproc_per_node)), 255, text))
        return failures

    def _slurm_failures(self) -> list[StartFailure]:
        if self.slurm is None:
            return []
        self.hub.valid_token()  # however long the job waits, its agents find a live token in the file
        news = self.slurm.news()
        if news:
            self._say(news)
        why = self.slurm.ended()
        if not why:
            return []
        self._say(f"nbtrain: {why}")
        return [(list(range(self.where.count * self.where.nproc_per_node)), 1, f"the node agents' {why}")]

    def end_reason(self) -> str:
        """Why the Slurm job's nodes went (TIMEOUT, CANCELLED by …), or "" without a job or a reason."""
        return (self.slurm.end_reason() or "") if self.slurm is not None else ""

    # ------------------------------------------------------------------------------- words
    def wanted(self) -> str:
        """``2 nodes``, ``1 node``, ``2 to 4 nodes`` (elastic)."""
        where = self.where
        return f"{where.min_nodes} to {count('node', where.count)}" if where.min_nodes else count("node", where.count)

    def start_hint(self) -> str:
        """What a start that takes long waits for, and how to start the missing nodes."""
        if self.slurm is not None and (job := self.slurm.describe()):
            return f"; {self.nodes_joined()}; {job[0]}"
        return f"; {self.nodes_joined()}. Start the missing nodes with:\n  {self.hub.join_command()}"

    def nodes_joined(self) -> str:
        joined = self.hub.idle_nodes()
        if self.where.min_nodes and len(joined) >= self.where.min_nodes:
            return ""  # elastic, enough there: the group forms after the last call, no node is missing
        have = ", ".join(f"{n.name} from {n.address}" for n in joined) or "none"
        return f"{len(joined)} of {self.wanted()} joined ({have})"

    # ------------------------------------------------------------------------------- end
    def say_job_kept(self) -> None:
        """The stop button pressed while a Slurm job waits for its nodes ends the wait only: the job stays."""
        if self.slurm is not None and self.slurm.active():
            self._say(f"nbtrain: Slurm job {self.slurm.job_id} stays; its nodes join when it starts, for the next "
                      "cell (%distributed_shutdown cancels it)")

    def close(self) -> None:
        """Stop the store (the agents stay joined, warm for the next group); a detached run's hub is its own:
        closed, its agent leaves (or, if its ranks still run, sees the run to its end alone)."""
        if self._store is not None:
            self._store.close()
        self._store = None
        if self.agent is not None:
            self.hub.close("the detached run's cell ended")
