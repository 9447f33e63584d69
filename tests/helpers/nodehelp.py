"""Node agents started as a person would start them: the join command the notebook printed, run as it is."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from helpers import tiers
from nbtrain.kernel.cluster import Cluster
from nbtrain.kernel.lifecycle.pools import PoolManager


class Boom:
    """Unpickling this creates a folder: proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def until(predicate, timeout: float, what: str):
    """``predicate()``'s first true value within ``timeout`` seconds; AssertionError naming ``what`` if none."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


JOIN = re.compile(r"python -m nbtrain\.node --join \S+ --token-file \S+")


def join_command(text: str) -> str:
    """The join command in what a cell printed (it names the token's 0600 file, never the token)."""
    found = JOIN.search(text)
    assert found, text
    return found.group(0)


def start_agent(command: str, address: str, prefix=()) -> subprocess.Popen:
    """Run ``command`` (``python -m nbtrain.node --join … --token-file …``) from ``address``; ``prefix`` runs it
    through another command (``ip netns exec NAME``, which execs it: the pid is the agent's)."""
    tiers.starts("a node agent")
    args = command.split()[1:]
    return subprocess.Popen([*prefix, sys.executable, *args, "--address", address],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Nodes:
    """In this process: a kernel-side cluster (hub on 127.0.0.1) and node agents started from its join command."""

    def __init__(self) -> None:
        self.cluster = Cluster()
        self.hub = self.cluster.hub("127.0.0.1")
        self.manager = PoolManager(self.cluster.make_pool)
        self.agents: list[subprocess.Popen] = []
        self._consoles = tempfile.mkdtemp(prefix="nbtrain-test-consoles-")

    def start(self, address: str, env: dict | None = None) -> subprocess.Popen:
        """An agent joining from ``address``; ``env``: variables of its own (NBTRAIN_PREEMPTION_URL, …)."""
        tiers.starts("a node agent")
        with open(os.path.join(self._consoles, address), "wb") as console:  # the agent's terminal
            agent = subprocess.Popen([sys.executable, *self.hub.join_command().split()[1:], "--address", address],
                                     stdout=console, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.agents.append(agent)
        return agent

    def consoles(self) -> dict[str, str]:
        """What each agent printed on its terminal so far, by address."""
        return {name: open(os.path.join(self._consoles, name), errors="replace").read()
                for name in os.listdir(self._consoles)}

    def wait_joined(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while len(self.hub.live_nodes()) < count:
            assert time.monotonic() < deadline, f"{count} idle nodes never joined"
            time.sleep(0.05)

    def close(self) -> None:
        self.manager.shutdown()
        self.cluster.close()
        for agent in self.agents:
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
        shutil.rmtree(self._consoles, ignore_errors=True)
