"""The hub: where node agents join the kernel — a TLS listener, the join token, the registry of joined nodes.

One hub per kernel and ``--rdzv-host``, made on the first multi-node cell; it *is* the pool the token names.
It listens on ``--rdzv-host`` (a port the OS picks) with a certificate made for it (:mod:`.tls`). A
connection becomes a node only after TLS, the token's pool and secret checked in the raw-byte handshake
(:func:`nbtrain.wire.link.handshake_server`) and a :class:`~nbtrain.wire.nodes.NodeHello`; a connection that
fails any step is closed without anything of it having been unpickled. The token expires
(:data:`TOKEN_TTL_S`); a node that joined stays joined past that.

Joined nodes are named ``a``, ``b``, ``c`` … in join order and stay joined between cells (warm), so the
next cell's ranks start without anyone pasting a command again. The hub's heartbeat thread sends each node
a :class:`~nbtrain.wire.nodes.Heartbeat` every :data:`HEARTBEAT_S` and forgets a node that has been silent
for :data:`LOST_AFTER_S` (its agent gives up on a silent kernel the same way). :meth:`Hub.close` says
:class:`~nbtrain.wire.nodes.Bye` to every node: their agents exit with the pool.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import string
import threading
import time
from dataclasses import dataclass, field

from ..launch.observer import NodeGpu, NodeInfo
from ..wire import nodes as N
from ..wire.link import JoinToken, Link, LinkError, handshake_server
from .tls import make_certificate, server_context

HEARTBEAT_S = 1.0
LOST_AFTER_S = 5.0
TOKEN_TTL_S = 24 * 3600.0
HANDSHAKE_TIMEOUT_S = 5.0


@dataclass
class NodeConn:
    """A joined node: its name, what it said about itself, its link."""

    name: str
    hello: N.NodeHello
    link: Link
    address: str
    joined_at: float = field(default_factory=time.time)
    state: str = "idle"  # idle | running

    def silent_for(self) -> float:
        return time.monotonic() - self.link.last_heard

    def lost(self) -> bool:
        return self.link.closed.is_set() or self.silent_for() > LOST_AFTER_S

    def info(self, ranks, lost: bool) -> NodeInfo:
        """What observers (the dashboard, the run registry) are told of this node: from its last heartbeat."""
        beat = self.link.last_heartbeat
        sample = beat.telemetry if beat is not None else {}
        gpus = tuple(NodeGpu(*gpu) for gpu in sample.get("gpus", []))
        return NodeInfo(self.name, self.hello.host, self.address, tuple(ranks), "lost" if lost else self.state,
                        time.time() - self.silent_for(), sample.get("cpu_percent"), sample.get("ram_percent"), gpus)


class Hub:
    """The kernel's end of the node links (see the module docstring)."""

    def __init__(self, host: str, token_ttl_s: float = TOKEN_TTL_S) -> None:
        self.host = host
        self.pool_id = secrets.token_hex(8)
        cert, key, print_ = make_certificate(host)
        self._context = server_context(cert, key)
        try:
            self._listener = socket.create_server((host, 0), backlog=64)
        except OSError as exc:
            raise OSError(f"cannot listen on --rdzv-host {host} ({exc.strerror}); give an address of this machine "
                          "that the nodes can reach") from None
        self.port = self._listener.getsockname()[1]
        self.token = JoinToken(host, self.port, self.pool_id, secrets.token_hex(32), print_, time.time() + token_ttl_s)
        self.nodes: list[NodeConn] = []
        self.refused = 0  # connections that failed TLS or the handshake
        self.announced = False  # the join command was printed
        self.wake_r, self.wake_w = os.pipe()  # written when a node sends something (the run's loop waits on it)
        os.set_blocking(self.wake_r, False)
        self._lock = threading.Lock()
        self._names = iter(string.ascii_lowercase)
        self._closed = threading.Event()
        threading.Thread(target=self._accept_loop, name="nbtrain-hub-accept", daemon=True).start()
        threading.Thread(target=self._heartbeat_loop, name="nbtrain-hub-heartbeat", daemon=True).start()

    def join_command(self) -> str:
        return f"python -m nbtrain.node --join {self.host}:{self.port} --token {self.token.encode()}"

    def live_nodes(self) -> list[NodeConn]:
        with self._lock:
            return [n for n in self.nodes if not n.lost()]

    def idle_nodes(self) -> list[NodeConn]:
        return [n for n in self.live_nodes() if n.state == "idle"]

    # ------------------------------------------------------------------------------ joining
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                raw, peer = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._admit, args=(raw, peer[0]), name="nbtrain-hub-admit", daemon=True).start()

    def _admit(self, raw: socket.socket, address: str) -> None:
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            sock = self._context.wrap_socket(raw, server_side=True)
            if self.token.expired():
                raise LinkError("the join token has expired")
            handshake_server(sock, self.pool_id, self.token.key)
        except (OSError, LinkError, ValueError):
            self.refused += 1
            raw.close()
            return
        link = Link(sock, "hub-link").start()  # authenticated: from here on frames are unpickled
        link.notify(self.wake_w)
        hello = link.incoming.get(timeout=HANDSHAKE_TIMEOUT_S)
        if not isinstance(hello, N.NodeHello):
            link.close()
            return
        with self._lock:
            name = next(self._names, f"n{len(self.nodes)}")
            node = NodeConn(name, hello, link, address)
            self.nodes.append(node)
        link.send(N.Welcome(name))
        self.poke()

    def poke(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.wake_r, 4096):
                pass

    # ----------------------------------------------------------------------------- liveness
    def _heartbeat_loop(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            with self._lock:
                gone = [n for n in self.nodes if n.link.closed.is_set() or n.silent_for() > 4 * LOST_AFTER_S]
                self.nodes = [n for n in self.nodes if n not in gone]
            for node in gone:  # lost long ago and not in a run that reports it: forget it
                node.link.close()
            for node in self.live_nodes():
                node.link.send(N.Heartbeat(time.time()))

    def close(self, reason: str = "the notebook's pool ended") -> None:
        """Say Bye to every node (their agents exit) and stop listening."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            nodes, self.nodes = self.nodes, []
        for node in nodes:
            node.link.send(N.Bye(reason))
            node.link.close()
        for node in nodes:
            node.link.join(2.0)
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def describe(self) -> list[str]:
        """One line per joined node, for ``%distributed_nodes``."""
        lines = []
        for node in self.live_nodes():
            h = node.hello
            gpus = f"{h.gpus} GPU{'s' if h.gpus != 1 else ''}" if h.gpus else "no GPU"
            lines.append(f"node {node.name}: {h.host} ({node.address}), pid {h.pid}, {gpus}, {h.cpus} CPUs, {node.state}, "
                         f"heard {node.silent_for():.1f} s ago{_load(node.link.last_heartbeat)}")
        return lines


def _load(beat: N.Heartbeat | None) -> str:
    """What the node's last heartbeat said about its machine: CPU, RAM, each GPU's load and memory."""
    sample = beat.telemetry if beat is not None else {}
    if not sample:
        return ""
    text = f"; CPU {sample.get('cpu_percent', 0):.0f}%, RAM {sample.get('ram_percent', 0):.0f}%"
    for index, load, used, total in sample.get("gpus", []):
        memory = f"{used / 2**30:.1f}/{total / 2**30:.0f} GiB" if used is not None and total else "memory N/A"
        text += f", GPU {index} {load if load is not None else 'N/A'}% {memory}"
    return text
