"""Where a job runs on a rank: the ``sys.path`` rule both sides apply.

Every :class:`~nbtrain.wire.protocol.Job` carries the notebook's current directory and the kernel's
``sys.path``. A rank builds its own ``sys.path`` from them with :func:`rank_sys_path` before it unpickles
anything (:mod:`nbtrain.rank.modules`); the kernel builds the same list to tell whether another file
would now shadow a module the warm ranks imported (:mod:`nbtrain.kernel.request.notebook_modules`). One function, so the
two can never disagree.
"""

from __future__ import annotations

Stamp = tuple  # (module name, absolute path, st_mtime_ns, st_size), as the ranks report their modules


def rank_sys_path(cwd: str, kernel_path: tuple[str, ...], baseline: tuple[str, ...]) -> list[str]:
    """A rank's ``sys.path`` for a job: ``cwd`` first (as ``python -m`` started there), then the kernel's
    entries in the kernel's order — what the notebook imports, the ranks import — then the rank's own rest."""
    return list(dict.fromkeys([cwd, *kernel_path, *baseline]))
