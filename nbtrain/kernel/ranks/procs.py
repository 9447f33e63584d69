"""The process group: the rank processes on this machine — start, poll, signal, stop (torch elastic's PContext).

:class:`RankProcesses` is the half of the pool that knows about processes and nothing about messages:

* **start** — each rank is forked by the kernel's zygote (:mod:`.zygote`: torch already imported, never the
  kernel itself) or, where it cannot be, is ``python -m nbtrain.rank`` through :mod:`subprocess`, a fresh
  interpreter; either way in its own session (process group), so a signal reaches it and its
  DataLoader workers together; the environment is the one torchrun gives its workers
  (:func:`worker_env`); stdin, stdout and stderr are pipes the kernel reads. The channel's key goes down
  stdin, and the rank treats stdin's end as the kernel's death;
* **poll** — the stdout/stderr pipes are read without blocking and decoded incrementally (a UTF-8
  character split between two reads stays whole) into :class:`Output` events; a process that ended is
  an :class:`Exited` event, after everything still in its pipes (its last words are often the cause);
* **signal** — :meth:`~RankProcesses.interrupt` sends exactly one SIGINT to every process of the group
  (the stop button); :meth:`~RankProcesses.stop` escalates SIGTERM → SIGKILL to every rank's session and
  every descendant psutil finds, with a grace between steps, as PContext's ``close()`` does;
* torch elastic's **error file** (``TORCHELASTIC_ERROR_FILE``, written by ``@record``) is read for a
  rank that exited (:meth:`~RankProcesses.error_file_message`).

This is the seam a multi-machine launcher replaces: it would start the ranks through an agent per
machine and hand back the same events, while the channel (:mod:`.channel`) and the rank side stay as
they are. The kernel-side store the ranks meet at is the pool's (:mod:`.pool`).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import psutil

from ...common import proctree
from ...wire import stop_marks
from .spec import PoolSpec
from .rank_events import Exited, Output
from .interpreter import interpreter_env
from .zygote_handle import ForkedRank, ForkRefused, ZygoteHandle


@dataclass
class _Proc:
    rank: int
    popen: subprocess.Popen | ForkedRank
    decoders: dict = field(default_factory=lambda: {s: codecs.getincrementaldecoder("utf-8")("replace")
                                                    for s in ("stdout", "stderr")})
    open_streams: set = field(default_factory=lambda: {"stdout", "stderr"})
    exit_code: int | None = None


def worker_env(spec: PoolSpec, rank: int, store_port: int, socket_path: str, run_id: str, workdir: str) -> dict:
    """The environment of rank ``rank``: what torchrun gives a worker, plus nbtrain's own settings."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default",
        WORLD_SIZE=str(spec.nprocs), LOCAL_WORLD_SIZE=str(spec.nprocs), ROLE_WORLD_SIZE=str(spec.nprocs),
        GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port),
        TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_ERROR_FILE=error_file_path(workdir, rank),
        NBTRAIN_SOCKET=socket_path, NBTRAIN_BACKEND=spec.backend, NBTRAIN_DEVICE_TYPE=spec.device_type,
        NBTRAIN_TIMEOUT=str(spec.timeout_s), NBTRAIN_KERNEL_PID=str(os.getpid()), CUDA_DEVICE_ORDER="PCI_BUS_ID",
        CUDA_VISIBLE_DEVICES=",".join(str(i) for i in spec.gpu_ids),
        NBTRAIN_STACK_FILE=stack_file_path(workdir, rank),
    )
    if spec.ft:  # its replica group's ranks are its process group; the groups meet through torchft's Lighthouse
        env["NBTRAIN_FT"] = str(spec.ft_group_size)  # (rank/train/ft_cell.py)
        env.setdefault("RUST_LOG", "warn")  # torchft's Manager says every quorum and commit at "info", into the cell
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // spec.nprocs)))
    if "lo" in psutil.net_if_addrs():  # one machine: keep gloo's and NCCL's sockets off the network
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env = interpreter_env(env)
    env.update(dict(spec.env))  # --env wins
    return env


def error_file_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"error-{rank}.json")


def stack_file_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"stack-{rank}.txt")


class RankProcesses:
    """The ranks' processes on this machine, indexed by rank."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir  # private (0700): error files and stack dumps live here
        self._procs: list[_Proc] = []
        self.started_at = 0.0  # time.time() the start began (the cold start's split counts from it)
        self.forked: dict[int, float] = {}  # rank -> seconds the zygote spent importing for it, for forked ranks
        self.spawn_reason = ""  # why ranks were spawned although a zygote was offered

    def start(self, envs: list[dict], key: bytes, zygote: ZygoteHandle | None = None) -> None:
        """Start one rank per environment — forked from ``zygote`` where it can, else spawned — and hand each the
        channel's key on its stdin."""
        self.started_at = time.time()
        for rank, env in enumerate(envs):
            self._procs.append(_Proc(rank, self._launch(rank, env, key, zygote)))

    def replace(self, rank: int, env: dict, key: bytes, zygote: ZygoteHandle | None = None) -> int:
        """A new process in place of ``rank``, which has exited and been reported (``--ft``); its pid."""
        old = self._procs[rank]
        assert old.exit_code is not None, "only a rank whose exit was reported is replaced"
        for pipe in (old.popen.stdin, old.popen.stdout, old.popen.stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._procs[rank] = _Proc(rank, self._launch(rank, env, key, zygote))
        return self._procs[rank].popen.pid

    def kill(self, rank: int) -> None:
        """SIGKILL one rank's session (it and its DataLoader workers); :meth:`reap` reports its exit."""
        proc = self._procs[rank]
        if proc.exit_code is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)  # started in a session of its own: the group is its pid

    def _launch(self, rank: int, env: dict, key: bytes, zygote: ZygoteHandle | None):
        forked = self._fork(zygote, rank, env) if zygote is not None and not self.spawn_reason else None
        popen = forked or subprocess.Popen(
            [sys.executable, "-m", "nbtrain.rank"], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
        assert popen.stdin is not None  # stdin=PIPE
        popen.stdin.write(key.hex().encode() + b"\n")
        popen.stdin.flush()
        for stream in ("stdout", "stderr"):
            os.set_blocking(getattr(popen, stream).fileno(), False)
        return popen

    def _fork(self, zygote: ZygoteHandle, rank: int, env: dict) -> ForkedRank | None:
        try:
            forked = zygote.fork(env, os.getcwd())
        except ForkRefused as exc:
            self.spawn_reason = str(exc)
            return None
        self.forked[rank] = forked.imports_s
        return forked

    # ---------------------------------------------------------------------------------- poll
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._procs]

    def all_running(self) -> bool:
        return all(p.popen.poll() is None for p in self._procs)

    def running(self) -> dict[int, int]:
        """rank -> pid of the ranks whose process has not ended."""
        return {p.rank: p.popen.pid for p in self._procs if p.popen.poll() is None}

    def output_open(self) -> bool:
        return any(p.open_streams for p in self._procs)

    def waitables(self) -> dict:
        """The open output pipes, for :func:`multiprocessing.connection.wait`: pipe -> (rank, stream)."""
        return {getattr(p.popen, stream): (p.rank, stream) for p in self._procs for stream in p.open_streams}

    def read(self, rank: int, stream: str) -> list[Output]:
        """What one pipe has now (nothing if it would block); its end closes the stream."""
        p = self._procs[rank]
        try:
            data = os.read(getattr(p.popen, stream).fileno(), 1 << 16)
        except BlockingIOError:
            return []
        except (OSError, ValueError):  # ValueError: the pipe was closed under the read (a teardown's, meanwhile)
            data = b""
        if not data:
            p.open_streams.discard(stream)
            text = p.decoders[stream].decode(b"", final=True)
        else:
            text = p.decoders[stream].decode(data)
        return [Output(rank, stream, text)] if text else []

    def reap(self) -> list:
        """Exits not reported yet, each after what its process still had in its pipes."""
        events: list = []
        for p in self._procs:
            if p.exit_code is None and (code := p.popen.poll()) is not None:
                p.exit_code = code
                events.extend(self._drain(p))
                events.append(Exited(p.rank, code))
        return events

    def _drain(self, p: _Proc) -> list:
        events: list = []
        for stream in list(p.open_streams):
            for _ in range(64):
                got = self.read(p.rank, stream) if stream in p.open_streams else []
                if not got:
                    break
                events.extend(got)
        return events

    def error_file_message(self, rank: int, code: int) -> str | None:
        """The error the rank's ``@record`` wrote (torch elastic's error file), if it wrote one."""
        path = error_file_path(self.workdir, rank)
        if not os.path.exists(path):
            return None
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        pid = self._procs[rank].popen.pid if rank < len(self._procs) else 0
        message = ProcessFailure(local_rank=rank, pid=pid, exitcode=code, error_file=path).message
        if isinstance(message, dict):  # torch elastic's JSON: {"message": ..., "extraInfo": {"py_callstack": ...}}
            message = message.get("extraInfo", {}).get("py_callstack") or message.get("message")
        return message

    # -------------------------------------------------------------------------------- signal
    def interrupt(self) -> None:
        """The stop button: exactly one SIGINT to each process of the group (see :func:`nbtrain.common.proctree.interrupt`)."""
        proctree.interrupt(self.pids())

    def wait_exit(self, timeout: float) -> None:
        """Until every rank has exited by itself, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            time.sleep(0.02)

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL, to every rank's session and all their descendants; ``grace`` after each. The
        ranks are told first that this SIGTERM is their kernel's (:mod:`nbtrain.wire.stop_marks`)."""
        pids = list(self.running().values())
        stop_marks.announce(self.workdir, pids)
        proctree.stop(pids, grace)
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=grace)

    def close(self) -> None:
        """Close every pipe (after :meth:`stop`)."""
        for p in self._procs:
            for pipe in (p.popen.stdin, p.popen.stdout, p.popen.stderr):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
            p.open_streams.clear()
