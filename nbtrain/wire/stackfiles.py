"""Stack files: a rank's Python stacks on request, read without its cooperation (shared by kernel and node agents).

Each rank registers :mod:`faulthandler` on SIGUSR1 with a private file (``NBTRAIN_STACK_FILE``); SIGUSR1 makes it
append every thread's stack there, from C, so it works while the rank is blocked in a collective.
:func:`request_stacks` sends the signals and reads what each file grew by. It needs only pids and file names, so
the kernel uses it for its local ranks (:mod:`nbtrain.kernel.diagnostics.stacks`) and a node agent for the ranks on its
machine (:mod:`nbtrain.node.local_ranks`), which it then sends to the kernel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def request_stacks(targets: dict[int, tuple[int, str]], wait: float) -> dict[int, str]:
    """Stacks of ranks given as rank -> (pid, stack file), collected within ``wait`` seconds.

    Each file is appended to by every dump, so only what grew after the signal is this dump.
    """
    sizes = {rank: _size(path) for rank, (_, path) in targets.items()}
    for pid, _ in targets.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait
    dumps: dict[int, str] = {}
    while time.monotonic() < deadline and len(dumps) < len(targets):
        time.sleep(0.05)
        for rank, (_, path) in targets.items():
            size = _size(path)
            if rank not in dumps and size > sizes[rank] and size == _settled(path, size):
                with open(path) as fh:
                    fh.seek(sizes[rank])
                    dumps[rank] = fh.read()
    return dumps


def _settled(path: str, size: int) -> int:
    time.sleep(0.02)  # faulthandler writes a dump in a burst; a stable size means it is complete
    return _size(path)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
