"""A detached run's c10d store, hosted on the agent's side: it outlives the kernel that asked for the run.

A kernel's pool store (``kernel/ranks/storehost.py``) lives as long as the kernel's end of a lifeline pipe, so a
kernel killed mid-run takes the ranks' store with it. For a run that must outlive its kernel the agent hosts the
store instead: it binds the listening socket (``host`` only, a port the OS picks) and hands it to the same
memory-limited store process the kernel uses (``python -m nbtrain.rank.store_server``), keeping the lifeline's
write end itself. The agent reports :attr:`AgentStore.port` to the kernel; nothing read from the store is trusted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

CLOSE_WAIT_S = 2.0  # the store process ends at once when its lifeline closes; then it is killed


class AgentStore:
    """The store process of one detached run, tied to the agent's lifeline (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        listening = socket.create_server((host, 0), backlog=128)
        self.port: int = listening.getsockname()[1]
        lifeline, self._lifeline = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "nbtrain.rank.store_server", str(listening.fileno()), str(lifeline)],
                pass_fds=(listening.fileno(), lifeline), stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            listening.close()  # the store process holds the socket now
            os.close(lifeline)

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """End the store process: its lifeline closes (then, if it lingers, SIGKILL)."""
        lifeline, self._lifeline = self._lifeline, -1
        if lifeline < 0:
            return
        os.close(lifeline)
        try:
            self._process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait()
