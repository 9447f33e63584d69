"""``--ft``: which runs may be fault tolerant, checked before any process starts.

Under ``--ft`` the ranks form torchft replica groups (:mod:`nbtrain.rank.train.ft_cell`): on one machine one per rank
or ``replicas=R``; with ``--nodes``, one per node. What it does not go with yet is refused here, with what to do
instead. The training option it does not go with
(``--shard full``) is refused with the others (:mod:`nbtrain.wire.settings`);
``--shard hybrid`` needs groups of 2 ranks or more, checked here.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

from ..ranks.spec import PoolSpec
from .mistakes import ConfigError


def fault_tolerant(request, pool: PoolSpec, replicas: int) -> PoolSpec:
    """The pool of a ``--ft`` run (``request``: the cell's :class:`~.config.LaunchRequest`; ``replicas``: R of
    ``--ft replicas=R``, 0 for a group per rank), or a ConfigError."""
    ft_pool = _on_nodes(pool, replicas) if pool.nodes is not None else _on_one_machine(request, pool, replicas)
    if request.shard and ft_pool.ft_group_size < 2:
        raise ConfigError("--shard hybrid --ft shards the model within each replica group, which holds one rank "
                          "here: give the groups 2 ranks or more (--ft replicas=R on one machine, --nproc-per-node 2 "
                          "with --nodes), or leave --shard out.")
    return ft_pool


def _on_one_machine(request, pool: PoolSpec, replicas: int) -> PoolSpec:
    if request.session:
        raise ConfigError("--ft replaces a rank that dies with a new one, which would not have the session's "
                          "variables; use one of --session and --ft.")
    if pool.nprocs < 2:
        raise ConfigError("--ft keeps the other replica groups stepping when one dies, so it needs 2 ranks or more, "
                          "such as %%distributed 3 --ft.")
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError("--ft needs torchft, which is not installed in this kernel's environment: "
                          "pip install 'nbtrain[ft]' (then restart the kernel).")
    groups = replicas or pool.nprocs
    if replicas and pool.nprocs % replicas:
        raise ConfigError(f"--ft replicas={replicas} splits the ranks into {replicas} equal replica groups, but there "
                          f"are {pool.nprocs}: give a number of ranks that {replicas} divides, such as "
                          f"%%distributed {2 * replicas} --ft replicas={replicas}.")
    return replace(pool, ft_group_size=pool.nprocs // groups)


def _on_nodes(pool: PoolSpec, replicas: int) -> PoolSpec:
    """``--ft --nodes N``: each node is a replica group of its ``--nproc-per-node`` ranks."""
    assert pool.nodes is not None
    if pool.nodes.detached:
        raise ConfigError("--ft does not go with --detach yet: a detached run's agent restarts the whole run, and "
                          "does not replace one replica group while the others keep stepping. Run the cell with "
                          "--ft in the notebook, or detach it with --max-restarts N --checkpoint DIR (a lost rank "
                          "restarts the run from its last checkpoint).")
    if pool.nodes.min_nodes:
        raise ConfigError("--ft with --nodes takes a fixed number of nodes (--nodes 3), not an elastic --nodes "
                          "MIN:MAX yet: under --ft a lost node's place is taken by the next "
                          "node that joins, while the others keep stepping.")
    if replicas:
        raise ConfigError(f"with --nodes each node is one replica group; leave replicas={replicas} out of --ft.")
    return replace(pool, ft_group_size=pool.nodes.nproc_per_node)
