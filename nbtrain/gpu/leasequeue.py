"""The first-come queue of runs waiting for GPUs on a shared server: one ticket file per waiting run.

A ticket is ``wait-<uid>-<random>.ticket`` in the lease directory (:mod:`.leases`), made and ``flock``-ed by the
waiting kernel for as long as it waits: leaving the queue is closing it, and a SIGKILLed kernel leaves with its
lock. As for leases, a ticket counts only while a process of the file's owner holds that lock (``/proc/locks``).
A ticket's place is its inode's change time, which no user can set back, and its owner from ``stat``; the order
is :func:`~nbtrain.gpu.leasechoice.queue_order`'s, so a user's second waiting run comes after every other
user's first.
"""

from __future__ import annotations

import os
import secrets
import stat

from nbtrain.gpu import leases
from nbtrain.gpu.leasechoice import Ticket, queue_order


class WaitTicket:
    """This run's place in the queue until :meth:`leave` (or the process's exit); a context manager."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        leases.sweep_own(directory)
        self.path, fd = leases.make_locked(
            lambda: os.path.join(directory, f"wait-{os.geteuid()}-{secrets.token_hex(8)}.ticket"), b"")
        self._fd: int | None = fd
        self.name = os.path.basename(self.path)

    def ahead(self) -> list[Ticket]:
        """The waiting runs that come before this one (none: its turn)."""
        order = queue_order(waiting(self.directory))
        names = [ticket.name for ticket in order]
        return order[:names.index(self.name)] if self.name in names else []

    def leave(self) -> None:
        if self._fd is not None:
            leases.unlink_quietly(self.path)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WaitTicket:
        return self

    def __exit__(self, *exc) -> None:
        self.leave()


def waiting(directory: str) -> list[Ticket]:
    """The tickets held now: each one's owner and place."""
    holders = leases.lock_holders()
    found = []
    for name in os.listdir(directory):
        match = leases.TICKET_NAME.match(name)
        if match is None:
            continue
        try:
            info = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:
            continue  # left the queue while we looked
        pid = holders.get((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino))
        if stat.S_ISREG(info.st_mode) and info.st_uid == int(match.group(1)) and pid is not None \
                and leases.uid_of(pid) == info.st_uid:
            found.append(Ticket(uid=info.st_uid, since=info.st_ctime, name=name))
    return found
