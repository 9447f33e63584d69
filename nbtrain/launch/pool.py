"""WorkerPool: N rank processes, the store they meet at, and the channel to each — kept warm between cells.

Start-up, for a :class:`~nbtrain.launch.config.PoolSpec`:

* a private directory (mode 0700) holds the kernel's UNIX socket, a
  :class:`multiprocessing.connection.Listener` with a random 32-byte key: a peer that does not know the
  key fails the HMAC challenge before anything is unpickled;
* the kernel hosts the rendezvous store (a c10d ``TCPStore`` listening on 127.0.0.1 only, port chosen by
  the OS — never a fixed 29500 that another notebook may hold), and the ranks join it as torchrun's ranks join the
  agent's store (``TORCHELASTIC_USE_AGENT_STORE=True``, ``init_method="env://"``). Moving to several
  machines means hosting that store elsewhere (c10d rendezvous), not changing the ranks;
* each rank is spawned — ``python -m nbtrain.worker`` through :mod:`subprocess`, a fresh interpreter,
  never a fork of the kernel — in its own session (process group), so signals reach it and its
  DataLoader workers together, with stdin, stdout and stderr as pipes. The key goes down stdin; the rank
  treats stdin's end as the kernel's death.

Events: :meth:`WorkerPool.poll_events` waits on every socket and pipe at once and returns what arrived:
messages, output chunks and exits. The run (:mod:`nbtrain.launch.run`) decides what they mean.

Teardown (:meth:`WorkerPool.stop`): a polite Shutdown (barrier, destroy the group) when the pool is
healthy; then SIGTERM → SIGKILL to every rank's process group and every descendant found through
psutil, with a short grace between steps; then the socket, the store and the directory go. The stop
button (:meth:`WorkerPool.interrupt`) sends one SIGINT to each process first.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener, wait

import psutil

from . import protocol as P
from .config import PoolSpec
from .errors import RankFailure

_pool_ids = itertools.count(1)


@dataclass
class RankProcess:
    rank: int
    popen: subprocess.Popen
    error_file: str
    conn: object | None = None
    conn_pending: object | None = None
    device: str | None = None
    decoders: dict = field(default_factory=dict)
    open_streams: set = field(default_factory=lambda: {"stdout", "stderr"})
    exit_code: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass(frozen=True)
class Message:
    rank: int
    message: object


@dataclass(frozen=True)
class Output:
    rank: int
    stream: str  # "stdout" | "stderr"
    text: str


@dataclass(frozen=True)
class Exited:
    rank: int
    code: int  # negative: killed by that signal


def _worker_env(spec: PoolSpec, rank: int, port: int, socket_path: str, run_id: str, error_file: str) -> dict:
    env = dict(os.environ)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default",
        WORLD_SIZE=str(spec.nprocs), LOCAL_WORLD_SIZE=str(spec.nprocs), ROLE_WORLD_SIZE=str(spec.nprocs),
        GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_ERROR_FILE=error_file,
        NBTRAIN_SOCKET=socket_path, NBTRAIN_BACKEND=spec.backend, NBTRAIN_DEVICE_TYPE=spec.device_type,
        NBTRAIN_TIMEOUT=str(spec.timeout_s), NBTRAIN_KERNEL_PID=str(os.getpid()), CUDA_DEVICE_ORDER="PCI_BUS_ID",
        CUDA_VISIBLE_DEVICES=",".join(str(i) for i in spec.gpu_ids),
    )
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // spec.nprocs)))
    if "lo" in psutil.net_if_addrs():  # one machine: keep gloo's and NCCL's sockets off the network
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    # The kernel's own package path first, so ranks import the same nbtrain as the notebook.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "module://nbtrain.worker.figures"  # the kernel's inline one needs IPython; --env wins
    env.update(dict(spec.env))
    return env


class WorkerPool:
    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self.pool_id = next(_pool_ids)
        self.ranks: list[RankProcess] = []
        self.ready = False
        self.broken = False
        self.created = time.monotonic()
        self.module_stamps: dict[str, tuple] = {}  # path -> stamp of the user's modules the ranks imported
        self.rank_path: tuple[str, ...] = ()  # the ranks' own sys.path (see nbtrain.launch.modules)
        self._dir = tempfile.mkdtemp(prefix="nbtrain-")
        os.chmod(self._dir, 0o700)
        self._key = secrets.token_bytes(32)
        self._listener: Listener | None = None
        self._accept_thread = threading.Thread()
        self._store = None
        self._job_ids = itertools.count(1)
        self.run_id = f"nbtrain-{os.getpid()}-{self.pool_id}"
        self._accepted: queue.SimpleQueue = queue.SimpleQueue()

    # ----------------------------------------------------------------------------------- start-up
    def spawn(self) -> None:
        """Start the ranks; they connect and rendezvous in the background (see :meth:`poll_events`)."""
        import torch.distributed as dist  # the kernel imports torch, never initialises CUDA

        socket_path = os.path.join(self._dir, "kernel.sock")
        self._listener = Listener(socket_path, family="AF_UNIX", authkey=self._key, backlog=max(8, self.spec.nprocs))
        # Bind the store's socket ourselves: given a host, TCPStore still listens on every interface.
        # The store takes the descriptor over (and closes it when it goes).
        listening = socket.create_server(("127.0.0.1", 0), backlog=128)
        port = listening.getsockname()[1]
        self._store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                                    master_listen_fd=listening.detach())
        run_id = self.run_id
        for rank in range(self.spec.nprocs):
            error_file = os.path.join(self._dir, f"error-{rank}.json")
            env = _worker_env(self.spec, rank, self._store.port, socket_path, run_id, error_file)
            env["NBTRAIN_STACK_FILE"] = os.path.join(self._dir, f"stack-{rank}.txt")
            popen = subprocess.Popen(
                [sys.executable, "-m", "nbtrain.worker"], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
            )
            popen.stdin.write(self._key.hex().encode() + b"\n")
            popen.stdin.flush()
            for stream in ("stdout", "stderr"):
                os.set_blocking(getattr(popen, stream).fileno(), False)
            self.ranks.append(RankProcess(rank, popen, error_file,
                                          decoders={s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}))
        self._accept_thread = threading.Thread(target=self._accept_loop, name="nbtrain-accept", daemon=True)
        self._accept_thread.start()

    def _accept_loop(self) -> None:
        """Accept each rank's authenticated connection; runs in a thread until all are in or closed."""
        pending = {r.pid: r for r in self.ranks}
        listener = self._listener
        while pending and self._listener is not None:
            try:
                conn = listener.accept()
                hello = conn.recv()
            except (OSError, EOFError):
                return  # the listener was closed: the pool is stopping
            except Exception:
                continue  # a peer without the key: refused before anything was unpickled
            rank = pending.pop(hello.pid, None) if isinstance(hello, P.Hello) else None
            if rank is None:
                conn.close()
                continue
            rank.conn_pending = conn
            self._accepted.put(rank)
        if not pending:  # every rank is in: nothing may connect any more
            with contextlib.suppress(OSError):
                listener.close()

    def next_job_id(self) -> int:
        return next(self._job_ids)

    # -------------------------------------------------------------------------------------- events
    def send_all(self, message) -> None:
        for r in self.ranks:
            if r.conn is not None:
                r.conn.send(message)

    def poll_events(self, timeout: float) -> list:
        """Wait up to ``timeout`` for anything from the ranks; return the events, output first."""
        while not self._accepted.empty():
            r = self._accepted.get()
            r.conn = r.conn_pending
        if len([r for r in self.ranks if r.conn is not None]) < len(self.ranks):
            timeout = min(timeout, 0.05)  # connections still arriving through the accept thread
        sources = {}
        for r in self.ranks:
            if r.conn is not None:
                sources[r.conn] = (r, "conn")
            for stream in r.open_streams:
                sources[getattr(r.popen, stream)] = (r, stream)
        events: list = []
        for ready in wait(list(sources), timeout) if sources else time.sleep(timeout) or []:
            r, what = sources[ready]
            if what == "conn":
                try:
                    events.append(Message(r.rank, r.conn.recv()))
                except (EOFError, OSError):
                    r.conn = None
            else:
                events.extend(self._read_stream(r, what))
        for r in self.ranks:
            if r.exit_code is None and r.popen.poll() is not None:
                r.exit_code = r.popen.returncode
                events.extend(self._drain(r))
                events.append(Exited(r.rank, r.exit_code))
        return events

    def _read_stream(self, r: RankProcess, stream: str) -> list:
        try:
            data = os.read(getattr(r.popen, stream).fileno(), 1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            r.open_streams.discard(stream)
            text = r.decoders[stream].decode(b"", final=True)
        else:
            text = r.decoders[stream].decode(data)
        return [Output(r.rank, stream, text)] if text else []

    def _drain(self, r: RankProcess) -> list:
        """Everything a dead rank still had in its pipes (its last words are often the cause)."""
        events: list = []
        for stream in list(r.open_streams):
            for _ in range(64):
                if stream not in r.open_streams:
                    break
                got = self._read_stream(r, stream)
                if not got:
                    break
                events.extend(got)
        return events

    def describe_exit(self, rank: int, code: int) -> RankFailure:
        """How a rank ended, with the error its ``@record`` wrote (torch elastic's error file), if any."""
        r = self.ranks[rank]
        message = None
        if os.path.exists(r.error_file):
            from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

            message = ProcessFailure(local_rank=rank, pid=r.pid, exitcode=code, error_file=r.error_file).message
            if isinstance(message, dict):  # torch elastic's JSON: {"message": ..., "extraInfo": {"py_callstack": ...}}
                message = message.get("extraInfo", {}).get("py_callstack") or message.get("message")
        return RankFailure(rank, exit_code=code, error_file_message=message)

    # ----------------------------------------------------------------------------------- lifecycle
    def alive(self) -> bool:
        return self.ready and not self.broken and all(r.popen.poll() is None for r in self.ranks)

    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    def dump_stacks(self, wait: float = 0.5, ranks=None) -> dict[int, str]:
        """Live ranks' Python stacks (faulthandler on SIGUSR1), collected within ``wait`` seconds."""
        paths = {r.rank: os.path.join(self._dir, f"stack-{r.rank}.txt") for r in self.ranks
                 if r.popen.poll() is None and (ranks is None or r.rank in ranks)}
        sizes = {rank: _size(path) for rank, path in paths.items()}
        for rank in paths:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.ranks[rank].pid, signal.SIGUSR1)
        deadline, dumps = time.monotonic() + wait, {}
        while time.monotonic() < deadline and len(dumps) < len(paths):
            time.sleep(0.05)
            for rank, path in paths.items():
                size = _size(path)
                if rank not in dumps and size > sizes[rank] and size == self._settled(path, size):
                    with open(path) as fh:
                        fh.seek(sizes[rank])
                        dumps[rank] = fh.read()
        return dumps

    @staticmethod
    def _settled(path: str, size: int) -> int:
        time.sleep(0.02)  # faulthandler writes a dump in a burst; a stable size means it is complete
        return _size(path)

    def interrupt(self) -> None:
        """The stop button: exactly one SIGINT to each process of the pool, the ranks and their descendants.

        Not the process group as well: a second SIGINT a few milliseconds later would land in the cleanup
        the first one started (a DataLoader iterator's ``__del__``, a worker's exit) and print tracebacks.
        """
        seen = set()
        for p in self._family():
            if p.pid not in seen:
                seen.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGINT)

    def stop(self, graceful: bool = True, grace: float = 1.0) -> None:
        """End every process of this pool, politely if it is healthy, surely in any case; free it all."""
        self.terminate(graceful, grace)
        self.close()

    def terminate(self, graceful: bool = True, grace: float = 1.0) -> None:
        """End every process: Shutdown if healthy, then SIGTERM → SIGKILL to all of them and their children."""
        if graceful and self.alive():
            try:
                self.send_all(P.Shutdown())
                self._wait_exit(grace * 2)
            except OSError:
                pass
        family = self._family()
        for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
            if not _alive(family):
                break
            self._signal_all(sig, family)
            psutil.wait_procs(_alive(family), timeout=wait_s)
        for r in self.ranks:
            try:
                r.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Close pipes, connections, the socket and the store (after :meth:`terminate`)."""
        for r in self.ranks:
            for pipe in (r.popen.stdin, r.popen.stdout, r.popen.stderr):
                try:
                    pipe.close()
                except OSError:
                    pass
            if r.conn is not None:
                r.conn.close()
                r.conn = None
            r.open_streams.clear()
        self._close_endpoints()

    def _wait_exit(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(r.popen.poll() is None for r in self.ranks):
            time.sleep(0.02)

    def _family(self) -> list[psutil.Process]:
        """The ranks and all their descendants (DataLoader workers, a cell's own subprocesses)."""
        procs = []
        for r in self.ranks:
            try:
                p = psutil.Process(r.pid)
                procs.append(p)
                procs.extend(p.children(recursive=True))
            except psutil.Error:
                pass
        return procs

    def _signal_all(self, sig: int, family: list | None = None) -> None:
        for r in self.ranks:
            if r.popen.poll() is None:
                try:
                    os.killpg(r.pid, sig)  # the rank's session: itself and children that stayed in it
                except (ProcessLookupError, PermissionError):
                    pass
        for p in family if family is not None else self._family():
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def _close_endpoints(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            if self._accept_thread.is_alive():  # wake its blocking accept(): close() alone does not
                with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as poke:
                    poke.connect(listener.address)
                self._accept_thread.join(1.0)
            listener.close()
        self._store = None
        shutil.rmtree(self._dir, ignore_errors=True)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
