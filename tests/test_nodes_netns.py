"""A node's network goes away mid-run: a node agent in a Linux network namespace this test creates.

The namespace gets one end of a veth pair (both ends named after it, addresses in 10.213.K.0/24, K from this
process's pid, so two test runs on one machine do not meet); the kernel listens on the root namespace's end
and a second node agent runs there too. Nothing outside this machine is contacted. With both nodes running a
cell, the namespace's end of the link is taken down: no FIN, no RST, packets just stop, as when a machine's
cable or switch port goes. The kernel must report that node lost from its missing heartbeats (5 s, loosely
bounded: the machine is shared) as soon as it knows, stop the other node's rank, and the cut-off agent must stop its own rank and
exit by itself (it hears no kernel either). Skipped where ``ip netns`` is not permitted (not root, no
iproute2, a container without CAP_NET_ADMIN).
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.nodehelp import join_command, start_agent
from helpers.workers import assert_no_workers

NAME = f"nbt{os.getpid() % 10_000_000}"  # the namespace and both veth ends (≤ 15 characters)
SUBNET = f"10.213.{os.getpid() % 250}"
KERNEL_ADDRESS, NODE_ADDRESS = f"{SUBNET}.1", f"{SUBNET}.2"


def _ip(*args: str, inside: bool = False) -> None:
    command = ["ip", *(["netns", "exec", NAME, "ip"] if inside else []), *args]
    subprocess.run(command, check=True, capture_output=True, timeout=15)


def _remove_namespace() -> None:
    subprocess.run(["ip", "link", "del", NAME], capture_output=True, timeout=15)  # takes the peer with it
    subprocess.run(["ip", "netns", "del", NAME], capture_output=True, timeout=15)


@pytest.fixture
def namespace():
    try:
        _ip("netns", "add", NAME)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot create a network namespace here ({exc}; {detail.decode(errors='replace').strip()}): "
                    "this test needs root (CAP_NET_ADMIN) and iproute2's `ip netns`")
    try:
        _ip("link", "add", NAME, "type", "veth", "peer", "name", NAME + "p")
        _ip("link", "set", NAME + "p", "netns", NAME)
        _ip("link", "set", NAME + "p", "name", NAME, inside=True)  # the same name on both sides: one GLOO_SOCKET_IFNAME
        _ip("addr", "add", f"{KERNEL_ADDRESS}/24", "dev", NAME)
        _ip("link", "set", NAME, "up")
        _ip("addr", "add", f"{NODE_ADDRESS}/24", "dev", NAME, inside=True)
        _ip("link", "set", NAME, "up", inside=True)
        _ip("link", "set", "lo", "up", inside=True)
        yield
    finally:
        _remove_namespace()


def _joined_name(kernel: Kernel, address: str, timeout: float = 120) -> str:
    """The name the kernel gave the node joining from ``address``, once both nodes are listed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = kernel.run("%distributed_nodes")
        found = re.search(rf"node ([a-z]): \S+ \({re.escape(address)}\)", listing)
        if found and listing.count("idle") >= 2:
            return found.group(1)
        time.sleep(0.5)
    raise AssertionError(f"the nodes did not join within {timeout} s: {listing}")


def _ranks_of(agent: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(agent.pid).children(recursive=True) if "nbtrain.rank" in p.cmdline()]


def test_a_node_whose_link_goes_down_is_reported_lost_and_the_others_stop(namespace):
    kernel = Kernel()
    agents: list[subprocess.Popen] = []
    try:
        listing = kernel.run(f"%load_ext nbtrain\n%distributed_nodes --rdzv-host {KERNEL_ADDRESS}")
        command = join_command(listing)
        agents = [start_agent(command, KERNEL_ADDRESS), start_agent(command, NODE_ADDRESS, ["ip", "netns", "exec", NAME])]
        name = _joined_name(kernel, NODE_ADDRESS)
        msg_id = kernel.start(f"%%distributed --nodes 2 --rdzv-host {KERNEL_ADDRESS} --cpu --start-timeout 120 "
                              f"--env GLOO_SOCKET_IFNAME={NAME}\n"
                              "import time\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.05)\n")
        _, seen = kernel.collect(msg_id, 180, until=lambda text: text.count("spinning") >= 2)
        outside, cut_off = _ranks_of(agents[0]), _ranks_of(agents[1])
        assert len(outside) == 1 and len(cut_off) == 1, seen

        down = time.monotonic()
        _ip("link", "set", NAME, "down", inside=True)
        lost = re.compile(rf"nbtrain: node {name} \(ranks? [^)]*\) lost: (no heartbeat for 5 s|its connection broke); "
                          "stopping the other ranks")
        _, said = kernel.collect(msg_id, 60, until=lost.search)
        reported = time.monotonic() - down
        reply, out = kernel.collect(msg_id, 60)

        assert reply["status"] == "error" and lost.search(said), said + out
        assert 4 < reported < 10, f"reported {reported:.1f} s after the link went down (5 s promised, plus slack)"
        assert re.search(rf"node {name} \(ranks? [^)]*\) lost", out), "the cell's error names the node too"
        gone, alive = psutil.wait_procs(outside, timeout=10)
        assert not alive, "the other node's rank is stopped"
        # The cut-off agent hears no kernel either: it stops its rank and exits by itself, never outliving its pool.
        agents[1].wait(20)
        psutil.wait_procs(cut_off, timeout=10)
        assert not [p for p in cut_off if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        kernel.shutdown()
        for agent in agents:
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
    assert_no_workers(10)
