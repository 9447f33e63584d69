"""The hub: where node agents join the kernel — a TLS listener, the join token, the registry of joined nodes.

One hub per kernel and ``--rdzv-host``, made on the first multi-node cell; it *is* the pool the token names.
It listens on ``--rdzv-host`` (a port the OS picks) with a certificate made for it (:mod:`.tls`). A
connection becomes a node only after TLS, the token's pool and secret checked in the raw-byte handshake
(:func:`nbtrain.wire.link.handshake_server`) and a hello in a fixed raw layout
(:func:`nbtrain.wire.link.read_hello`); a connection that fails any step is closed without anything of it
having been unpickled. Admission is bounded: one deadline (:data:`ADMIT_DEADLINE_S`) for all of it, however
slowly a peer sends, and at most :data:`MAX_ADMISSIONS` at once, :data:`MAX_ADMISSIONS_PER_ADDRESS` of them from
one address, so a flood from one peer leaves the slots for the others. A connection over either cap is told
:data:`~nbtrain.wire.link.HUB_BUSY` and closed at once (no thread held); agents try again with a backoff.

The token (:mod:`.tokens`) lives in a 0600 file, never in what the cell prints; it admits nodes until it
expires (:data:`~.tokens.DEFAULT_TTL_S`, ``--token-ttl``) or is revoked (:meth:`Hub.issue_token`), and an
expired token is replaced when a join command is printed again. A node that joined stays joined.

Joined nodes are named ``a``, ``b``, ``c`` … in join order and stay joined between cells (warm), so the
next cell's ranks start without anyone pasting a command again. The hub's heartbeat thread sends each node
a :class:`~nbtrain.wire.nodes.Heartbeat` every :data:`HEARTBEAT_S` and forgets a node that has been silent
for :data:`LOST_AFTER_S` (its agent gives up on a silent kernel the same way). :meth:`Hub.close` says
:class:`~nbtrain.wire.nodes.Bye` to every node: their agents exit with the pool.

A node's heartbeat carries its machine's load and each GPU as plain JSON values (:func:`nbtrain.node.main.telemetry`);
:func:`heartbeat_gpus` reads them back field by field (:meth:`~nbtrain.gpu.devices.GpuStatus.from_json`), so a
node that sends junk — the wrong types, huge numbers or lists, nesting — gets N/A where it lied, never an exception
here, and an older agent's ``(index, load, used, total, health line)`` still reads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...gpu import jsonfields as J
from ...gpu.devices import GpuStatus
from ..observers.events import NodeGpu, NodeInfo, NodeState
from ...wire import nodes as N
from ...wire.link import HUB_BUSY, HUB_READY, JoinToken, Link, LinkError, handshake_server, read_hello, send_welcome
from .tls import make_certificate, server_context
from .tokens import DEFAULT_TTL_S, TokenFile

HEARTBEAT_S = 1.0
LOST_AFTER_S = 5.0
ADMIT_DEADLINE_S = 5.0  # TLS, handshake and hello together, however slowly the peer sends
MAX_ADMISSIONS = 8  # connections being admitted at once; more are told busy and closed at once
MAX_ADMISSIONS_PER_ADDRESS = 2  # of those, from one address: an agent needs one; a flood gets no more
MAX_GPUS = 64  # GPUs a heartbeat may list; a longer list is not read
MAX_NODES = 1024  # nodes a detached run's agent may report; a longer list is not read
MAX_RANKS = 1 << 16  # ranks of one node


@dataclass
class NodeConn:
    """A joined node: its name, what it said about itself, its link."""

    name: str
    hello: N.NodeHello
    link: Link
    address: str
    joined_at: float = field(default_factory=time.time)
    state: NodeState = NodeState.IDLE

    def silent_for(self) -> float:
        return time.monotonic() - self.link.last_heard

    def lost(self) -> bool:
        return self.link.closed.is_set() or self.silent_for() > LOST_AFTER_S

    def info(self, ranks, lost: bool) -> NodeInfo:
        """What observers (the dashboard, the run registry) are told of this node: from its last heartbeat."""
        beat = self.link.last_heartbeat
        sample = beat.telemetry if beat is not None else {}
        return NodeInfo(self.name, self.hello.host, self.address, tuple(ranks), NodeState.LOST if lost else self.state,
                        time.time() - self.silent_for(), *heartbeat_load(sample), heartbeat_gpus(sample), self.hello.cpus)


def heartbeat_gpus(sample) -> tuple[NodeGpu, ...]:
    """A heartbeat's GPUs (:func:`nbtrain.node.main.telemetry`), each a dict checked field by field
    (:meth:`~nbtrain.gpu.devices.GpuStatus.from_json`), or, from older agents, ``(index, load, used, total[,
    health line])``. What does not read as a GPU is left out and a field that does not read is N/A: whatever a
    node sends, this never raises."""
    entries = J.items(sample.get("gpus") if isinstance(sample, dict) else None, MAX_GPUS) or []
    return tuple(gpu for gpu in map(_node_gpu, entries) if gpu is not None)


def _node_gpu(entry) -> NodeGpu | None:
    if isinstance(entry, dict):
        status = GpuStatus.from_json(entry)
        return None if status is None else NodeGpu(status)
    old = J.items(entry, 5)
    if old is None or len(old) < 4 or J.whole(old[0]) is None:
        return None
    index, load, used, total, *line = old
    return NodeGpu(GpuStatus(index, "", "", J.whole(load), J.whole(used), J.whole(total), None, None, None, None),
                   (J.text(line[0]) if line else None) or "")


def heartbeat_load(sample) -> tuple[float | None, float | None]:
    """A heartbeat's CPU and RAM use, percent (N/A when not a number)."""
    sample = sample if isinstance(sample, dict) else {}
    return J.number(sample.get("cpu_percent")), J.number(sample.get("ram_percent"))


def node_sample(node: NodeConn, ranks, lost: bool) -> dict:
    """One node as plain JSON values, for a detached run's agent to send its kernel with its own heartbeat
    (:mod:`nbtrain.node.relay`): the node's last heartbeat's load and GPUs, and who and where it is."""
    beat = node.link.last_heartbeat
    sample = dict(beat.telemetry) if beat is not None and isinstance(beat.telemetry, dict) else {}
    sample.update(name=node.name, host=node.hello.host, address=node.address, ranks=list(ranks),
                  state=(NodeState.LOST if lost else node.state).value, silent_for=node.silent_for(),
                  cpus=node.hello.cpus)
    return sample


def sampled_info(entry) -> NodeInfo | None:
    """A node as a detached run's agent reported it (:func:`node_sample`), read field by field: N/A where a value
    does not read, None for what is not a node at all; never an exception."""
    if not isinstance(entry, dict) or J.text(entry.get("name"), 16) is None:
        return None
    state = next((s for s in NodeState if s.value == entry.get("state")), NodeState.LOST)
    silent = J.number(entry.get("silent_for"))
    return NodeInfo(J.text(entry.get("name"), 16) or "", J.text(entry.get("host")) or "",
                    J.text(entry.get("address")) or "", J.wholes(entry.get("ranks"), MAX_RANKS) or (), state,
                    time.time() - (silent if silent is not None and silent >= 0 else 0.0), *heartbeat_load(entry),
                    heartbeat_gpus(entry), J.whole(entry.get("cpus")))


class Hub:
    """The kernel's end of the node links (see the module docstring)."""

    def __init__(self, host: str, token_ttl_s: float = DEFAULT_TTL_S, token_dir: str | None = None,
                 private: bool = False) -> None:
        """``private``: the hub of one agent this kernel starts itself (a detached run's), which gets its token on
        stdin: no token file is written, so a kernel killed meanwhile leaves no secret on disk."""
        self.host = host
        self.pool_id = secrets.token_hex(8)
        cert, key, self._fingerprint = make_certificate(host)
        self._context = server_context(cert, key)
        try:
            self._listener = socket.create_server((host, 0), backlog=64)
        except OSError as exc:
            raise OSError(f"cannot listen on --rdzv-host {host} ({exc.strerror}); give an address of this machine "
                          "that the nodes can reach") from None
        self.port = self._listener.getsockname()[1]
        self.token_file = None if private else TokenFile(self.pool_id, token_dir)
        self.token_ttl_s = token_ttl_s
        self.token = self.issue_token()
        self.nodes: list[NodeConn] = []
        self.refused = 0  # connections that failed TLS, the handshake or the hello, or came over the cap
        self._announced = False  # the join command was printed (announce())
        self.wake_r, self.wake_w = os.pipe()  # written when a node sends something (the run's loop waits on it)
        os.set_blocking(self.wake_r, False)
        self._lock = threading.Lock()
        self._admitting: dict[str, int] = {}  # address -> its connections being admitted now
        self._deadlines: dict[int, float] = {}  # socket fd being admitted -> when its admission must be over
        self._names = iter(string.ascii_lowercase)
        self._closed = threading.Event()
        threading.Thread(target=self._accept_loop, name="nbtrain-hub-accept", daemon=True).start()
        threading.Thread(target=self._heartbeat_loop, name="nbtrain-hub-heartbeat", daemon=True).start()

    # ------------------------------------------------------------------------------- the token
    def issue_token(self, ttl_s: float | None = None) -> JoinToken:
        """A new secret (the old token stops admitting nodes), valid ``ttl_s``, written to the token file."""
        if ttl_s is not None:
            self.token_ttl_s = ttl_s
        self.token = JoinToken(self.host, self.port, self.pool_id, secrets.token_hex(32), self._fingerprint,
                               time.time() + self.token_ttl_s)
        if self.token_file is not None:
            self.token_file.write(self.token.encode())
        return self.token

    @property
    def token_path(self) -> str:
        """The token file's path (a private hub has none: its one agent got the token on stdin)."""
        if self.token_file is None:
            raise RuntimeError("a private hub writes no token file: its agent gets the token on stdin")
        return self.token_file.path

    def valid_token(self) -> str:
        """The token to hand to an agent this kernel starts (stdin, never argv); an expired one is replaced."""
        if self.token.expired():
            self.issue_token()
        return self.token.encode()

    def join_command(self) -> str:
        """The command that joins a node; it names the token's file, never the token (outputs are saved)."""
        self.valid_token()
        return f"python -m nbtrain.node --join {self.host}:{self.port} --token-file {self.token_path}"

    def join_help(self) -> str:
        """Where the token is and how to hand it to a node on another machine, under the join command."""
        left = max(0.0, self.token.expires - time.time())
        return (f"(the token is a secret: it stays in that file, mode 0600, valid {_duration(left)}; on a machine "
                f"that does not share this home directory, give --token - instead and pipe the file in: "
                f"ssh NODE '… --token -' < {self.token_path})")

    def announce(self) -> bool:
        """True the first time only: whether the join command still needs printing (it is printed once)."""
        with self._lock:
            first, self._announced = not self._announced, True
        return first

    def mark_running(self, node: NodeConn) -> None:
        node.state = NodeState.RUNNING

    def mark_idle(self, node: NodeConn) -> None:
        if node.state is not NodeState.LEAVING:
            node.state = NodeState.IDLE

    def mark_leaving(self, node: NodeConn) -> None:
        node.state = NodeState.LEAVING

    def dismiss(self, which: Callable[[NodeConn], bool], reason: str) -> None:
        """The nodes ``which`` picks leave now (their agents exit on the Bye) and are offered to no cell again."""
        with self._lock:
            gone = [n for n in self.nodes if which(n)]
            self.nodes = [n for n in self.nodes if n not in gone]
        for node in gone:
            node.link.send(N.Bye(reason))
            node.link.close()

    def live_nodes(self) -> list[NodeConn]:
        with self._lock:
            return [n for n in self.nodes if not n.lost()]

    def idle_nodes(self) -> list[NodeConn]:
        return [n for n in self.live_nodes() if n.state is NodeState.IDLE]

    # ------------------------------------------------------------------------------ joining
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                raw, peer = self._listener.accept()
            except OSError:
                return
            if not self._take_slot(peer[0]):  # a flood of connections holds no more threads
                self.refused += 1
                _answer(raw, HUB_BUSY)
                raw.close()
                continue
            _answer(raw, HUB_READY)
            threading.Thread(target=self._admit, args=(raw, peer[0]), name="nbtrain-hub-admit", daemon=True).start()

    def _admit(self, raw: socket.socket, address: str) -> None:
        fd = raw.fileno()
        with self._lock:
            self._deadlines[fd] = time.monotonic() + ADMIT_DEADLINE_S
        raw.settimeout(ADMIT_DEADLINE_S)
        sock = None
        try:
            sock = self._context.wrap_socket(raw, server_side=True)
            if self.token.expired():
                raise LinkError("the join token has expired")
            handshake_server(sock, self.pool_id, self.token.key)
            hello = read_hello(sock)
        except (OSError, LinkError, ValueError):
            self.refused += 1
            with self._lock:
                self._deadlines.pop(fd, None)
            (sock or raw).close()
            return
        finally:
            self._free_slot(address)
        with self._lock:
            self._deadlines.pop(fd, None)
            name = next(self._names, f"n{len(self.nodes)}")
        try:
            send_welcome(sock, name)
        except OSError:
            sock.close()
            return
        link = Link(sock, "hub-link").start()  # admitted: from here on frames are unpickled
        link.notify(self.wake_w)
        with self._lock:
            self.nodes.append(NodeConn(name, hello, link, address))
        self.poke()

    def _take_slot(self, address: str) -> bool:
        """An admission slot for a connection from ``address``; False over either cap."""
        with self._lock:
            held = self._admitting.get(address, 0)
            if held >= MAX_ADMISSIONS_PER_ADDRESS or sum(self._admitting.values()) >= MAX_ADMISSIONS:
                return False
            self._admitting[address] = held + 1
            return True

    def _free_slot(self, address: str) -> None:
        with self._lock:
            left = self._admitting.pop(address) - 1
            if left:
                self._admitting[address] = left

    def _end_overdue_admissions(self) -> None:
        """A peer that trickles bytes passes every per-read timeout: its admission ends at one deadline."""
        now = time.monotonic()
        with self._lock:
            for fd in [fd for fd, deadline in self._deadlines.items() if deadline < now]:
                del self._deadlines[fd]
                with contextlib.suppress(OSError):
                    twin = socket.socket(fileno=os.dup(fd))  # shutdown acts on the socket, whichever fd names it
                    twin.shutdown(socket.SHUT_RDWR)
                    twin.close()

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
            self._end_overdue_admissions()
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
        if self.token_file is not None:
            self.token_file.remove()

    def describe(self) -> list[str]:
        """One line per joined node, for ``%distributed_nodes``."""
        lines = []
        for node in self.live_nodes():
            h = node.hello
            gpus = f"{h.gpus} GPU{'s' if h.gpus != 1 else ''}" if h.gpus else "no GPU"
            lines.append(f"node {node.name}: {h.host} ({node.address}), pid {h.pid}, {gpus}, {h.cpus} CPUs, {node.state.value}, "
                         f"heard {node.silent_for():.1f} s ago{_load(node.link.last_heartbeat)}")
        return lines


def _answer(raw: socket.socket, greeting: bytes) -> None:
    """The greeting before TLS, without waiting: a fresh socket's buffer takes 4 bytes, or the peer is gone."""
    with contextlib.suppress(OSError):
        raw.setblocking(False)
        raw.send(greeting)
        raw.setblocking(True)


def _load(beat: N.Heartbeat | None) -> str:
    """What the node's last heartbeat said about its machine: CPU, RAM, each GPU's load and memory."""
    sample = beat.telemetry if beat is not None else {}
    if not sample:
        return ""
    cpu, ram = heartbeat_load(sample)
    text = f"; CPU {_percent(cpu)}, RAM {_percent(ram)}"
    for gpu in heartbeat_gpus(sample):
        g = gpu.status
        memory = f"{g.memory_used / 2**30:.1f}/{g.memory_total / 2**30:.0f} GiB" if g.memory_used is not None and g.memory_total else "memory N/A"
        text += f", GPU {g.index} {_percent(g.utilization)} {memory}"
    return text


def _percent(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.0f}%"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h more"
    return f"{seconds / 60:.0f} min more"
