"""The node agent of one ``--detach`` run: started by the kernel on this machine, in a session of its own.

The run's ranks are the agent's children (with ``--nodes``, its nodes': :mod:`nbtrain.node.relay`), not the
kernel's: killing or restarting the kernel leaves them training (the agent records the run and sees it to its end: :mod:`nbtrain.node.detached`). The agent joins a
hub of the run's own on loopback (:class:`~.hub.Hub`, the same TLS link and token as any node, the token on its
stdin), so no other cell's pool is ever given it; its output goes to ``agent.log`` in the run's folder. While the
kernel lives it reaps the agent; after, the agent's parent is init.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

from .hub import Hub

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class DetachedAgent:
    """The agent process of one detached run (see the module docstring)."""

    def __init__(self, hub: Hub, run_folder: str, checkpoint_lock: int | None = None, relay: bool = False) -> None:
        """``checkpoint_lock``: the kernel's locked descriptor on the run's ``--checkpoint`` folder, which the agent
        inherits and keeps open, so the folder stays the run's when the kernel goes. ``relay``: the run's ranks are
        on other nodes, which the agent brings up and drives (``--nodes``: :mod:`nbtrain.node.relay`)."""
        self.log = os.path.join(run_folder, "agent.log")
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        env = dict(os.environ)  # this checkout's nbtrain first, as for the ranks (node.agent.rank_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nbtrain.node", "--join", f"{hub.host}:{hub.port}", "--token", "-",
                 "--address", hub.host, *(["--relay"] if relay else [])], stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=run_folder,
                pass_fds=() if checkpoint_lock is None else (checkpoint_lock,))
        finally:
            os.close(log)
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # an agent that died at once says why in its log
            self.process.stdin.write(hub.valid_token().encode() + b"\n")
            self.process.stdin.close()
        threading.Thread(target=self.process.wait, name="nbtrain-detached-reap", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log, "rb") as fh:
                text = fh.read()[-4096:].decode("utf-8", "replace")
        except OSError as exc:
            return f"cannot be read: {exc}"
        return " / ".join(text.strip().splitlines()[-lines:]) or "empty"
