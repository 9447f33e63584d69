"""What a network peer can do to per-step fault tolerance with torchft: each attack performed (docs/security.md).

nbtrain's recovery transport (:mod:`nbtrain.rank.train.ft_transport`) replaces torchft's, which unpickle what a
peer sends: here a peer without the run's secret gets no weights, cannot make a rank read a forged or replayed
state, and even a peer with the secret cannot run code through it. The Lighthouse and the Managers' servers
have no authentication in torchft; nbtrain binds them to one address, and the attacks that stay possible for a
peer that reaches that address (joining a quorum; ending a group through the Lighthouse's kill route) are
performed here so docs/security.md says what is true.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
import torch

from nbtrain.kernel.lifecycle.lighthouse import Lighthouse
from nbtrain.rank.train.ft_transport import PATH, SignedTransport, TransportRefused, fetch_state

pytestmark = pytest.mark.timeout(180)

HELPERS = Path(__file__).parent / "helpers"
STATE = {"model": {"weight": torch.arange(6.0).reshape(2, 3)}, "torchft": {"step": 7, "batches_committed": 14}}


class Planted:
    """Unpickling this touches a file: proof that code ran in the reader."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class Attacker:
    """An HTTP server on 127.0.0.1 that answers every request with the headers and body it is given."""

    def __init__(self, headers: dict[str, str], body: bytes) -> None:
        attacker = self
        self.headers, self.body, self.asked = headers, body, 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                attacker.asked += 1
                self.send_response(200)
                for name, value in {**attacker.headers, "Content-Length": str(len(attacker.body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(attacker.body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def transport():
    served = SignedTransport(secrets.token_bytes(32), "127.0.0.1", timeout=timedelta(seconds=2))
    yield served
    served.shutdown()


def test_fault_tolerance_state_goes_only_to_a_reader_with_the_runs_secret(transport):
    transport.send_checkpoint([1], 7, STATE, timedelta(seconds=5))
    got = fetch_state(transport._secret, transport.metadata(), 7, 5)
    assert torch.equal(got["model"]["weight"], STATE["model"]["weight"]) and got["torchft"]["step"] == 7
    host, port = transport.metadata()[len("http://"):].split(":")
    for proof in ("", "0" * 64):  # the attack: ask for the weights without the secret
        connection = http.client.HTTPConnection(host, int(port), timeout=5)
        connection.request("GET", f"{PATH}7?nonce=abcd", headers={"X-Nbtrain-Proof": proof})
        answer = connection.getresponse()
        assert answer.status == 403 and torch_bytes(STATE["model"]["weight"])[-24:] not in answer.read()
    with pytest.raises(TransportRefused, match="HTTP 403"):  # and a wrong secret is refused
        fetch_state(secrets.token_bytes(32), transport.metadata(), 7, 5)
    transport.disallow_checkpoint()  # withdrawn before the optimizer step: nothing is served after
    with pytest.raises(TransportRefused, match="HTTP 404"):
        fetch_state(transport._secret, transport.metadata(), 7, 5)


def test_fault_tolerance_a_peer_without_the_secret_cannot_make_a_rank_load_its_state(tmp_path):
    marker = tmp_path / "code-ran"
    body = torch_bytes({"model": Planted(marker)})
    forged = Attacker({"X-Nbtrain-Seal": "0" * 64, "X-Nbtrain-Digest": hashlib.sha256(body).hexdigest()}, body)
    try:
        with pytest.raises(TransportRefused, match="without proof of the run's secret; nothing of it was read"):
            fetch_state(secrets.token_bytes(32), forged.address, 3, 5)
    finally:
        forged.close()
    assert forged.asked == 1 and not marker.exists()


def test_fault_tolerance_a_recorded_answer_cannot_be_replayed(transport):
    """A peer that saw one real answer go by (nonce, seal, body) serves it again: the next fetch's nonce differs."""
    transport.send_checkpoint([1], 5, STATE, timedelta(seconds=5))
    host, port = transport.metadata()[len("http://"):].split(":")
    from nbtrain.rank.train.ft_transport import _mac  # the reader's own request, as the peer saw it
    nonce = "feed" * 8
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    connection.request("GET", f"{PATH}5?nonce={nonce}", headers={"X-Nbtrain-Proof": _mac(transport._secret, "get", nonce, 5)})
    seen = connection.getresponse()
    recorded = {name: seen.getheader(name) for name in ("X-Nbtrain-Seal", "X-Nbtrain-Digest")}, seen.read()
    replay = Attacker(*recorded)
    try:
        with pytest.raises(TransportRefused, match="without proof of the run's secret"):
            fetch_state(transport._secret, replay.address, 5, 5)
    finally:
        replay.close()


def test_fault_tolerance_even_a_peer_with_the_secret_cannot_run_code_in_the_reader(tmp_path):
    """An insider (the secret is in every rank of the run) seals a pickle that runs code: weights_only refuses it."""
    secret, marker = secrets.token_bytes(32), tmp_path / "code-ran"
    insider = SignedTransport(secret, "127.0.0.1", timeout=timedelta(seconds=2))
    try:
        insider.send_checkpoint([1], 2, {"model": Planted(marker)}, timedelta(seconds=5))
        with pytest.raises(Exception, match="Weights only load failed"):
            fetch_state(secret, insider.metadata(), 2, 5)
    finally:
        insider.shutdown()
    assert not marker.exists()


def test_fault_tolerance_the_lighthouse_listens_on_the_rendezvous_address_only_and_admits_any_peer_there():
    lighthouse = Lighthouse("127.0.0.2", min_replicas=1)
    try:
        port = int(lighthouse.address.rsplit(":", 1)[1])
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        # the attack that stays possible: a peer that reaches the address joins a quorum under a name of its own
        from torchft._torchft import LighthouseClient

        client = LighthouseClient(lighthouse.address, connect_timeout=timedelta(seconds=5))
        quorum = client.quorum(replica_id="intruder", timeout=timedelta(seconds=10), address="http://127.0.0.9:1",
                               store_address="127.0.0.9:1", step=0, world_size=1, shrink_only=False)
        assert [member.replica_id for member in quorum.participants] == ["intruder"]
    finally:
        lighthouse.close()
    assert not lighthouse.alive()


KERNEL = """
import sys
from nbtrain.kernel.lifecycle.lighthouse import Lighthouse
lighthouse = Lighthouse("127.0.0.1", min_replicas=1)
print(lighthouse.address, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_fault_tolerance_a_killed_kernel_leaves_no_lighthouse():
    """The Lighthouse lives as long as its kernel's end of a pipe: a SIGKILLed kernel takes it along."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPERS.parent.parent), os.environ.get("PYTHONPATH", "")])}
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert kernel.stdout is not None
        port = int(kernel.stdout.readline().rsplit(":", 1)[1])
        children = psutil.Process(kernel.pid).children()
        assert len(children) == 1 and socket.create_connection(("127.0.0.1", port), timeout=2)
        kernel.kill()
        kernel.wait()
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, alive
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
    finally:
        kernel.kill()


def test_fault_tolerance_without_torchft_the_lighthouse_says_how_to_install_it(monkeypatch):
    import importlib.util

    from nbtrain.kernel.lifecycle import lighthouse as module

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    with pytest.raises(module.LighthouseError, match=r"needs torchft, which is not installed here: pip install 'nbtrain\[ft\]'"):
        Lighthouse("127.0.0.1", min_replicas=1)


@pytest.mark.slow
def test_fault_tolerance_a_peer_that_reaches_the_lighthouse_can_end_a_group_and_managers_listen_on_one_address(tmp_path):
    """torchft's Lighthouse serves a page with a kill route for each group, unauthenticated: performed here. The
    group's own Manager server is bound to the group's address, not every interface (nbtrain's binding)."""
    lighthouse = Lighthouse("127.0.0.1", min_replicas=1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPERS.parent.parent), os.environ.get("PYTHONPATH", "")])}
    replica = subprocess.Popen([sys.executable, str(HELPERS / "ft_replica.py")], stdin=subprocess.PIPE, env=env, text=True,
                               stdout=subprocess.DEVNULL, stderr=open(tmp_path / "0.log", "wb"))
    try:
        assert replica.stdin is not None
        replica.stdin.write(json.dumps({"lighthouse": lighthouse.address, "replica": "0", "secret": secrets.token_hex(32),
                                        "steps": 10_000, "out": str(tmp_path), "step_s": 0.05}) + "\n")
        replica.stdin.close()
        deadline = time.monotonic() + 120
        while not (tmp_path / "0.steps").exists() or not (tmp_path / "0.steps").read_text():
            assert time.monotonic() < deadline and replica.poll() is None, (tmp_path / "0.log").read_text()[-2000:]
            time.sleep(0.1)
        listening = {c.laddr.ip for c in psutil.Process(replica.pid).net_connections("tcp") if c.status == "LISTEN"}
        assert listening == {"127.0.0.1"}, listening  # the c10d store, the Manager's server, the state server
        status = urllib.request.urlopen(lighthouse.address + "/status", timeout=5).read().decode()
        replica_id = re.findall(r"\b0:[0-9a-f-]{36}\b", status)[0]  # the page names every group
        kill = urllib.request.Request(f"{lighthouse.address}/replica/{replica_id}/kill", method="POST")
        with contextlib.suppress(urllib.error.HTTPError):  # a 500: the Manager's process ended in the middle of it
            urllib.request.urlopen(kill, timeout=5).read()
        assert replica.wait(timeout=30) != 0  # the group's process is gone
    finally:
        replica.kill()
        lighthouse.close()
