"""``--ft``: which runs may be fault tolerant, checked before any process starts.

Under ``--ft`` each rank of this machine is a torchft replica group of its own (:mod:`nbtrain.rank.train.ft_cell`);
what it does not go with yet is refused here, with what to do instead. The training options it does not go with
(``--shard``, ``--grad-accum``, ``--checkpoint``) are refused with the others (:mod:`nbtrain.wire.settings`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

from ..ranks.spec import PoolSpec
from .mistakes import ConfigError


def fault_tolerant(request, pool: PoolSpec, replicas: int) -> PoolSpec:
    """The pool of a ``--ft`` run (``request``: the cell's :class:`~.config.LaunchRequest`; ``replicas``: R of
    ``--ft replicas=R``, 0 for a group per rank), or a ConfigError."""
    if pool.nodes is not None:
        raise ConfigError("--ft runs on one machine for now (each rank a replica group); it does not go with --nodes "
                          "or --detach yet. Leave --ft out to use --nodes MIN:MAX --max-restarts K with --checkpoint.")
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
