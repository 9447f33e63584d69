"""Attacks on several machines' sockets and secrets, performed: each test is one claim of docs/security.md.

* a pickle planted in the rendezvous store (unauthenticated, reachable by whoever reaches ``--rdzv-host``)
  while a ``--nodes`` cell starts runs nothing: the kernel hands each node its place over the link;
* the join token is in no command line, no process environment and no cell output; its file is 0600; it
  expires, and ``--revoke`` stops it admitting nodes;
* an agent refuses a token in its command line and a token file others can read; a token given in its
  environment is not left in its ``/proc/<pid>/environ``;
* a token holder whose hello is a pickle is dropped without it being unpickled; one who says nothing, or
  trickles bytes, is cut at one admission deadline; a flood of connections holds at most the cap (each address
  its share: ``tests/test_node_admission.py``), the rest told busy.
"""

from __future__ import annotations

import base64
import datetime
import glob
import json
import os
import pickle
import re
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.nodehelp import Boom, join_command, start_agent, until
from helpers.workers import assert_no_workers

from nbtrain.kernel.cluster.hub import ADMIT_DEADLINE_S, MAX_ADMISSIONS, MAX_ADMISSIONS_PER_ADDRESS, Hub
from nbtrain.wire.link import (
    HUB_BUSY, HUB_READY, TOKEN_ENV, JoinToken, LinkError, connect, handshake_client, open_tls
)
from nbtrain.wire.nodes import NodeHello

HELLO = NodeHello("tester", os.getpid(), 0, 1)
CELL = "%%distributed --nodes 2 --nproc-per-node 1 --rdzv-host 127.0.0.1 --cpu --start-timeout 120\n"


def _listening_ports(pid: int) -> set[int]:
    """What ``pid`` and its descendants listen on (the pool's store is a process the kernel's zygote forked)."""
    kernel = psutil.Process(pid)
    return {c.laddr.port for p in (kernel, *kernel.children(recursive=True)) for c in p.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def _plant(port: int, keys: list[str], value: bytes) -> bool:
    """As an attacker who reached the store: write ``value`` under each key; False if ``port`` is no store."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=3),
                              wait_for_workers=False)
        for key in keys:
            store.set(key, value)
        return True
    except (RuntimeError, ValueError):
        return False


# ------------------------------------------------------------------------------------ through a kernel
@pytest.mark.slow  # a real kernel
def test_a_pickle_planted_in_the_rendezvous_store_runs_nothing(tmp_path):
    """torch's c10d rendezvous unpickles its state from the store; the kernel's own decision replaces it."""
    marker = str(tmp_path / "planted-code-ran")
    kernel, agents = Kernel(), []
    try:
        listing = kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1")
        command, pid = join_command(listing), kernel.pid()
        before = _listening_ports(pid)
        msg_id = kernel.start(CELL + "joined = world_size\n")  # waits for the nodes, its store listening
        stores = until(lambda: _listening_ports(pid) - before, 30, "the cell's rendezvous store")
        # The key torch's dynamic rendezvous reads (base64 of a pickle), for every run id the kernel could use.
        state = base64.b64encode(pickle.dumps(Boom(marker)))
        keys = [f"torch.rendezvous.nbtrain-{pid}-{n}" for n in range(1, 20)]
        assert any(_plant(port, keys, state) for port in stores)
        agents = [start_agent(command, address) for address in ("127.0.0.2", "127.0.0.3")]
        reply, out = kernel.collect(msg_id, 240)
        assert reply["status"] == "ok", out
        assert "2 ranks · gloo" in out and not os.path.exists(marker)
    finally:
        kernel.shutdown()
        for agent in agents:
            agent.wait(20)
    assert_no_workers(10)


def _agents_and_ranks() -> list[psutil.Process]:
    agents = [p for p in psutil.process_iter(["cmdline"]) if "nbtrain.node" in " ".join(p.info["cmdline"] or ())]
    return agents + [child for agent in agents for child in agent.children(recursive=True)]


@pytest.mark.slow  # a real kernel
def test_the_join_token_is_in_no_command_line_environment_or_output_and_can_be_revoked():
    kernel = Kernel()
    try:
        out = kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --emulate 2")
        path = re.search(r"--token-file (\S+)", out).group(1)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        with open(path) as f:
            token = JoinToken.decode(f.read())
        assert 3500 < token.expires - time.time() <= 3600  # an hour by default
        until(lambda: kernel.run("%distributed_nodes").count("idle") >= 2, 120, "two nodes")
        out += kernel.run(CELL + "print('ran on', world_size)\n", timeout=240)
        out += kernel.run("%distributed_nodes")
        assert "ran on 2" in out
        for secret in (token.secret, token.encode()):
            assert secret not in out
            for process in _agents_and_ranks() or pytest.fail("no agent found"):
                assert secret not in " ".join(process.cmdline())
                assert secret not in "".join(process.environ().values())
        old = token
        kernel.run("%distributed_nodes --revoke --token-ttl 30m")
        with open(path) as f:
            token = JoinToken.decode(f.read())
        assert token.secret != old.secret and 1700 < token.expires - time.time() <= 1800
        with pytest.raises((LinkError, OSError)):
            connect(old, HELLO)  # a revoked token admits no one
        link, _name = connect(token, HELLO)
        link.close()
        assert kernel.run("%distributed_nodes").count("node b: ") == 1  # the joined nodes stayed
        kernel.run("%distributed_shutdown")
        assert not os.path.exists(path)
    finally:
        kernel.shutdown()
    assert_no_workers(10)


@pytest.mark.slow  # a real kernel
def test_a_node_channel_refuses_a_peer_without_its_key(tmp_path):
    """The node's UNIX socket for its ranks: the HMAC challenge first, so a pickle sent instead is never read."""
    marker = str(tmp_path / "unpickled")
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --emulate 1")
        until(lambda: "idle" in kernel.run("%distributed_nodes"), 120, "the node")
        # this kernel's own agent: one an earlier test shut down may still be on its way out, its folder gone
        agent = next(p for p in psutil.Process(kernel.pid()).children(recursive=True)
                     if "nbtrain.node" in " ".join(p.cmdline()))
        address = glob.glob(os.path.join(tempfile.gettempdir(), f"nbtrain-node-{agent.pid}-*", "node.sock"))[0]
        with pytest.raises((AuthenticationError, EOFError, OSError)):
            Client(address, family="AF_UNIX", authkey=b"not the key" * 3)
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(address)
        raw.recv(4096)  # the challenge
        payload = pickle.dumps(Boom(marker))
        raw.sendall(struct.pack("!i", len(payload)) + payload)  # a message in place of the answer
        time.sleep(1)
        raw.close()
        assert not os.path.exists(marker)
        out = kernel.run("%%distributed --nodes 1 --rdzv-host 127.0.0.1 --cpu\nok = 1", timeout=240)
        assert "1 rank · gloo" in out, out  # the node's ranks still connect after both attacks
    finally:
        kernel.shutdown()
    assert_no_workers(10)


# ------------------------------------------------------------------------------------ an agent's own checks
def _agent(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbtrain.node", "--join", "127.0.0.1:9", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_an_agent_refuses_a_token_in_its_command_line_and_a_token_file_others_can_read(tmp_path):
    given = _agent("--token", "nbt1.eyJzZWNyZXQiOiAiYSJ9")
    assert given.returncode != 0 and "readable by every user of this machine" in given.stderr
    assert "--token-file" in given.stderr
    loose = tmp_path / "token"
    loose.write_text("nbt1.x\n")
    loose.chmod(0o644)
    refused = _agent("--token-file", str(loose))
    assert refused.returncode != 0 and f"chmod 600 {loose}" in refused.stderr
    none = _agent()
    assert none.returncode != 0 and "no join token" in none.stderr


def test_a_token_given_in_the_environment_is_not_in_the_agents_proc_environ(tmp_path):
    """The kernel keeps a process's first environment in /proc/<pid>/environ, whatever it unsets later: the agent
    runs itself again (same pid) without the variable."""
    hub = Hub("127.0.0.1", token_dir=str(tmp_path / "tokens"))
    agent = None
    try:
        env = {**os.environ, TOKEN_ENV: hub.token.encode()}
        agent = subprocess.Popen([sys.executable, "-m", "nbtrain.node", "--join", f"127.0.0.1:{hub.port}",
                                  "--address", "127.0.0.2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        [node] = until(lambda: hub.live_nodes() or agent.poll() is not None, 90, "the agent to join")
        assert node.hello.pid == agent.pid  # the process started, joined with the token it was given
        with open(f"/proc/{agent.pid}/environ", "rb") as f:
            environ = f.read()
        assert hub.token.secret.encode() not in environ and TOKEN_ENV.encode() + b"=" not in environ
        assert hub.token.secret not in "".join(psutil.Process(agent.pid).environ().values())
    finally:
        hub.close()
        if agent is not None:
            agent.wait(20)


# ------------------------------------------------------------------------------------ the hub's admission
@pytest.fixture
def hub(tmp_path):
    hub = Hub("127.0.0.1", token_dir=str(tmp_path / "tokens"))
    yield hub
    hub.close()


def _authenticated(hub: Hub):
    """A token holder: TLS and the handshake passed, nothing said yet."""
    sock = open_tls("127.0.0.1", hub.port)
    handshake_client(sock, hub.token)
    return sock


def _closed_by_peer(sock, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset, or TLS torn down
        return True


def test_a_token_holder_whose_hello_is_a_pickle_is_dropped_unread(hub, tmp_path):
    marker = str(tmp_path / "unpickled")
    sock = _authenticated(hub)
    payload = pickle.dumps(NodeHello("x", 1, 0, 1)) + pickle.dumps(Boom(marker))
    sock.sendall(struct.pack("!I", len(payload)) + payload)
    assert _closed_by_peer(sock, 5)
    until(lambda: hub.refused == 1, 5, "the refusal")
    assert hub.nodes == [] and not os.path.exists(marker)


@pytest.mark.parametrize("extra, joins", [({}, True), ({"slurm_job": "42"}, True), ({"slurm_job": 42}, False),
                                           ({"role": "admin"}, False)])
def test_a_hello_is_read_field_by_field_its_slurm_job_optional(hub, extra, joins):
    """An older agent's hello (no ``slurm_job``) still joins; a field of the wrong type or an unknown one does not."""
    sock = _authenticated(hub)
    body = json.dumps({"host": "x", "pid": 1, "gpus": 0, "cpus": 1, "address": "", **extra}).encode()
    sock.sendall(struct.pack("!I", len(body)) + body)
    if joins:
        until(lambda: len(hub.nodes) == 1, 5, "the node to join")
        assert hub.nodes[0].hello.slurm_job == extra.get("slurm_job", "")
    else:
        assert _closed_by_peer(sock, 5)
        until(lambda: hub.refused == 1, 5, "the refusal")
        assert hub.nodes == []


def _admitting() -> int:
    return len([t for t in threading.enumerate() if t.name == "nbtrain-hub-admit"])


@pytest.mark.slow  # waits out a real deadline of seconds
def test_a_token_holder_who_says_nothing_is_dropped_at_the_deadline(hub):
    before = _admitting()  # other tests' hubs may still be ending theirs
    sock, start = _authenticated(hub), time.monotonic()
    assert _admitting() >= 1
    assert _closed_by_peer(sock, ADMIT_DEADLINE_S + 5)
    assert time.monotonic() - start < ADMIT_DEADLINE_S + 2.5
    until(lambda: hub.refused == 1, 5, "the refusal")
    until(lambda: _admitting() <= before, 5, "the admission's thread to end")  # no link left behind
    assert hub.nodes == []


@pytest.mark.slow  # waits out a real deadline of seconds
def test_a_peer_trickling_bytes_is_cut_at_one_deadline(hub):
    """One byte a second passes every per-read timeout; the admission as a whole still ends in time."""
    sock, start = socket.create_connection(("127.0.0.1", hub.port)), time.monotonic()
    try:
        while time.monotonic() - start < ADMIT_DEADLINE_S + 10:
            sock.sendall(b"\x16")
            if _closed_by_peer(sock, 1.0):
                break
    except OSError:
        pass
    assert time.monotonic() - start < ADMIT_DEADLINE_S + 2.5
    sock.close()


def test_a_flood_of_connections_holds_at_most_the_cap_and_a_node_joins_after(hub):
    sources = [f"127.0.0.{10 + k}" for k in range(MAX_ADMISSIONS // MAX_ADMISSIONS_PER_ADDRESS + 1)]
    flood = [socket.create_connection(("127.0.0.1", hub.port), source_address=(source, 0))
             for source in sources for _ in range(MAX_ADMISSIONS_PER_ADDRESS + 3)]
    time.sleep(0.5)
    assert _admitting() <= MAX_ADMISSIONS
    greetings = [_greeting(s) for s in flood]
    assert greetings.count(HUB_READY) == MAX_ADMISSIONS  # each address its share, up to the cap in all
    assert greetings.count(HUB_BUSY) == len(flood) - MAX_ADMISSIONS
    busy = [s for s, said in zip(flood, greetings, strict=True) if said == HUB_BUSY]
    assert all(_closed_by_peer(s, 1.0) for s in busy)  # told busy and closed at once, no thread each
    for sock in flood:
        sock.close()
    link, name = until(lambda: _try_join(hub), ADMIT_DEADLINE_S + 5, "a node to join after the flood")
    assert name == "a"
    link.close()


def _greeting(sock) -> bytes:
    sock.settimeout(5)
    return sock.recv(len(HUB_READY))


def _try_join(hub: Hub):
    try:
        return connect(hub.token, HELLO, timeout=2)
    except (LinkError, OSError):
        return None
