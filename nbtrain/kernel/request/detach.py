"""``--detach`` and ``%distributed_attach`` as the request layer sees them: the pool spec of a run whose ranks run
under an agent of their own (``nodes.detached``), and the config of a cell that follows such a run's record
(``nodes.recorded``). :mod:`.config` calls :func:`detached_spec` while it resolves a cell; the run's entry point
calls :func:`attached`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ...wire.restart_policy import RestartPolicy
from ...wire.runfolder import RunFolderError, check_run_id, new_run_id
from ...wire.settings import TrainSettings
from ..ranks.spec import NodesSpec, PoolSpec
from .mistakes import ConfigError

if TYPE_CHECKING:  # config imports this module: the types only
    from .config import LaunchConfig, LaunchRequest


def detached_spec(request: LaunchRequest, pool: PoolSpec) -> PoolSpec:
    """``--detach``: the same ranks, under a node agent of their own on this machine (``nodes.detached``), which
    sees the run to its end if the kernel goes; the GPUs chosen reach the ranks as CUDA_VISIBLE_DEVICES."""
    if request.session is not None:
        raise ConfigError("--session keeps variables on the kernel's warm ranks for the session's next cell; a "
                          "--detach run has ranks of its own that end with it. Leave out one of them.")
    spread = _spread(pool.nodes)
    env = pool.env
    if pool.device_type == "cuda" and spread is None:  # on this machine: the GPUs chosen; nodes use their own
        env = (*env, ("CUDA_VISIBLE_DEVICES", ",".join(map(str, pool.gpu_ids))))
    try:
        run_id = check_run_id(request.run_id) if request.run_id else new_run_id()
    except RunFolderError as exc:
        raise ConfigError(f"--run-id: {exc}") from None
    return replace(pool, env=env, nodes=NodesSpec(1, pool.nprocs, "127.0.0.1", detached=run_id, spread=spread))


def _spread(nodes: NodesSpec | None) -> NodesSpec | None:
    """``--detach --nodes N``: the nodes, which the run's agent brings up and drives in the kernel's stead
    (:mod:`nbtrain.node.relay`); checked for what only a kernel can do."""
    if nodes is None:
        return None
    if nodes.min_nodes:
        raise ConfigError(f"--detach with an elastic --nodes {nodes.min_nodes}:{nodes.count}: the run's agent starts "
                          f"its ranks once, on a fixed number of nodes. Give --nodes {nodes.count} (or "
                          f"{nodes.min_nodes}), or leave out --detach.")
    if nodes.preemption_url:
        raise ConfigError("--detach with --preemption-url: a spot reclaim is turned into a checkpoint and a new group "
                          "by the kernel, which a detached run on several machines may no longer have. Leave out "
                          "one of them (--max-restarts with --checkpoint still resumes the run after a lost node).")
    return nodes


def with_training(pool: PoolSpec, train: TrainSettings) -> PoolSpec:
    """What a detached run's agent needs of the training options: its ``--max-restarts``, which it carries out
    (:mod:`nbtrain.node.detached_restarts`), and its ``--checkpoint`` folder, whose lock it holds too."""
    if pool.nodes is None or not pool.nodes.detached:
        return pool
    restarts = RestartPolicy.of(train) if train.max_restarts else None
    return replace(pool, nodes=replace(pool.nodes, restarts=restarts, checkpoint_dir=train.checkpoint_dir or ""))


def followed_run(config: LaunchConfig) -> str:
    """The run id of a detached run this cell starts or attaches to ("" for any other): its restarts are its
    agent's, which a kernel follows through the run's record."""
    nodes = config.pool.nodes
    return nodes.detached if nodes is not None else ""


def attached(config: LaunchConfig, run_id: str, attempt: int = 0) -> LaunchConfig:
    """``%distributed_attach``: the cell's own options, its ranks those of detached run ``run_id`` (from its attempt
    ``attempt``: its agent restarts it with ``--max-restarts``), followed through the run's record instead of
    started (:mod:`nbtrain.kernel.cluster.recorded`)."""
    where = NodesSpec(1, config.pool.nprocs, "127.0.0.1", detached=check_run_id(run_id), recorded=True,
                      attempt=attempt)
    return replace(config, pool=replace(config.pool, nodes=where), keep_alive_s=0.0, attach=run_id)
