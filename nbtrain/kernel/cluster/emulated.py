"""Emulated nodes: node agents started by the kernel on this machine, to try ``--nodes`` without a cluster.

``%distributed_nodes --rdzv-host 127.0.0.1 --emulate 2`` runs the join command once per node, as
``python -m nbtrain.node --join … --token - --address 127.0.0.K`` (K = 2, 3, …), the token on the agent's
stdin (never in its command line, which every local user can read): distinct loopback addresses, so
the nodes are told apart as real machines would be. They are ordinary agents — the same TLS link, token and
heartbeats — started as subprocesses instead of pasted into Slurm or a shell, which is how the multinode
notebook runs on a laptop and in CI.

They leave like any agent when the pool ends (``%distributed_shutdown``, the kernel's exit);
:meth:`EmulatedNodes.close` then reaps them, killing one only if it outlived that by
:data:`EXIT_WAIT_S`. Each agent's output goes to a log file, quoted if it exits before joining.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile

EXIT_WAIT_S = 10.0
FIRST_ADDRESS = "127.0.0.2"  # 127.0.0.1 is the kernel's


def check_loopback(rdzv_host: str) -> None:
    """Emulated nodes connect from 127.0.0.K, so the kernel must listen on a loopback address too."""
    try:
        loopback = ipaddress.ip_address(rdzv_host).is_loopback
    except ValueError:
        loopback = rdzv_host == "localhost"
    if not loopback:
        raise ValueError(f"--emulate starts nodes on this machine's loopback addresses (127.0.0.2, …), which "
                         f"cannot reach --rdzv-host {rdzv_host}: use --rdzv-host 127.0.0.1, or start the agents "
                         "on the other machines with the join command instead")


class EmulatedNodes:
    """Node agents this kernel started on 127.0.0.2, 127.0.0.3, …"""

    def __init__(self) -> None:
        self.agents: list[tuple[str, subprocess.Popen, str]] = []  # (address, process, log file)
        self._logs = ""

    def running(self) -> list[str]:
        return [address for address, agent, _ in self.agents if agent.poll() is None]

    def start(self, join: str, token: str, count: int, preemption_url: str = "") -> list[str]:
        """Start ``count`` more agents that join ``join`` (HOST:PORT) with ``token``, given on their stdin (polling
        ``preemption_url``, given)."""
        self.reap()
        self._logs = self._logs or tempfile.mkdtemp(prefix=f"nbtrain-emulated-{os.getpid()}-")
        started = []
        for _ in range(count):
            address = self._free_address()
            log = os.path.join(self._logs, f"node-{address}.log")
            with open(log, "wb") as out:
                agent = subprocess.Popen([sys.executable, "-m", "nbtrain.node", "--join", join, "--token", "-",
                                          "--address", address,
                                          *(["--preemption-url", preemption_url] if preemption_url else [])],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.PIPE)
            assert agent.stdin is not None
            with contextlib.suppress(OSError):  # an agent that died at once: failures() quotes its log
                agent.stdin.write(token.encode() + b"\n")
                agent.stdin.close()
            self.agents.append((address, agent, log))
            started.append(address)
        return started

    def _free_address(self) -> str:
        taken = set(self.running())
        address = ipaddress.ip_address(FIRST_ADDRESS)
        while str(address) in taken:
            address += 1
        return str(address)

    def failures(self) -> list[str]:
        """Agents that exited with an error (could not join): their address and last lines of output."""
        lines = []
        for address, agent, log in self.agents:
            if agent.poll():
                with open(log, errors="replace") as f:
                    tail = f.read().strip().splitlines()[-3:]
                lines.append(f"emulated node on {address} exited ({agent.returncode}): " + " / ".join(tail))
        return lines

    def reap(self) -> None:
        self.agents = [entry for entry in self.agents if entry[1].poll() is None or entry[1].returncode]

    def close(self) -> None:
        """After the pool ended (its agents were told to leave): wait for them, kill any that stays."""
        for _, agent, _ in self.agents:
            try:
                agent.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        self.agents = []
        if self._logs:
            shutil.rmtree(self._logs, ignore_errors=True)
            self._logs = ""
