"""The hub's admission under a flood, performed: a peer on the network who opens connections and says nothing.

* a flood from one address (another process, 127.0.0.5, its connections reopened as the hub drops them) holds
  at most that address's share of the admission slots: the user's agent on 127.0.0.2 still joins;
* an agent the kernel calls busy tries again with growing pauses and gives up at its ``--start-timeout``, saying
  why; one started while every slot is held joins once they free up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers.nodehelp import until

from nbtrain.kernel.cluster.hub import MAX_ADMISSIONS, MAX_ADMISSIONS_PER_ADDRESS, Hub
from nbtrain.wire.link import HUB_BUSY, JoinToken

# Another process's flood: each thread opens a connection from its source address, says nothing, waits until the
# hub hangs up (busy at once, or at the admission deadline) and opens the next. Standard library only.
FLOOD = """
import socket, sys, threading, time
host, port, seconds, per_address = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
end = time.monotonic() + seconds
def hold(source):
    while time.monotonic() < end:
        try:
            sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
            while sock.recv(4096):
                pass
            sock.close()
        except OSError:
            pass
        time.sleep(0.02)
for source in sys.argv[5:]:
    for _ in range(per_address):
        threading.Thread(target=hold, args=(source,), daemon=True).start()
time.sleep(seconds)
"""


def flood(hub: Hub, seconds: float, per_address: int, *sources: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", "-c", FLOOD, "127.0.0.1", str(hub.port), str(seconds),
                             str(per_address), *sources])


@pytest.fixture
def hub(tmp_path):
    hub = Hub("127.0.0.1", token_dir=str(tmp_path / "tokens"))
    yield hub
    hub.close()


def agent(hub: Hub, address: str, console, *options: str) -> subprocess.Popen:
    """The user's agent, started with the join command the notebook printed."""
    return subprocess.Popen([sys.executable, *hub.join_command().split()[1:], "--address", address, *options],
                            stdout=console, stderr=subprocess.STDOUT)


def _admitting(hub: Hub) -> dict:
    with hub._lock:
        return dict(hub._admitting)


def test_a_flood_from_one_address_leaves_room_and_the_users_agent_joins(hub, tmp_path):
    attack = flood(hub, 120, 12, "127.0.0.5")
    console = open(tmp_path / "console", "w+")
    user = None
    try:
        until(lambda: _admitting(hub).get("127.0.0.5") == MAX_ADMISSIONS_PER_ADDRESS, 20, "the flood to hold its slots")
        user = agent(hub, "127.0.0.2", console)
        until(lambda: hub.live_nodes() or user.poll() is not None, 90, "the agent to join or exit")
        console.seek(0)
        said = console.read()
        assert user.poll() is None and [n.address for n in hub.live_nodes()] == ["127.0.0.2"], said
        assert "busy" not in said, said  # joined at its first try: the flood's address held only its share
        assert _admitting(hub).get("127.0.0.5", 0) <= MAX_ADMISSIONS_PER_ADDRESS  # the flood never held more
        assert hub.refused > 12  # its other connections were told busy
    finally:
        attack.kill()
        attack.wait()
        hub.close()
        if user is not None:
            user.wait(20)
        console.close()


def busy_listener() -> tuple[socket.socket, list[float]]:
    """A listener that always answers busy, as a kernel whose slots are all held; the times it was tried."""
    server = socket.create_server(("127.0.0.1", 0))
    tries: list[float] = []

    def answer_busy() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            tries.append(time.monotonic())
            conn.sendall(HUB_BUSY)
            conn.close()

    threading.Thread(target=answer_busy, daemon=True).start()
    return server, tries


def join_command(server: socket.socket, tmp_path, *options: str) -> list[str]:
    port = server.getsockname()[1]
    token = JoinToken("127.0.0.1", port, "pool", "00" * 32, "00" * 32, time.time() + 3600)
    path = tmp_path / "token"
    path.write_text(token.encode())
    path.chmod(0o600)
    return [sys.executable, "-m", "nbtrain.node", "--join", f"127.0.0.1:{port}", "--token-file", str(path), *options]


@pytest.mark.slow  # waits out a real deadline of seconds
def test_an_agent_told_busy_tries_again_with_growing_pauses_until_its_start_timeout(tmp_path):
    """The agent keeps trying a kernel that says busy, each pause longer, and gives up at --start-timeout with a
    line that says why."""
    server, tries = busy_listener()
    try:
        done = subprocess.run(join_command(server, tmp_path, "--start-timeout", "4"),
                              capture_output=True, text=True, timeout=120)
    finally:
        server.close()
    assert done.returncode != 0
    assert "is busy admitting other connections; trying again for up to" in done.stdout, done.stdout
    assert "gave up trying again: --start-timeout 4 s passed" in done.stderr, done.stderr
    pauses = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert 4 <= len(tries) <= 12, tries  # 0.2 s, doubling with jitter, up to 5 s: not a tight loop
    assert max(pauses[:-1]) > 3 * pauses[0], pauses  # the last is cut short by the timeout


def test_a_sigterm_to_an_agent_trying_to_join_ends_its_tries_saying_so(tmp_path):
    """SIGTERM is a preemption notice once the agent may be counted in; before, while it waits to try joining a
    busy kernel again, it ends the tries at once (not at --start-timeout)."""
    server, tries = busy_listener()
    try:
        agent = subprocess.Popen(join_command(server, tmp_path, "--start-timeout", "120"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        until(lambda: len(tries) >= 2, 60, "the agent to try twice")
        agent.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, err = agent.communicate(timeout=60)
    finally:
        server.close()
    assert time.monotonic() - started < 3 and agent.returncode != 0, (out, err)
    assert "cannot join: a SIGTERM came while joining; not joined" in err, err


def test_an_agent_started_while_every_slot_is_held_joins_when_they_free_up(hub, tmp_path):
    sources = [f"127.0.0.{10 + k}" for k in range(MAX_ADMISSIONS // MAX_ADMISSIONS_PER_ADDRESS)]
    attack = flood(hub, 120, MAX_ADMISSIONS_PER_ADDRESS + 1, *sources)
    console = open(tmp_path / "console", "w+")
    user = None
    try:
        until(lambda: sum(_admitting(hub).values()) == MAX_ADMISSIONS, 20, "the flood to hold every slot")
        user = agent(hub, "127.0.0.2", console)
        until(lambda: "busy admitting other connections" in open(console.name).read() or user.poll() is not None,
              90, "the agent to be told busy")
        attack.kill()  # the flood ends: its slots free up at the admission deadline at the latest
        until(lambda: hub.live_nodes() or user.poll() is not None, 30, "the agent to join or exit")
        assert user.poll() is None and len(hub.live_nodes()) == 1, open(console.name).read()
    finally:
        attack.kill()
        attack.wait()
        hub.close()
        if user is not None:
            user.wait(20)
        console.close()


def test_an_agent_refuses_a_start_timeout_that_is_not_a_positive_number():
    for options, env in [(["--start-timeout", "0"], {}), ([], {"NBTRAIN_START_TIMEOUT": "soon"})]:
        done = subprocess.run([sys.executable, "-m", "nbtrain.node", "--join", "127.0.0.1:9", "--token", "-", *options],
                              input="", capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert done.returncode == 2 and "a positive number of seconds, such as 180" in done.stderr, done.stderr
