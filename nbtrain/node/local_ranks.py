"""A node's local ranks as the kernel sees them: their channel, their output, their exits, their signals.

:class:`LocalRanks` is the relay between the node's ranks and the kernel's link:

* **channel** — :class:`~nbtrain.wire.ranksocket.RankListener`, the kernel pool's too: a UNIX socket in the agent's
  private directory (0700), with a random key in a 0600 file there (``NBTRAIN_KEY_FILE``): the same HMAC
  challenge before any unpickling as on one machine. A rank says ``Hello``; from then its messages go to the kernel
  as the bytes it pickled (:class:`~nbtrain.wire.nodes.RankMessage`); the node reads only ``Loaded``;
* **jobs** — a :class:`~nbtrain.wire.nodes.Deliver` arrives once per node: its shared-memory files are
  written to this machine's ``/dev/shm`` under the agent's own prefix (the ranks map them there:
  ``NBTRAIN_SHM_REMAP``, :func:`nbtrain.wire.shm.node_path`), and its bytes go to every local rank, in order,
  also to ranks that connect later. The files go when every local rank has loaded them, or with the ranks;
* **output** — torch elastic's agent redirects each rank's stdout and stderr to files (as ``torchrun
  --redirects``); a thread tails them every :data:`TAIL_S` and sends what is new as
  :class:`~nbtrain.wire.nodes.RankOutput`; an exit (:class:`~nbtrain.wire.nodes.RankExited`, with torch
  elastic's error file) is sent after the rank's last output; :attr:`LocalRanks.idle` is set when every local
  rank has ended (the agent's thread then says :class:`~nbtrain.wire.nodes.RanksStopped`);
* **signals** — the stop button is one SIGINT to each rank and its descendants; stopping is SIGTERM, then
  SIGKILL, to each rank's session and descendants.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import pickle
import secrets
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from ..common import proctree
from ..wire.ranksocket import RankListener
from ..wire import nodes as N
from ..wire import protocol as P
from ..wire.shm import owner_prefix, write_file
from ..wire.stackfiles import request_stacks
from ..wire.stop_marks import announce as announce_stopping

TAIL_S = 0.05
STOP_GRACE_S = 1.0


@dataclass
class _Rank:
    rank: int
    local_rank: int
    pid: int
    popen: object  # subprocess.Popen, owned by torch elastic's process context
    logs: dict  # stream -> path
    offsets: dict = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    decoders: dict = field(default_factory=lambda: {s: codecs.getincrementaldecoder("utf-8")("replace")
                                                    for s in ("stdout", "stderr")})
    error_file: str | None = None
    exit_code: int | None = None


class LocalRanks:
    """See the module docstring. ``send`` puts a message on the kernel's link."""

    def __init__(self, directory: str, send) -> None:
        self.dir = directory
        self.send = send
        self.key = secrets.token_bytes(32)
        self.key_file = os.path.join(directory, "key")
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.key.hex())
        self.address = os.path.join(directory, "node.sock")
        self.shm_prefix = f"{owner_prefix()}k"  # this agent's files: swept with it if it dies
        self._listener = RankListener(self.address, key=self.key)
        self._lock = threading.Lock()
        self._conns: dict[int, Connection] = {}
        self._ranks: dict[int, _Rank] = {}
        self._deliveries: list[bytes] = []
        self._files: list[str] = []
        self._loaded: set[int] = set()
        self._running = False
        self.idle = threading.Event()  # no rank of ours is alive
        self.idle.set()
        self._listener.serve(self._admit, name="nbtrain-node-accept")
        threading.Thread(target=self._tail_loop, name="nbtrain-node-tail", daemon=True).start()

    # ------------------------------------------------------------------------------ ranks in
    def started(self, ranks: list[_Rank]) -> None:
        with self._lock:
            self._ranks = {r.rank: r for r in ranks}
            self._running = True
            self.idle.clear()
        self.send(N.RanksStarted("", {r.rank: (r.local_rank, r.pid) for r in ranks}))

    def _admit(self, hello: P.Hello, conn: Connection) -> bool:
        """An authenticated rank said Hello: the job's bytes so far, then a thread reading what it says."""
        with self._lock:
            self._conns[hello.rank] = conn
            for data in self._deliveries:
                _send_bytes(conn, data)
        threading.Thread(target=self._read_loop, args=(hello.rank, conn), name="nbtrain-node-rank",
                         daemon=True).start()
        return True

    def _read_loop(self, rank: int, conn: Connection) -> None:
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                return
            if len(data) < 256 and isinstance(pickle.loads(data), P.Loaded):  # a rank of ours, authenticated
                self._one_loaded(rank)
            self.send(N.RankMessage(rank, data))

    def _one_loaded(self, rank: int) -> None:
        with self._lock:
            self._loaded.add(rank)
            done = self._ranks and self._loaded >= set(self._ranks)
        if done:
            self.remove_files()

    # ---------------------------------------------------------------------------- jobs down
    def deliver(self, message: N.Deliver) -> None:
        for path, data in message.files:
            local = self.shm_prefix + os.path.basename(path).split("-", 2)[-1]
            write_file(local, memoryview(data), self._files)
        with self._lock:
            self._loaded.clear()
            self._deliveries.append(message.job)
            for conn in self._conns.values():
                _send_bytes(conn, message.job)

    def send_one(self, message: N.ToRank) -> None:
        """One rank's message; a rank gone since is reported by its exit, not here."""
        with self._lock:
            conn = self._conns.get(message.rank)
        if conn is not None:
            with contextlib.suppress(OSError):
                _send_bytes(conn, message.data)

    def remove_files(self) -> None:
        with self._lock:
            files, self._files = self._files, []
        for path in files:
            with contextlib.suppress(OSError):
                os.unlink(path)

    # ------------------------------------------------------------------------- output, exits
    def _tail_loop(self) -> None:
        while True:
            time.sleep(TAIL_S)
            with self._lock:
                ranks = list(self._ranks.values()) if self._running else []
            for r in ranks:
                if r.exit_code is not None:
                    continue
                code = r.popen.poll()  # type: ignore[attr-defined]
                self._send_output(r)
                if code is not None:
                    time.sleep(TAIL_S)  # the last bytes a dying process wrote
                    self._send_output(r, final=True)
                    r.exit_code = code
                    self.send(N.RankExited(r.rank, code, _error_message(r, code)))
            if ranks and all(r.exit_code is not None for r in ranks):
                self._all_ended()

    def _send_output(self, r: _Rank, final: bool = False) -> None:
        for stream, path in r.logs.items():
            try:
                with open(path, "rb") as f:
                    f.seek(r.offsets[stream])
                    data = f.read(1 << 20)
            except OSError:
                continue
            r.offsets[stream] += len(data)
            text = r.decoders[stream].decode(data, final=final)
            if text:
                self.send(N.RankOutput(r.rank, stream, text))

    def _all_ended(self) -> None:
        with self._lock:
            self._running = False
            self._ranks, self._deliveries = {}, []
            conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()
        self.remove_files()
        self.idle.set()  # the agent's thread says RanksStopped once torch elastic is done with the store too

    # ------------------------------------------------------------------------------- signals
    def pids(self) -> list[int]:
        with self._lock:
            return [r.pid for r in self._ranks.values() if r.exit_code is None]

    def dump_stacks(self, message: N.DumpStacks) -> None:
        """The Python stacks of the asked ranks of this node (faulthandler's files), sent to the kernel."""
        with self._lock:
            targets = {r.rank: (r.pid, os.path.join(self.dir, f"stack-{r.local_rank}.txt"))
                       for r in self._ranks.values() if r.rank in message.ranks and r.exit_code is None}
        self.send(N.Stacks(request_stacks(targets, message.wait) if targets else {}))

    def interrupt(self) -> None:
        """The stop button: one SIGINT to each rank and its descendants (:func:`nbtrain.common.proctree.interrupt`)."""
        proctree.interrupt(self.pids())

    def shut_down(self) -> None:
        """Every rank finished the cell and no kernel will send another: they leave the group and exit 0."""
        shutdown = pickle.dumps(P.Shutdown(), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            _send_bytes(conn, shutdown)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL, to every rank's session and descendants (:func:`nbtrain.common.proctree.stop`), announced
        first on their channel: this SIGTERM is no preemption notice (:mod:`nbtrain.rank.stop`)."""
        stopping = pickle.dumps(P.Stopping(), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            _send_bytes(conn, stopping)
        pids = self.pids()
        marks = announce_stopping(self.dir, pids)
        with self._lock:
            self._files.extend(marks)
        proctree.stop(pids, grace)

    def running(self) -> bool:
        with self._lock:
            return self._running

    def more_telemetry(self) -> dict:
        """What the agent's heartbeats and a detached run's record add to the machine's telemetry: nothing here
        (a relay adds its nodes: :meth:`~.relay.RelayRanks.more_telemetry`)."""
        return {}

    def close(self) -> None:
        self._listener.close()
        self.remove_files()


def _send_bytes(conn: Connection, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.send_bytes(data)


def _error_message(r: _Rank, code: int) -> str | None:
    """The error the rank's ``@record`` wrote (torch elastic's error file), if it wrote one."""
    if code == 0 or not r.error_file or not os.path.exists(r.error_file):
        return None
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    message = ProcessFailure(local_rank=r.local_rank, pid=r.pid, exitcode=code, error_file=r.error_file).message
    if isinstance(message, dict):
        message = message.get("extraInfo", {}).get("py_callstack") or message.get("message")
    return message
