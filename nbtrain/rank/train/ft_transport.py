"""How a replica group that rejoins gets a healthy peer's state under torchft: signed, and never unpickled.

torchft's ``Manager`` copies the state of a healthy replica group to one that (re)joins the quorum through a
``CheckpointTransport``. Both transports torchft ships read what the peer sends as a pickle (its HTTP transport
with ``torch.load(weights_only=False)``, its process-group transport with ``pickle.loads``), and the peer is
whoever the Lighthouse names — and the Lighthouse lets anyone who reaches it join a quorum. So a network peer
could run code in every rank that heals from it. :class:`SignedTransport` is the transport nbtrain gives the
Manager instead:

* the serving side keeps the state as ``torch.save`` bytes, taken when torchft offers it (``send_checkpoint``,
  before the optimizer step that would change it) and dropped when torchft withdraws it;
* a request must prove the run's secret: an HMAC over a fresh nonce and the step. Without it the answer is 403
  and not one byte of the weights;
* the answer's header carries an HMAC over the nonce, the step, the body's length and its SHA-256, which the
  reader checks before it reads the body, then the body's digest before it loads anything — a peer without the
  secret cannot make a rank read more than a header, and a recorded answer cannot be replayed (the nonce);
* it is loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings and containers only, so even a
  peer that holds the secret cannot run code in the reader.

The secret is the run's, made by the kernel and sent to each rank in its job over nbtrain's authenticated
channel (never in argv or the environment). The server binds only the address the rank was told to advertise.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import secrets
import threading
import time
import urllib.parse
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

PATH = "/nbtrain-state/"
CHUNK = 1 << 20
NONCE_BYTES = 16


class TransportRefused(RuntimeError):
    """A peer's answer that nbtrain will not read: no proof of the run's secret, or not what it proved."""


def _mac(secret: bytes, *parts: object) -> str:
    return hmac.new(secret, b"\0".join(str(part).encode() for part in parts), hashlib.sha256).hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a reader that stalls holds a thread, never the rank's exit


class _Offer:
    """The state torchft offered for one step, as bytes: what the server hands out until it is withdrawn."""

    def __init__(self, step: int, body: bytes) -> None:
        self.step, self.body, self.digest = step, body, hashlib.sha256(body).hexdigest()


class SignedTransport:
    """torchft's ``CheckpointTransport`` (duck-typed: torchft is imported only where a run asks for ``--ft``)."""

    def __init__(self, secret: bytes, host: str, timeout: timedelta = timedelta(seconds=60)) -> None:
        if len(secret) < 16:
            raise ValueError("the transport's secret must be at least 16 bytes")
        self._secret, self._host, self._timeout = secret, host, timeout
        self._offered = threading.Condition()
        self._offer: _Offer | None = None
        self._server = _Server((host, 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, name="nbtrain-ft-state", daemon=True)
        self._thread.start()

    # --- torchft's interface -------------------------------------------------------------------------------
    def metadata(self) -> str:
        return f"http://{self._host}:{self._server.server_address[1]}"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        buffer = io.BytesIO()
        torch.save(state_dict, buffer)
        with self._offered:
            self._offer = _Offer(step, buffer.getvalue())
            self._offered.notify_all()

    def disallow_checkpoint(self) -> None:
        with self._offered:
            self._offer = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        return fetch_state(self._secret, metadata, step, timeout.total_seconds())

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join(timeout=5)

    # --- serving -------------------------------------------------------------------------------------------
    def _answer(self, path: str, proof: str) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request: the offer, only to a request that proves the secret."""
        parsed = urllib.parse.urlsplit(path)
        nonce = urllib.parse.parse_qs(parsed.query).get("nonce", [""])[0]
        step = parsed.path[len(PATH):] if parsed.path.startswith(PATH) else ""
        if not (step.isdigit() and nonce) or not hmac.compare_digest(proof, _mac(self._secret, "get", nonce, step)):
            return 403, {}, b"no proof of the run's secret\n"
        with self._offered:  # the peer may ask before torchft here has offered the step: wait for it, as torchft's does
            self._offered.wait_for(lambda: self._offer is not None and self._offer.step == int(step),
                                   timeout=self._timeout.total_seconds())
            offer = self._offer
        if offer is None or offer.step != int(step):
            return 404, {}, b"no state offered for that step\n"
        seal = _mac(self._secret, "state", nonce, offer.step, len(offer.body), offer.digest)
        return 200, {"X-Nbtrain-Seal": seal, "X-Nbtrain-Digest": offer.digest}, offer.body

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers, body = transport._answer(self.path, self.headers.get("X-Nbtrain-Proof", ""))
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a rank's output is the cell's: no access log in it

        return Handler


def fetch_state(secret: bytes, metadata: str, step: int, timeout_s: float) -> Any:
    """Read the state a peer offers for ``step`` from ``metadata`` (its address), checked as the module says."""
    host, port = _address(metadata)
    nonce = secrets.token_hex(NONCE_BYTES)
    deadline = time.monotonic() + timeout_s
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", f"{PATH}{step}?nonce={nonce}",
                           headers={"X-Nbtrain-Proof": _mac(secret, "get", nonce, step)})
        response = connection.getresponse()
        if response.status != 200:
            raise TransportRefused(f"the peer at {host}:{port} did not send the state of step {step} "
                                   f"(HTTP {response.status})")
        length, digest = _checked_header(secret, response, nonce, step)
        body = _read_body(response, length, deadline)
    finally:
        connection.close()
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest):
        raise TransportRefused(f"the state from {host}:{port} is not what its sealed header says; nothing was loaded")
    return torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)


def _address(metadata: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(metadata)
    if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
        raise TransportRefused(f"a peer's state address {metadata[:80]!r} is not http://HOST:PORT")
    return parsed.hostname, parsed.port


def _checked_header(secret: bytes, response: http.client.HTTPResponse, nonce: str, step: int) -> tuple[int, str]:
    """The body's length and digest, once the seal over them proves the run's secret (before a byte is read)."""
    length_text, digest = response.getheader("Content-Length", ""), response.getheader("X-Nbtrain-Digest", "")
    seal = response.getheader("X-Nbtrain-Seal", "")
    if not length_text.isdigit() or not hmac.compare_digest(seal, _mac(secret, "state", nonce, step,
                                                                          int(length_text), digest)):
        raise TransportRefused("a peer sent a state without proof of the run's secret; nothing of it was read")
    return int(length_text), digest


def _read_body(response: http.client.HTTPResponse, length: int, deadline: float) -> bytes:
    parts, left = [], length
    while left:
        if time.monotonic() > deadline:
            raise TimeoutError("the peer's state did not arrive in time")
        chunk = response.read(min(CHUNK, left))
        if not chunk:
            raise TransportRefused("the peer closed the connection before the whole state came")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
