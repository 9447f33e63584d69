"""What a group of ranks is made of: the :class:`PoolSpec` every rank group is built from (torch elastic's ``WorkerSpec``),
with a :class:`NodesSpec` for a group on several machines.

Two runs whose specs are equal share the same warm ranks (:meth:`~nbtrain.kernel.ranks.rankgroup.RankGroup.serves`).
The request layer (:func:`nbtrain.kernel.request.config.resolve`) builds it from the cell's options, checked;
the groups (:mod:`.pool`, :mod:`nbtrain.kernel.cluster.group`) and the pool manager read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...wire.restart_policy import RestartPolicy


@dataclass(frozen=True)
class NodesSpec:
    """Where a group on several machines runs and how its node agents come (``--nodes``, ``--hosts``, ``--slurm``):
    what only a :class:`~nbtrain.kernel.cluster.group.NodePool` reads."""

    count: int  # nodes (elastic --nodes MIN:MAX: MAX)
    nproc_per_node: int  # ranks on each node (nprocs = count × nproc_per_node)
    rdzv_host: str  # where the kernel listens for them and hosts the c10d store
    hosts: tuple[str, ...] = ()  # --hosts: the kernel starts the node agents there over ssh (nbtrain.kernel.cluster.ssh)
    ssh_options: tuple[str, ...] = ()
    remote_python: str = ""
    slurm: tuple[str, ...] | None = None  # --slurm: the agents run as a Slurm job, these sbatch/srun words (nbtrain.kernel.cluster.slurm)
    min_nodes: int = 0  # elastic --nodes MIN:MAX: MIN; 0: exactly `count`
    preemption_url: str = ""  # --preemption-url: what the agents nbtrain starts poll for a spot reclaim
    last_call_s: float = field(default=0.0, compare=False)  # elastic: the wait for more nodes once MIN joined
    detached: str = ""  # --detach: the run id of a run on this machine under an agent of its own (node.detached)
    recorded: bool = False  # %distributed_attach: follow that run's record (kernel.cluster.recorded); start nothing
    attempt: int = 0  # recorded: which attempt of the run to follow (its agent restarts it: --max-restarts)
    restarts: RestartPolicy | None = None  # detached: the --max-restarts its agent carries out (node.detached_restarts)
    checkpoint_dir: str = ""  # detached: the --checkpoint folder, whose lock its agent holds too (lifecycle.checkpoint_lock)
    spread: NodesSpec | None = None  # detached on several machines: their nodes, which the run's agent brings (node.relay)


@dataclass(frozen=True)
class PoolSpec:
    """What two runs must share to reuse the same warm processes; ``nodes`` is set for a group on several machines."""

    nprocs: int
    backend: str
    device_type: str  # "cuda" | "cpu"
    gpu_ids: tuple[int, ...]  # physical NVML indices made visible to the ranks (this machine's; none with nodes)
    timeout_s: float
    env: tuple[tuple[str, str], ...] = ()
    nodes: NodesSpec | None = None  # the ranks run on joined nodes (nbtrain.kernel.cluster)
    gpu_count: int = 0  # --gpus auto: lease this many free GPUs when the pool starts (gpu_ids then names them)
    ft_group_size: int = 0  # --ft: ranks per replica group (each group's default process group is its ranks); 0: no --ft

    @property
    def ft(self) -> bool:
        return self.ft_group_size > 0

    def rank_devices(self) -> list[str]:
        if self.device_type == "cpu":
            return ["cpu"] * self.nprocs
        return [f"cuda:{r % len(self.gpu_ids)}" for r in range(self.nprocs)]
