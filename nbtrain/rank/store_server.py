"""A pool's c10d store in a process of its own, with a memory limit: what a flood of writes can take down.

The store has no authentication (as under torchrun): whoever reaches its port may write keys, and a
``TCPStore`` keeps every value it is given. Hosted in the notebook's kernel, 150 writes of 8 MB grew the kernel
by 1.2 GB, and enough of them would get the kernel — and the notebook's variables — killed. So the kernel hosts
no store: each pool's store lives in this small process, forked from the kernel's zygote (torch is imported
there: a fork costs milliseconds) or, where the zygote cannot fork, started as
``python -m nbtrain.rank.store_server LISTEN_FD LIFELINE_FD``.

* The kernel binds the listening socket itself (loopback, or ``--rdzv-host``) and passes it down
  (``master_listen_fd``): the store listens nowhere else, on the port the kernel already told the ranks.
* :func:`serve` caps the process's data (``RLIMIT_DATA``: its heap and anonymous mappings) at what it holds
  when it starts plus :data:`MEMORY_BUDGET` — far above what a process group's bootstrap writes (a few short
  keys per rank). Past it an allocation fails, and the store process ends; the run that used it may fail, the
  kernel does not grow.
* It lives as long as the kernel's end of a pipe (the lifeline): the pool's teardown closes it, and so does the
  kernel's death.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys

MEMORY_BUDGET = 256 * 2**20  # above the process's own data when it starts


def serve(listen_fd: int, lifeline_fd: int, budget: int = MEMORY_BUDGET) -> None:
    """Host a ``TCPStore`` on the socket ``listen_fd`` until ``lifeline_fd`` reaches end-of-file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook's stop button is for the ranks
    import torch.distributed as dist

    listening = socket.socket(fileno=listen_fd)
    host, port = listening.getsockname()[:2]
    _limit_data(budget)
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                          master_listen_fd=listening.detach())  # the store takes the descriptor over
    try:
        while os.read(lifeline_fd, 4096):
            pass
    except OSError:
        pass
    del store


def _limit_data(budget: int) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _data_size() + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _data_size() -> int:
    """This process's data now (``VmData``: heap and private anonymous mappings), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str]) -> None:
    serve(int(argv[0]), int(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
