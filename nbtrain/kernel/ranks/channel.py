"""The channel: one authenticated connection from the kernel to each rank, and the messages on it.

* **listener** — :class:`~nbtrain.wire.ranksocket.RankListener` (the node agent's too): a UNIX socket in the pool's
  private directory (mode 0700), with a random 32-byte key (:attr:`Channel.key`, given to each rank on its stdin
  by the process group, never in its environment or command line);
* **authentication** — a peer that does not know the key fails the HMAC challenge inside ``accept()``,
  before anything is unpickled; an authenticated peer must then say :class:`~.protocol.Hello` with the
  pid of a rank the kernel started (:func:`admit`), or it is dropped. Connections are accepted by a
  thread, since ``accept()`` blocks; the listener closes as soon as every rank is in, so nothing can
  connect afterwards — unless the pool replaces ranks (``--ft``): it then stays open for the key's holders, and
  admits only the pid of a replacement the kernel started (:meth:`Channel.expect`);
* **framing** — each message is one pickled object in one length-prefixed frame of
  :mod:`multiprocessing.connection` (:func:`send` / :func:`receive`); a connection that ends is dropped,
  and the rank's exit is the process group's to report.

The channel knows ranks only by number and pid. A multi-machine launcher replaces the process group
(:mod:`.procs`), not this: its ranks would reach a TCP listener with the same key and messages.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
from multiprocessing.connection import Connection

from ...wire.ranksocket import RankListener
from ...wire import protocol as P
from .rank_events import Message


def send(conn: Connection, message) -> None:
    """One message, one frame."""
    conn.send(message)


def receive(conn: Connection, rank: int) -> Message | None:
    """The next message on ``conn`` as an event, or None if the connection has ended."""
    try:
        return Message(rank, conn.recv())
    except (EOFError, OSError):
        return None


def admit(hello, pending: dict[int, int]) -> int | None:
    """The rank an authenticated peer is, if its first message is a Hello from a rank still expected.

    ``pending`` maps the pid of each rank not yet connected to its rank; an admitted rank leaves it.
    """
    if not isinstance(hello, P.Hello):
        return None
    return pending.pop(hello.pid, None)


class Channel:
    """The kernel's end: a listener until every rank is in (:class:`~nbtrain.wire.ranksocket.RankListener`), then one
    connection per rank."""

    def __init__(self, directory: str) -> None:
        self.key = secrets.token_bytes(32)
        self.address = os.path.join(directory, "kernel.sock")
        self._listener: RankListener | None = None
        self._accepted: queue.SimpleQueue = queue.SimpleQueue()  # (rank, connection) from the accept thread
        self._conns: dict[int, Connection] = {}
        self._nranks = 0
        self._pending: dict[int, int] = {}  # pid -> rank of the processes still to connect (the accept thread's)
        self._replaceable = False  # keep listening once every rank is in (--ft replaces ranks)
        # the accept thread writes a byte here for each rank it admits: the run's loop waits on it with the
        # rest, so the job leaves the moment the last rank is in rather than at the loop's next poll
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

    def listen(self, backlog: int) -> None:
        self._listener = RankListener(self.address, backlog, self.key)

    def accept(self, pids: list[int]) -> None:
        """Accept the ranks with these pids (rank = index), in a thread, as they connect."""
        self._nranks = len(pids)
        pending = self._pending = {pid: rank for rank, pid in enumerate(pids)}

        def admitted(hello: P.Hello, conn: Connection) -> bool:
            rank = admit(hello, pending)
            if rank is not None:
                self._accepted.put((rank, conn))
                with contextlib.suppress(OSError):  # closed: the pool is going; full: a wake is already due
                    os.write(self._wake_write, b"\0")
            return rank is not None

        if self._listener is not None:
            self._listener.serve(admitted, more=lambda: bool(pending) or self._replaceable)

    def keep_listening(self) -> None:
        """Before :meth:`accept`: the listener stays open for replacements (``--ft``, :meth:`expect`)."""
        self._replaceable = True

    def expect(self, rank: int, pid: int) -> None:
        """Admit the process ``pid`` as ``rank`` (a replacement for a rank that has exited) when it connects."""
        assert self._replaceable, "a channel admits replacements only when told to keep listening"
        self._collect()
        gone = self._conns.pop(rank, None)
        if gone is not None:
            gone.close()
        self._pending[pid] = rank

    def _collect(self) -> None:
        while not self._accepted.empty():
            rank, conn = self._accepted.get()
            self._conns[rank] = conn

    def admissions(self) -> int | None:
        """While ranks are still connecting: a descriptor that becomes readable when one is admitted (for
        :func:`multiprocessing.connection.wait`; :meth:`woken` empties it); None once every rank is in."""
        return None if self._wake_read < 0 or self.connected() else self._wake_read  # closed: none

    def woken(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._wake_read, 4096)

    def connected(self) -> bool:
        """Whether every rank has connected (and none has hung up since)."""
        self._collect()
        return len(self._conns) == self._nranks

    def waitables(self) -> dict:
        """The open connections, for :func:`multiprocessing.connection.wait`: connection -> rank."""
        self._collect()
        return {conn: rank for rank, conn in self._conns.items()}

    def receive(self, rank: int) -> list[Message]:
        message = receive(self._conns[rank], rank)
        if message is None:
            self._conns.pop(rank).close()
            return []
        return [message]

    def send_all(self, message) -> None:
        for conn in list(self._conns.values()):
            # a rank that died since it said Hello: its exit reaches the run as an event of the process group
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                send(conn, message)

    def send_to(self, rank: int, message) -> None:
        """One rank's message (an answer to its prompt); a rank gone since is the process group's to report."""
        self._collect()
        conn = self._conns.get(rank)
        if conn is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                send(conn, message)

    def close(self) -> None:
        """Close the connections and the listener (waking the accept thread)."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for end in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(end)
        self._wake_read = self._wake_write = -1
