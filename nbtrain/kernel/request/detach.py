"""``--detach`` and ``%distributed_attach`` as the request layer sees them: the pool spec of a run whose ranks run
under an agent of their own (``nodes.detached``), and the config of a cell that follows such a run's record
(``nodes.recorded``). :mod:`.config` calls :func:`detached_spec` while it resolves a cell; the run's entry point
calls :func:`attached`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ...wire.runfolder import RunFolderError, check_run_id, new_run_id
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
    if request.max_restarts:
        raise ConfigError("--max-restarts starts the run again from the kernel, which a detached run must not "
                          "need; it does not go with --detach yet. Leave out one of them (--checkpoint still "
                          "saves, and a new cell with --checkpoint resumes).")
    env = pool.env
    if pool.device_type == "cuda":
        env = (*env, ("CUDA_VISIBLE_DEVICES", ",".join(map(str, pool.gpu_ids))))
    try:
        run_id = check_run_id(request.run_id) if request.run_id else new_run_id()
    except RunFolderError as exc:
        raise ConfigError(f"--run-id: {exc}") from None
    return replace(pool, env=env, nodes=NodesSpec(1, pool.nprocs, "127.0.0.1", detached=run_id))


def attached(config: LaunchConfig, run_id: str) -> LaunchConfig:
    """``%distributed_attach``: the cell's own options, its ranks those of detached run ``run_id``, followed through
    the run's record instead of started (:mod:`nbtrain.kernel.cluster.recorded`)."""
    where = NodesSpec(1, config.pool.nprocs, "127.0.0.1", detached=check_run_id(run_id), recorded=True)
    return replace(config, pool=replace(config.pool, nodes=where), keep_alive_s=0.0, attach=run_id)
