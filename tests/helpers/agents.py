"""A real node agent (``python -m nbtrain.node``) that tries to join a kernel that is not there: what ``/proc`` shows
for a detached run's agent, without a run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from nbtrain.wire.link import JoinToken


def start_waiting_agent() -> subprocess.Popen:
    """The agent keeps trying to join for a minute (its --start-timeout)."""
    token = JoinToken("127.0.0.1", 1, "pool", "00" * 32, "00" * 32, time.time() + 600).encode()
    agent = subprocess.Popen([sys.executable, "-m", "nbtrain.node", "--join", "127.0.0.1:1", "--token", "-",
                              "--start-timeout", "60"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert agent.stdin is not None
    agent.stdin.write(token + "\n")
    agent.stdin.flush()
    return agent


@contextlib.contextmanager
def waiting_agent() -> Iterator[subprocess.Popen]:
    agent = start_waiting_agent()
    try:
        yield agent
    finally:
        agent.kill()
        agent.wait()
