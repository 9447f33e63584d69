"""The rendezvous store of a pool, hosted by a process of its own — never by the kernel.

The c10d ``TCPStore`` the ranks bootstrap their process group from has no authentication (as under torchrun)
and keeps every value it is given: hosted in the kernel, a flood of writes grew the notebook's kernel until it
could be killed, the notebook's variables with it. :class:`StoreHost` binds the listening socket here (on
``host`` only, a port the OS picks — given a host, ``TCPStore`` would still listen on every interface) and hands
it to a small process that hosts the store with a memory limit (:mod:`nbtrain.rank.store_server`): forked by the
kernel's zygote where it can (milliseconds; torch is imported there), else started as
``python -m nbtrain.rank.store_server``. A flood can end that process, and so break the run that uses it; the
kernel does not grow.

The process lives as long as the kernel's end of its lifeline pipe: :meth:`StoreHost.close` (a pool's teardown)
or the kernel's death ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from .interpreter import interpreter_env
from .zygote_handle import ForkRefused, ZygoteHandle

CLOSE_WAIT_S = 2.0  # a store process ends at once when its lifeline closes; then it is killed


class StoreHost:
    """One pool's store, in its own process (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1", zygote: ZygoteHandle | None = None) -> None:
        listening = socket.create_server((host, 0), backlog=128)
        self.port: int = listening.getsockname()[1]
        lifeline, self._lifeline = os.pipe()
        self._closing = threading.Lock()
        try:
            self._zygote, self._popen = zygote, None
            self._code: int | None = None  # its exit code, once it ended
            self.pid = self._fork(zygote, listening.fileno(), lifeline)
            if self.pid is None:
                self._popen = self._spawn(listening.fileno(), lifeline)
                self.pid = self._popen.pid
        finally:
            listening.close()  # the store process holds the socket now
            os.close(lifeline)

    @staticmethod
    def _fork(zygote: ZygoteHandle | None, listening: int, lifeline: int) -> int | None:
        """The store process forked by the zygote, or None where it cannot fork (the process is spawned)."""
        if zygote is None:
            return None
        try:
            return zygote.fork_store(listening, lifeline)
        except ForkRefused:
            return None

    @staticmethod
    def _spawn(listening: int, lifeline: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "nbtrain.rank.store_server", str(listening), str(lifeline)],
                                pass_fds=(listening, lifeline), stdin=subprocess.DEVNULL, start_new_session=True,
                                env=interpreter_env(dict(os.environ)))

    def alive(self) -> bool:
        return self._exit_code() is None

    def close(self) -> None:
        """End the store process: its lifeline closes (then, if it lingers, SIGKILL)."""
        with self._closing:  # a teardown may come from two threads (the stop button's and the run's)
            lifeline, self._lifeline = self._lifeline, -1
        if lifeline < 0:
            return
        os.close(lifeline)
        assert self.pid is not None
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._exit_code() is None:
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    def _exit_code(self) -> int | None:
        if self._code is None and self._popen is not None:
            self._code = self._popen.poll()
        elif self._code is None:
            assert self._zygote is not None and self.pid is not None
            code = self._zygote.exit_code(self.pid)  # the zygote reports an exit once: keep the first one got
            self._code = code if self._code is None else self._code
        return self._code
