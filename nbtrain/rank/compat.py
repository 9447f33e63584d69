"""Let a pasted torchrun script run unchanged inside a cell whose process group already exists.

A script written for torchrun calls ``dist.init_process_group(...)`` at its start and often
``dist.destroy_process_group()`` at its end. In a rank the default group is already up (and kept warm for
the next cell), so while a cell runs:

* ``init_process_group`` with the pool's backend (or none named) returns at once — the group the script
  asked for is there; with another backend it raises a clear error naming the option to use;
* ``destroy_process_group()`` of the default group waits at a barrier and keeps the group for the next cell.

Outside a cell nothing is patched.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any


class BackendMismatchError(RuntimeError):
    pass


@contextlib.contextmanager
def torchrun_script_support():
    import torch.distributed as dist

    original_init, original_destroy = dist.init_process_group, dist.destroy_process_group
    pool_backend = os.environ["NBTRAIN_BACKEND"]

    def init_process_group(backend=None, *args, **kwargs):
        if not dist.is_initialized():
            return original_init(backend, *args, **kwargs)
        wanted = str(backend).lower() if backend is not None else None
        if wanted is not None and pool_backend not in wanted.replace(":", ",").split(","):
            raise BackendMismatchError(
                f"this cell asks for the '{backend}' backend, but its ranks run '{pool_backend}'. "
                f"Run the cell with --backend {wanted.split(':')[-1]} (or drop the backend argument)."
            )
        return None

    def destroy_process_group(group=None):
        if group is None or group is dist.group.WORLD:
            dist.barrier()
            return None
        return original_destroy(group)

    # `from torch.distributed.distributed_c10d import ...` too; Any: mypy does not let a module's functions be replaced
    modules: tuple[Any, ...] = (dist, dist.distributed_c10d)
    for module in modules:
        module.init_process_group, module.destroy_process_group = init_process_group, destroy_process_group
    try:
        yield
    finally:
        for module in modules:
            module.init_process_group, module.destroy_process_group = original_init, original_destroy


def shutdown_process_group() -> None:
    """Meet at a barrier before destroying the group: gloo can abort at exit without one."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
