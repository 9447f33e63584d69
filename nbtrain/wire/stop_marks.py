"""The kernel's own SIGTERM, told apart from a preemption notice without waiting on a thread.

A SIGTERM from outside while a cell runs is a preemption notice (:mod:`nbtrain.rank.stop`); the kernel's (or a
node agent's) own SIGTERM ends the rank at once. The :class:`~nbtrain.wire.protocol.Stopping` message says which,
but a rank reads it on a thread that a loaded machine may not run for seconds. So before its SIGTERM the kernel
also leaves one empty file per rank process, named by its pid, in the pool's private directory (0700: no other
user can plant one there), and the rank's handler looks for its own file first, synchronously.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable


def mark_path(workdir: str, pid: int) -> str:
    return os.path.join(workdir, f"stopping-{pid}")


def announce(workdir: str, pids: Iterable[int]) -> list[str]:
    """Mark each of ``pids`` as stopped by its own kernel (call before the SIGTERM); returns the files made."""
    made = []
    for pid in pids:
        path = mark_path(workdir, pid)
        with contextlib.suppress(OSError):  # a directory already removed: nothing left to stop there
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            made.append(path)
    return made


def announced(workdir: str) -> bool:
    """In a rank: whether the kernel marked this process as stopped by it."""
    return os.path.exists(mark_path(workdir, os.getpid()))
