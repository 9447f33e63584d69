"""Several machines: the kernel's side of ``%%distributed --nodes N`` (node agents: :mod:`nbtrain.node`).

* :mod:`.tls` — the pool's self-signed certificate, pinned through the join token;
* :mod:`.hub` — the TLS listener on ``--rdzv-host``, the join token, the registry of joined nodes, heartbeats;
* :mod:`.launcher` — :class:`~.launcher.NodeLauncher`: the agents started (ssh, Slurm) or waited for, the group
  formed from the joined nodes, the c10d store;
* :mod:`.group` — :class:`~.group.NodePool`, the pool implementation whose ranks run on the nodes under
  torch elastic's agent (its launcher brings the nodes); :mod:`nbtrain.kernel.lifecycle.run` drives it like the local one.

:class:`Cluster` is what the magics hold: it makes the hub on first use and hands :class:`~nbtrain.kernel.lifecycle.pools.PoolManager`
a pool factory (:meth:`Cluster.make_pool`) that returns a local :class:`~nbtrain.kernel.ranks.pool.LocalPool` for a
one-machine spec and a :class:`~.group.NodePool` for a multi-node one. Nodes stay joined between cells, while
the hub lives: until ``%distributed_shutdown``, the extension's unloading or the kernel's exit.
:mod:`.emulated` starts node agents on this machine's loopback addresses (``%distributed_nodes --emulate N``),
:mod:`.ssh` on other machines over ssh (``--hosts a,b``), :mod:`.slurm` as a Slurm job (``--slurm ARGS``).
"""

from __future__ import annotations

import atexit
import threading

from ..ranks.pool import LocalPool
from ..ranks.rankgroup import RankGroup
from ..ranks.spec import PoolSpec
from .emulated import EmulatedNodes, check_loopback
from .group import NodePool
from .hub import Hub
from .recorded import RecordedGroup
from .slurm import SlurmNodes
from .ssh import SshNodes, loopback

__all__ = ["Cluster", "Hub", "NodePool"]


class Cluster:
    """The kernel's hub (one per ``--rdzv-host``) and the pool factory that uses it."""

    def __init__(self) -> None:
        self._hub: Hub | None = None
        self._lock = threading.Lock()
        self._atexit = False
        self.emulated = EmulatedNodes()
        self.ssh = SshNodes()  # --hosts: agents started over ssh
        self.slurm = SlurmNodes()  # --slurm: agents started as a Slurm job (one at a time)

    def hub(self, host: str) -> Hub:
        with self._lock:
            if self._hub is not None and self._hub.host != host:
                self._hub.close("the notebook now listens on another --rdzv-host")
                self._hub = None
                self.ssh.close()  # their agents left with that hub
                self.slurm.close()
            if self._hub is None:
                self._hub = Hub(host)
                if not self._atexit:  # a kernel shut down from JupyterLab releases its nodes and token file too
                    atexit.register(self.close)
                    self._atexit = True
            return self._hub

    def make_pool(self, spec: PoolSpec) -> RankGroup:
        if spec.nodes is None:
            return LocalPool(spec)
        if spec.nodes.recorded:  # %distributed_attach: the run's record, read back
            return RecordedGroup(spec)
        if spec.nodes.detached:  # a hub of the run's own: no other cell's pool is given its agent
            return NodePool(spec, Hub(spec.nodes.rdzv_host, private=True))
        return NodePool(spec, self.hub(spec.nodes.rdzv_host), ssh=self.ssh, slurm=self.slurm)

    def start_hosts(self, host: str, hosts: tuple[str, ...], options=(), python: str = "",
                    preemption_url: str = "") -> list[str]:
        """Listen on ``host`` and start a node agent on each of ``hosts`` over ssh (those without one running)."""
        hub = self.hub(host)
        return self.ssh.start(hosts, f"{hub.host}:{hub.port}", hub.valid_token(), options, python, preemption_url)

    def start_slurm(self, host: str, nodes: int, args: tuple[str, ...], python: str = "", min_nodes: int = 0,
                    preemption_url: str = "") -> str:
        """Listen on ``host`` and start ``nodes`` agents (MIN to ``nodes`` with ``min_nodes``) as a Slurm job,
        unless this kernel's job runs or waits."""
        hub = self.hub(host)
        if self.slurm.active():
            return f"nbtrain: Slurm job {self.slurm.job_id} runs the node agents already"
        hub.valid_token()
        return self.slurm.start(nodes, min_nodes, f"{hub.host}:{hub.port}", hub.token_path, args, python,
                                bool(loopback(hub.host)), preemption_url)

    def kept(self, seconds: float) -> str:
        """After a cell: the Slurm job stays ``seconds`` for the next one (the nodes of other kinds are not billed
        by nbtrain's doing: they stay joined)."""
        return self.slurm.kept(seconds)

    def release(self) -> str:
        """The warm pool's keep-alive is over: the Slurm job goes, and its agents at once — Slurm's SIGTERM reaches
        them later, and meanwhile the next cell would be given nodes that are about to be killed."""
        job = self.slurm.job_id
        said = self.slurm.release()
        if said and self._hub is not None:
            self._hub.dismiss(lambda node: node.hello.slurm_job == job, f"Slurm job {job} was released")
        return said

    def emulate(self, host: str, count: int, preemption_url: str = "") -> list[str]:
        """Listen on ``host`` (loopback) and start ``count`` node agents on this machine; their addresses."""
        check_loopback(host)
        hub = self.hub(host)
        return self.emulated.start(f"{hub.host}:{hub.port}", hub.valid_token(), count, preemption_url)

    def describe(self) -> list[str]:
        hub = self._hub
        if hub is None:
            return ["nbtrain: no node has joined (a %%distributed --nodes N cell prints the command that joins one, "
                    "or %distributed_nodes --rdzv-host ADDRESS)."]
        lines = hub.describe() or ["nbtrain: no node is joined now."]
        hub.announce()  # printed below: a first --nodes cell need not print the command again
        ssh = [f"nbtrain: the node on {host} could not be started over ssh: {why}" for host, why in self.ssh.failed()]
        return lines + self.slurm.describe() + self.emulated.failures() + ssh + [f"join more with: {hub.join_command()}", hub.join_help()]

    def renew_token(self, host: str | None, ttl_s: float | None, revoke: bool) -> str:
        """``--token-ttl`` / ``--revoke``: a new token for the hub on ``host`` (or the one listening); what to tell
        the user. :class:`ValueError` when nothing listens yet and no host is given."""
        if host is None and self._hub is None:
            raise ValueError("no join token yet: nothing listens for nodes (give --rdzv-host ADDRESS)")
        hub = self.hub(host) if host else self._hub
        assert hub is not None
        hub.issue_token(ttl_s)
        done = "revoked the join token; " if revoke else ""
        return f"nbtrain: {done}a new token admits nodes from now on (nodes already joined stay)."

    def close(self) -> bool:
        with self._lock:
            hub, self._hub = self._hub, None
        if hub is None:
            return False
        hub.close()
        self.emulated.close()  # they leave with the pool; this reaps them
        self.ssh.close()
        self.slurm.close()  # after the Bye: a job still waiting in the queue is cancelled too
        return True
