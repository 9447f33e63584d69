"""Spare forks: children the zygote forks ahead of time, each of which becomes a rank (or a store host) when asked.

A fork of the zygote costs 10–15 ms (the kernel copies its page tables: torch is mapped), and a cold pool paid one
per rank plus one for its store, one after the other, before its first rank ran. So the zygote forks ahead, while
it idles: :data:`SPARE_RANKS` rank spares and one store spare, each waiting on its end of a socketpair of its own.
A request takes a spare and hands it the request and its descriptors there (:mod:`nbtrain.wire.forking`: JSON and
``SCM_RIGHTS``, as the kernel's requests come); the spare then does what a fresh fork would have done
(:mod:`nbtrain.rank.zygote`). With no spare left, the zygote forks as before.

* **Fresh.** A spare forked before the notebook imported a package the request names lacks it, so when the zygote
  imports something for a request, every spare is let go and the request is forked afresh; so are they when the
  zygote finds it may fork no more (CUDA initialised). Spares come back :data:`REFILL_AFTER_S` after the last
  request, one fork per turn of the zygote's loop, which stays free to answer.
* **Quiet.** An idle spare holds no pipe of the kernel's and no other spare's end (each fork closes those), and
  the zygote does not report its exit: the kernel never heard of it.
* **Gone with the zygote.** A spare's only tie is its socketpair: the zygote's end closing (the zygote let it go,
  or exited with its kernel) ends it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from ..wire import forking

# the ranks of one machine's pool: one per core up to an 8-GPU node's, and at least the 4 CPU ranks a laptop
# runs to try data parallelism (a spare costs about 2 MiB of its own)
SPARE_RANKS = min(8, max(4, os.cpu_count() or 1))
REFILL_AFTER_S = 1.0  # spares are forked again once the zygote has had no request this long: not while a pool starts
KINDS = ("rank", "store")


class Spares:
    """The zygote's idle spares, by kind (see the module docstring); owned by the zygote."""

    def __init__(self, wanted: dict[str, int] | None = None) -> None:
        self._wanted = wanted if wanted is not None else {"rank": SPARE_RANKS, "store": 1}
        self._idle: dict[str, list[tuple[int, socket.socket]]] = {kind: [] for kind in KINDS}
        self._unreported: set[int] = set()  # spares that never got work: their exits are nobody's business
        self._refill_at: float | None = time.monotonic()  # the first spares: as soon as the zygote idles

    def descriptors(self) -> list[int]:
        """The zygote's ends of the idle spares' socketpairs: every new fork closes them."""
        return [sock.fileno() for idle in self._idle.values() for _pid, sock in idle]

    def hand(self, kind: str, request: dict, fds: tuple[int, ...]) -> int | None:
        """Give a spare of ``kind`` the request and its descriptors; its pid, or None when no spare took it."""
        if self._refill_at is not None:  # (None: stopped for good)
            self._refill_at = time.monotonic() + REFILL_AFTER_S
        while self._idle[kind]:
            pid, sock = self._idle[kind].pop()
            try:
                forking.send(sock, request, fds)
            except OSError:  # it died meanwhile: its exit stays unreported, the next one is asked
                continue
            finally:
                sock.close()
            self._unreported.discard(pid)
            return pid
        return None

    def let_go(self) -> None:
        """Every idle spare ends (it reads end-of-file); used when they are no longer what a fork would be."""
        for idle in self._idle.values():
            for _pid, sock in idle:
                sock.close()
            idle.clear()

    def reported(self, pid: int) -> bool:
        """Whether ``pid``'s exit is for the kernel to hear (not a spare's that never got work)."""
        if pid in self._unreported:
            self._unreported.discard(pid)
            return False
        return True

    def refill_in(self) -> float | None:
        """Seconds until a spare is due (0: now), or None when none is missing."""
        if self._refill_at is None or not self._missing():
            return None
        return max(0.0, self._refill_at - time.monotonic())

    def refill_one(self, fork: Callable[[str], tuple[int, socket.socket]]) -> None:
        """Fork one missing spare (``fork(kind)`` returns its pid and the zygote's end)."""
        kind = self._missing()
        if kind:
            pid, sock = fork(kind)
            self._idle[kind].append((pid, sock))
            self._unreported.add(pid)

    def stop(self) -> None:
        """No more spares, ever (the zygote forks no more): the idle ones end."""
        self._refill_at = None
        self.let_go()

    def _missing(self) -> str:
        return next((kind for kind in KINDS if len(self._idle[kind]) < self._wanted[kind]), "")
