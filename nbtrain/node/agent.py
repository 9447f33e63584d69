"""One pool's ranks on this node, under torch elastic's ``LocalElasticAgent`` — as ``torchrun`` runs them.

For each :class:`~nbtrain.wire.nodes.StartRanks` the node builds what ``torchrun --nnodes N --nproc-per-node M
--rdzv-backend c10d --rdzv-endpoint <kernel>:<port> python -m nbtrain.rank`` builds
(:func:`torch.distributed.launcher.api.launch_agent`) — except the rendezvous: the kernel decides the group
and sends this node its group rank over the authenticated link (:mod:`.rendezvous`: nothing is read back from
the store the kernel hosts, which has no authentication), a :class:`WorkerSpec` with the worker module as
entry point, and a :class:`LocalElasticAgent` whose logs specs redirect each rank's stdout and stderr to
files the node tails (:mod:`.ranks`). The agent does the rendezvous, assigns global ranks, sets the
environment torchrun sets (RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT,
TORCHELASTIC_*), starts the processes and monitors them; nbtrain adds its own variables (the channel's
socket and key file, the backend, the shared-memory remap) through the agent's environment, which torch
elastic hands down to every worker.

The agent runs in a thread: torch elastic installs its signal handlers only from the main thread, which stays
the node's own (the kernel link). Restarts are the kernel's (``--max-restarts``: a fresh pool re-forms the
group) or, for a detached run, nbtrain's agent's (:mod:`.detached_restarts`: a new torch elastic agent per
attempt), so torch elastic's own ``max_restarts`` is 0.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from ..wire import nodes as N
from .local_ranks import LocalRanks, _Rank

MONITOR_INTERVAL_S = 0.1


def rank_env(start: N.StartRanks, ranks: LocalRanks, loopback: bool) -> dict[str, str]:
    """nbtrain's variables for this node's ranks, on top of what torch elastic sets for each."""
    from ..wire.runfolder import RESULTS_FOLDER_ENV, reserved_path
    from ..wire.shm import owner_prefix

    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        "NBTRAIN_SOCKET": ranks.address, "NBTRAIN_KEY_FILE": ranks.key_file, "NBTRAIN_BACKEND": start.backend,
        "NBTRAIN_DEVICE_TYPE": start.device_type, "NBTRAIN_TIMEOUT": str(start.timeout_s),
        "NBTRAIN_KERNEL_PID": str(os.getpid()),  # the shared-memory files on this node are the agent's
        "NBTRAIN_STACK_FILE": os.path.join(ranks.dir, "stack-{local_rank}.txt"),
        "NBTRAIN_SHM_REMAP": f"{owner_prefix(start.kernel_pid)}={ranks.shm_prefix}",
        "MPLBACKEND": "module://nbtrain.rank.figures", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // start.nproc_per_node))),
    }
    if start.detached_run:  # rank 0 writes the results' tensors there too (nbtrain.rank.results_file)
        env[RESULTS_FOLDER_ENV] = reserved_path(start.detached_run)
    if loopback:  # emulated nodes on one machine: keep gloo's and NCCL's sockets on loopback too
        env.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    env.update(dict(start.env))  # the cell's --env wins (NCCL_SOCKET_IFNAME=ib0, NCCL_IB_HCA=…)
    return env


class _ChildThreadNotice(logging.Filter):
    """Torch elastic warns, on every start, that it cannot install signal handlers from a thread: here that is by
    design (the node's own lifeline ends the ranks), so the node's console is spared the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "running on a child thread" not in record.getMessage()


_NOTICE = _ChildThreadNotice()  # one instance: addFilter() adds it once however many pools start

_own_environ: dict[str, str] = {}  # the agent's environment before any group's variables (taken at the first)


def _environ_for(start: N.StartRanks, ranks: LocalRanks, loopback: bool) -> None:
    """``os.environ`` as this group's ranks inherit it — torch elastic gives each worker ``os.environ`` and its own
    variables: the agent's own environment and this group's, and nothing an earlier group set (its ``--env``, its
    ``--ft`` group size: a rank that kept ``NBTRAIN_FT`` would form a process group of its own)."""
    if not _own_environ:
        _own_environ.update(os.environ)
    os.environ.clear()
    os.environ.update(_own_environ)
    os.environ.update(rank_env(start, ranks, loopback))


def run_ranks(start: N.StartRanks, ranks: LocalRanks, local_addr: str | None, send) -> threading.Thread:
    """Start torch elastic's agent for ``start`` in a thread; it reports through ``ranks`` and ``send``."""
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_NOTICE)
    loopback = start.rdzv_endpoint.startswith(("127.", "localhost", "[::1]"))
    _environ_for(start, ranks, loopback)
    thread = threading.Thread(target=_run, args=(start, ranks, local_addr, send), name="nbtrain-elastic-agent",
                              daemon=True)
    thread.start()
    return thread


def _run(start: N.StartRanks, ranks: LocalRanks, local_addr: str | None, send) -> None:
    try:
        agent = _make_agent(start, ranks, local_addr)
        agent.run()  # returns after its exit barrier and rendezvous shutdown, which use the kernel's store
    except BaseException as exc:  # rendezvous failed or timed out, a bad endpoint: the kernel reports it
        if not ranks.running():
            send(N.NodeError(f"{type(exc).__name__}: {exc}"))
    finally:
        ranks.idle.wait(10)
        send(N.RanksStopped(start.run_id))  # only now may the kernel drop the store


def _make_agent(start: N.StartRanks, ranks: LocalRanks, local_addr: str | None):
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    from .rendezvous import KernelRendezvous

    class Agent(LocalElasticAgent):
        def _start_workers(self, worker_group):  # torch elastic's own, then tell the relay which ranks run here
            pids = super()._start_workers(worker_group)
            context = self._pcontext
            assert context is not None  # set by the call above
            handlers = getattr(context, "subprocess_handlers", {})
            ranks.started([_Rank(w.global_rank, w.local_rank, pids[w.local_rank], handlers[w.local_rank].proc,
                                 {"stdout": context.stdouts[w.local_rank], "stderr": context.stderrs[w.local_rank]},
                                 error_file=context.error_files.get(w.local_rank))
                           for w in worker_group.workers])
            return pids

    spec = WorkerSpec(role="default", local_world_size=start.nproc_per_node, entrypoint=sys.executable,
                      args=("-u", "-m", "nbtrain.rank"), rdzv_handler=KernelRendezvous(start),
                      max_restarts=0, monitor_interval=MONITOR_INTERVAL_S, local_addr=local_addr)
    logs = DefaultLogsSpecs(log_dir=os.path.join(ranks.dir, "logs"), redirects=Std.ALL, tee=Std.NONE)
    return Agent(spec=spec, logs_specs=logs, start_method="spawn")
