"""The kernel ↔ node link: a join token, a mutual HMAC handshake over TLS, then framed messages.

This is the channel that leaves loopback, so it is built for a network:

* **Join token** (:class:`JoinToken`): the kernel's address, the pool's id, a random 32-byte secret, the
  SHA-256 fingerprint of the pool's self-signed certificate and an expiry time, as one printable string
  (``nbt1.<base64url JSON>``). Whoever holds it can join that pool until it expires; it names no other pool.
* **Greeting** (:func:`open_tls`): before TLS the kernel says, in 4 raw bytes, whether it admits the connection
  now (:data:`HUB_READY`) or is busy admitting others (:data:`HUB_BUSY`, then it hangs up): a node told it is
  busy tries again (:class:`LinkRetry`), where a bare hang-up would look like a broken TLS handshake.
* **TLS**: the node does not trust any CA; it accepts exactly the certificate whose fingerprint the token
  pins (:func:`check_fingerprint`), so a man in the middle cannot read or alter the traffic.
* **Mutual authentication before any unpickling** (:func:`handshake_server` / :func:`handshake_client`):
  raw bytes only — the node sends the pool id and a nonce, the kernel a nonce, each side proves it holds
  the secret with an HMAC over both nonces and its role; a wrong secret or pool ends the connection
  before a single pickle is read. Only then does :class:`Link` exchange pickled messages
  (:mod:`nbtrain.wire.nodes`).
* **Admission in raw bytes too** (:func:`send_hello` / :func:`read_hello`): the node's
  :class:`~nbtrain.wire.nodes.NodeHello` has a fixed layout (a length, then a JSON object of five typed
  fields, 4 KiB at most) that the kernel parses, and the kernel answers with the node's name the same way. A
  token holder who never says a valid hello is dropped without a pickle having been read; frames start after.
* **Framing** (:class:`Link`): a 4-byte length, then one pickle. All TLS reads and writes of a
  connection happen on its own pump thread (an ``SSLSocket`` must not be used from two threads at
  once); other threads queue what they send and read what arrived from a queue. Every frame received
  refreshes :attr:`Link.last_heard`, which the heartbeat checks read.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import pickle
import queue
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import asdict, dataclass

from .nodes import Heartbeat, NodeHello

TOKEN_PREFIX = "nbt1."
TOKEN_ENV = "NBTRAIN_JOIN_TOKEN"  # where a node agent may find the token (never its argv)
_NONCE = 32
_MAX_HELLO = 4096
_HELLO_FIELDS = {"host": str, "pid": int, "gpus": int, "cpus": int, "address": str, "slurm_job": str}
_HELLO_OPTIONAL = {"slurm_job"}  # an older agent's hello reads without them
HUB_READY = b"NBT+"  # the kernel's greeting, before TLS: go on
HUB_BUSY = b"NBT-"  # too many admissions at once (from this address, or in all): try again shortly
_MAX_FRAME = 1 << 34  # 16 GiB: a notebook's inputs, never a length an attacker chose (we are past the HMAC)


class LinkError(ConnectionError):
    """The link could not be established or authenticated; the message says why."""


class LinkRetry(LinkError):
    """The link could not be established yet, before any secret was shown: the kernel was busy admitting other
    connections, unreachable, or the connection broke before TLS was up. Trying again later may succeed."""


@dataclass(frozen=True)
class JoinToken:
    host: str
    port: int
    pool: str  # the pool this token belongs to
    secret: str  # hex
    fingerprint: str  # SHA-256 of the pool's certificate (DER), hex
    expires: float  # unix time

    def encode(self) -> str:
        raw = json.dumps(asdict(self), separators=(",", ":")).encode()
        return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> JoinToken:
        text = text.strip()
        if not text.startswith(TOKEN_PREFIX):
            raise LinkError("not an nbtrain join token (it starts with 'nbt1.'; copy it from the notebook's cell)")
        body = text[len(TOKEN_PREFIX):]
        try:
            fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            return cls(str(fields["host"]), int(fields["port"]), str(fields["pool"]), str(fields["secret"]),
                       str(fields["fingerprint"]), float(fields["expires"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise LinkError(f"the join token is damaged ({exc}); copy it again from the notebook") from None

    @property
    def key(self) -> bytes:
        return bytes.fromhex(self.secret)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def check_fingerprint(sock: ssl.SSLSocket, expected: str) -> None:
    """The peer's certificate must be exactly the one the token pins."""
    der = sock.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(fingerprint(der), expected):
        raise LinkError("the kernel's TLS certificate is not the one the token names (wrong address, or someone "
                        "in between); nothing was sent")


def client_context() -> ssl.SSLContext:
    """TLS without CA checks: the certificate is checked against the token's fingerprint instead."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _proof(key: bytes, role: bytes, pool: str, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, role + pool.encode() + first + second, hashlib.sha256).digest()


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise LinkError("the peer closed the connection during the handshake")
        data += chunk
    return data


def handshake_client(sock, token: JoinToken) -> None:
    """Node side: prove the secret, then check the kernel proves it too. Raw bytes only."""
    pool = token.pool.encode()
    mine = secrets.token_bytes(_NONCE)
    sock.sendall(struct.pack("!H", len(pool)) + pool + mine)
    theirs = _recv_exact(sock, _NONCE)
    sock.sendall(_proof(token.key, b"node", token.pool, theirs, mine))
    answer = _recv_exact(sock, 32)
    if not hmac.compare_digest(answer, _proof(token.key, b"kernel", token.pool, mine, theirs)):
        raise LinkError("the kernel did not prove it holds the token's secret")


def handshake_server(sock, pool: str, key: bytes) -> None:
    """Kernel side: the node must name this pool and prove the secret before anything else is read."""
    (length,) = struct.unpack("!H", _recv_exact(sock, 2))
    named = _recv_exact(sock, length) if length <= 256 else b""
    theirs = _recv_exact(sock, _NONCE)
    mine = secrets.token_bytes(_NONCE)
    sock.sendall(mine)
    proof = _recv_exact(sock, 32)
    if not hmac.compare_digest(named, pool.encode()):
        raise LinkError("the token belongs to another pool")
    if not hmac.compare_digest(proof, _proof(key, b"node", pool, mine, theirs)):
        raise LinkError("the node does not hold this pool's secret")
    sock.sendall(_proof(key, b"kernel", pool, theirs, mine))


def send_hello(sock, hello: NodeHello) -> str:
    """Node side, after the handshake: say who this node is; the kernel answers with its name in the pool."""
    body = json.dumps({name: getattr(hello, name) for name in _HELLO_FIELDS}).encode()
    sock.sendall(struct.pack("!I", len(body)) + body)
    (length,) = struct.unpack("!H", _recv_exact(sock, 2))
    name = _recv_exact(sock, length).decode("utf-8", "replace")
    if not name:
        raise LinkError("the kernel did not accept this node")
    return name


def read_hello(sock) -> NodeHello:
    """Kernel side: the node's hello, parsed field by field (never unpickled); :class:`ValueError` if malformed."""
    (length,) = struct.unpack("!I", _recv_exact(sock, 4))
    if length > _MAX_HELLO:
        raise ValueError(f"a node's hello of {length} bytes (at most {_MAX_HELLO})")
    fields = json.loads(_recv_exact(sock, length))
    if not isinstance(fields, dict) or not set(_HELLO_FIELDS) - _HELLO_OPTIONAL <= set(fields) <= set(_HELLO_FIELDS):
        raise ValueError("a node's hello without the expected fields")
    for name, value in fields.items():
        kind = _HELLO_FIELDS[name]
        fits = (isinstance(value, str) and len(value) <= 255) if kind is str else \
            (type(value) is int and 0 <= value < 2**32)
        if not fits:
            raise ValueError(f"a node's hello with a bad {name!r}")
    return NodeHello(**fields)


def send_welcome(sock, name: str) -> None:
    data = name.encode()
    sock.sendall(struct.pack("!H", len(data)) + data)


class Link:
    """One authenticated connection: a pump thread does all socket I/O; ``send`` queues, ``incoming`` receives."""

    def __init__(self, sock: ssl.SSLSocket, name: str = "link") -> None:
        self.sock = sock
        self.incoming: queue.SimpleQueue = queue.SimpleQueue()  # messages, then None when the link ends
        self.last_heard = time.monotonic()
        self.last_heartbeat: Heartbeat | None = None
        self.closed = threading.Event()
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._waiters: list[int] = []  # pipes written to when a message arrives (the kernel's event loop)
        self._thread = threading.Thread(target=self._pump, name=f"nbtrain-{name}", daemon=True)
        sock.settimeout(10.0)

    def start(self) -> Link:
        self._thread.start()
        return self

    def notify(self, fd: int) -> None:
        self._waiters.append(fd)

    def send(self, message) -> None:
        if self.closed.is_set():
            return
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._outgoing.put(struct.pack("!Q", len(data)) + data)
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _pump(self) -> None:
        buffer = bytearray()
        try:
            while not self.closed.is_set():
                self._flush_outgoing()
                if not self.sock.pending():
                    ready, _, _ = select.select([self.sock.fileno(), self._wake_r], [], [], 1.0)
                    if self._wake_r in ready:
                        os.read(self._wake_r, 4096)
                    if self.sock.fileno() not in ready:
                        continue
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
                self._deliver(buffer)
            self._flush_outgoing()
        except (OSError, ValueError, pickle.UnpicklingError, EOFError):
            pass
        finally:
            self.closed.set()
            self.incoming.put(None)
            self._wake_waiters()
            with contextlib.suppress(OSError):
                self.sock.close()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _flush_outgoing(self) -> None:
        while not self._outgoing.empty():
            self.sock.sendall(self._outgoing.get())

    def _deliver(self, buffer: bytearray) -> None:
        got = False
        while len(buffer) >= 8:
            (length,) = struct.unpack("!Q", buffer[:8])
            if length > _MAX_FRAME:
                raise ValueError("frame too large")
            if len(buffer) < 8 + length:
                break
            message = pickle.loads(bytes(buffer[8:8 + length]))  # authenticated peer (see the handshake)
            del buffer[:8 + length]
            self.last_heard = time.monotonic()
            if isinstance(message, Heartbeat):  # liveness only: not queued, or an idle link would pile them up
                self.last_heartbeat = message
                continue
            self.incoming.put(message)
            got = True
        if got:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        for fd in self._waiters:
            with contextlib.suppress(OSError):
                os.write(fd, b"x")


def open_tls(host: str, port: int, source_address: str | None = None, timeout: float = 10.0) -> ssl.SSLSocket:
    """Node side: TCP, the kernel's greeting, TLS (the certificate not checked yet: :func:`check_fingerprint`).
    :class:`LinkRetry` for what may pass — busy, unreachable, cut before TLS was up; :class:`LinkError` when
    nothing listens there (a kernel's hub never refuses a connection: it answers busy)."""
    try:
        raw = socket.create_connection((host, port), timeout=timeout,
                                       source_address=(source_address, 0) if source_address else None)
    except ConnectionRefusedError:  # nothing listens: the hub has closed (its pool ended) or the address is wrong
        raise LinkError(f"nothing listens at {host}:{port}: the notebook's pool has ended, or this is not its "
                        "address; take the join command the notebook prints now") from None
    except OSError as exc:  # a timeout, a network unreachable for now
        raise LinkRetry(f"cannot reach the kernel at {host}:{port} ({exc})") from None
    try:
        greeting = _greeting(raw)
        if greeting in (HUB_BUSY, b""):  # b"": hung up at once (a kernel cut off, or over an older cap)
            raise LinkRetry(f"the kernel at {host}:{port} is busy admitting other connections")
        if greeting != HUB_READY:
            raise LinkError(f"{host}:{port} is not an nbtrain kernel's node link (it said {greeting!r})")
        return client_context().wrap_socket(raw)
    except LinkError:
        raw.close()
        raise
    except OSError as exc:
        raw.close()
        raise LinkRetry(f"the connection to the kernel at {host}:{port} broke before TLS was up ({exc})") from None


def _greeting(raw: socket.socket) -> bytes:
    """The kernel's 4 raw bytes before TLS; fewer if it hung up first."""
    data = b""
    while len(data) < len(HUB_READY):
        chunk = raw.recv(len(HUB_READY) - len(data))
        if not chunk:
            break
        data += chunk
    return data


def connect(token: JoinToken, hello: NodeHello, source_address: str | None = None,
            timeout: float = 10.0) -> tuple[Link, str]:
    """Node side: the greeting, TLS with the pinned certificate, the handshake, the hello; a started
    :class:`Link` and the node's name in the pool."""
    if token.expired():
        raise LinkError("the join token has expired; run the cell again for a fresh one")
    sock = open_tls(token.host, token.port, source_address, timeout)
    try:
        check_fingerprint(sock, token.fingerprint)
        handshake_client(sock, token)
        name = send_hello(sock, hello)
    except (OSError, LinkError):
        sock.close()
        raise
    return Link(sock, "node-link").start(), name
