"""Where ranks connect: an authenticated UNIX socket — the one copy the kernel's pool and a node agent use.

A :class:`multiprocessing.connection.Listener` in a private directory (mode 0700) with a random 32-byte key:
a peer that does not know the key fails the HMAC challenge inside ``accept()``, before anything is unpickled;
an authenticated peer's first message must be a :class:`~nbtrain.wire.protocol.Hello` that the owner admits
(``admit(hello, connection)`` returns whether it keeps the connection), or it is dropped. A peer that fails in
any way — a wrong key, an oversized answer to the challenge, a hang-up — costs that connection only: the
accept loop goes on until :meth:`RankListener.close`, or until ``admit`` says no one else is expected.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener

from . import protocol as P

Admit = Callable[[P.Hello, Connection], bool]  # keep this connection? (it then belongs to the caller)


class RankListener:
    """An authenticated UNIX socket at ``address`` and the thread that admits ranks on it."""

    def __init__(self, address: str, backlog: int = 64, key: bytes | None = None) -> None:
        self.address = address
        self.key = key or secrets.token_bytes(32)
        self._listener = Listener(address, family="AF_UNIX", authkey=self.key, backlog=max(8, backlog))
        self._closed = False
        self._thread = threading.Thread()

    def serve(self, admit: Admit, more: Callable[[], bool] = lambda: True, name: str = "nbtrain-accept") -> None:
        """Accept and admit ranks in a thread while ``more()``; then stop listening (nothing may connect after)."""
        self._thread = threading.Thread(target=self._accept_loop, args=(admit, more), name=name, daemon=True)
        self._thread.start()

    def _accept_loop(self, admit: Admit, more: Callable[[], bool]) -> None:
        while more() and not self._closed:
            try:
                conn = self._listener.accept()
                hello = conn.recv()
            except Exception:  # a peer without the key (refused before anything was unpickled), or a close
                if self._closed:
                    return
                continue
            if not isinstance(hello, P.Hello) or not admit(hello, conn):
                conn.close()
        if not self._closed:  # every rank is in
            with contextlib.suppress(OSError):
                self._listener.close()

    def close(self) -> None:
        """Stop listening, waking the thread's blocking ``accept()`` (closing the socket alone does not)."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as poke:
                poke.connect(self.address)
            self._thread.join(1.0)
        with contextlib.suppress(OSError):
            self._listener.close()
