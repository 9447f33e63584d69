"""The zygote: one process per kernel with torch and the rank's code imported, which forks ranks on request.

A rank started as ``python -m nbtrain.rank`` pays an interpreter start and ``import torch`` before it can
join the group — seconds on a small machine, in every rank, for every cold cell. The kernel cannot fork
itself (a notebook that touched CUDA cannot fork safely, and a kernel is full of threads), so it starts this
process once (``python -m nbtrain.rank.zygote``, from :mod:`nbtrain.kernel.ranks.zygote_handle`, when the extension
loads) and asks it for ranks. The zygote:

* imports torch, :mod:`nbtrain.rank.main` and what a training cell's first lines import lazily
  (:data:`WARM_IMPORTS`: building an optimizer imports ``torch._dynamo``, seconds), pays a rank's first checkpoint
  read and write once (:mod:`.warmup`), freezes it all out of the garbage collector (``gc.freeze``: a rank's
  collections neither walk it nor copy its pages), then waits; it **never initialises CUDA** and leaves no thread
  running,
  and it checks both before every fork (a library that initialised CUDA when imported — through torch, or the
  driver's ``cuInit`` directly — makes it refuse: the kernel then spawns);
* reads requests only from its end of a socketpair the kernel passed it (:mod:`nbtrain.wire.forking`: JSON,
  nothing unpickled); end-of-file there without a ``close`` means the kernel is gone, and the zygote removes the
  kernel's shared-memory files before it exits (:func:`remove_dead_kernels_files`) — a kernel killed while it
  wrote a notebook tensor there has no rank yet that would;
* before a fork, imports the installed packages the notebook imported since (the request names them), so a
  rank finds them loaded as the notebook has them;
* reaps its children and reports each exit code (SIGCHLD wakes it through a pipe);
* forks, on a ``store`` request, the process that hosts a pool's c10d store (:mod:`.storehost`), which the
  kernel does not host itself: a flood of writes to the store must not grow the notebook's kernel;
* forks ahead while it idles (:mod:`.spares`): a request is handed to a spare child forked before, so a cold
  pool's ranks and store do not wait for forks.

A forked rank (:func:`_become_rank`) becomes what a spawned rank is: its own session, the stdin/stdout/stderr
pipes the kernel made for it (the channel's key arrives on stdin, exactly as for a spawned rank — never in
the request or the environment), the environment a spawned rank gets, the kernel's directory, random
generators seeded from the system as a fresh interpreter seeds them, the intra-op thread counts (torch's, and
numpy's OpenBLAS, which the zygote loads with one thread so that a rank starts only the workers it asks for:
:func:`_blas_loads_with_one_thread`) its ``OMP_NUM_THREADS`` asks for, none of the zygote's descriptors or signal
handlers; then it runs the same :func:`nbtrain.rank.main.main`, and its exit (atexit handlers, flushed streams)
is a normal interpreter's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from ..wire import forking
from ..wire.shm import owner_prefix, sweep_prefix
from . import stop, store_server, warmup
from .spares import Spares

# What a training cell's first lines import lazily: constructing any optimizer imports torch._dynamo (seconds)
# a resume's or a sharded save's first use of DCP imported its package in the rank: 35–50 ms of the resume; and
# dcp.save/load given a path (a sharded save's, a hand-written resume's) import DCP's fsspec storage first (10 ms)
WARM_IMPORTS = ("torch._dynamo", "torch.optim", "torch.nn.parallel", "torch.utils.data", "torch.distributed.fsdp",
                "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
                "torch.distributed.checkpoint._fsspec_filesystem")
_MAIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


KERNEL_EXIT_WAIT_S = 5.0  # from the kernel's end closing to its exit (its descriptors close first, then it is reaped)


class Zygote:
    def __init__(self, sock: socket.socket, kernel_pid: int) -> None:
        self.sock = sock
        self.kernel_pid = kernel_pid
        self.wake_r, self.wake_w = os.pipe()
        self.unsafe = ""  # why this zygote forks no more ("": it forks)
        self.start_dir = sys.path[0] if sys.path else ""
        self.spares = Spares()
        self.tried: set[str] = set()  # modules a request named, imported here or not importable here

    def serve(self) -> None:
        """Answer requests until the kernel says ``close`` or its end closes (it died: its files are removed)."""
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake the select below
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [], self.spares.refill_in())
            if not ready:  # idle: a spare is due
                self.spares.refill_one(self._fork_spare)
                continue
            if self.wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self.wake_r, 4096)
                self._reap()
            if self.sock.fileno() in ready:
                message, fds = forking.receive(self.sock)
                if message is None:
                    remove_dead_kernels_files(self.kernel_pid)
                    return
                if message.get("op") == "close":
                    return
                if message.get("op") == "fork":
                    self._fork(message, fds)
                elif message.get("op") == "store":
                    self._fork_store(message, fds)
                else:
                    _close_all(fds)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spares.reported(pid):
                forking.send(self.sock, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def _fork(self, request: dict, fds: list[int]) -> None:
        started = time.perf_counter()
        blocker = self.unsafe or self._import(request.get("modules", []), request.get("sys_path", []))
        imports_s = time.perf_counter() - started
        if blocker or len(fds) != 3:
            _close_all(fds)
            forking.send(self.sock, {"op": "refused", "id": request["id"], "reason": blocker or "no pipes came"})
            return
        pid = self.spares.hand("rank", {"env": request["env"], "cwd": request["cwd"]}, tuple(fds))
        if pid is None:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self._child(request, fds)  # never returns
        _close_all(fds)  # the rank's ends: its pipes close when it exits, not when the zygote does
        forking.send(self.sock, {"op": "forked", "id": request["id"], "pid": pid, "imports_s": imports_s})

    def _fork_store(self, request: dict, fds: list[int]) -> None:
        """A pool's store host (:mod:`.storehost`): the listening socket and the lifeline came with the request."""
        if self.unsafe or len(fds) != 2:
            _close_all(fds)
            forking.send(self.sock, {"op": "refused", "id": request["id"], "reason": self.unsafe or "no socket came"})
            return
        pid = self.spares.hand("store", {}, tuple(fds))
        if pid is None:
            pid = os.fork()
            if pid == 0:
                self._store_child(fds)  # never returns
        _close_all(fds)
        forking.send(self.sock, {"op": "forked", "id": request["id"], "pid": pid, "imports_s": 0.0})

    def _store_child(self, fds: list[int]) -> None:
        def work() -> int:
            _leave_zygote(closing=self._zygotes_descriptors())
            _serve_store(fds)
            return 0
        _live_as_child(work)

    def _import(self, modules: list[str], sys_path: list[str]) -> str:
        """Import what the notebook imported since the zygote started; why forking is no longer safe, or ""."""
        new = [name for name in modules if name not in sys.modules and name not in self.tried]
        if not new:
            return ""  # nothing changed since the last check
        self.tried.update(new)  # one that cannot be imported here is not tried (nor are spares let go) again
        self.spares.let_go()  # forked without what is imported now
        saved = list(sys.path)
        sys.path.extend(p for p in sys_path if p not in saved)  # where the notebook found them, after our own
        try:
            for name in new:
                if name not in sys.modules:
                    try:
                        importlib.import_module(name)
                    except Exception:  # not importable here: the rank imports it as a spawned one would
                        pass
        finally:
            sys.path[:] = saved
        gc.freeze()
        self.unsafe = unsafe_to_fork()
        if self.unsafe:
            self.spares.stop()
            with contextlib.suppress(OSError):
                forking.send(self.sock, {"op": "unsafe", "reason": self.unsafe})
        return self.unsafe

    def _child(self, request: dict, fds: list[int]) -> None:
        def work() -> int:
            _leave_zygote(closing=self._zygotes_descriptors())
            _become_rank(request, fds, start_dir=self.start_dir)
            return _run_rank()
        _live_as_child(work)

    def _zygotes_descriptors(self) -> tuple[int, ...]:
        """What a fresh fork closes: the kernel's channel, the wake-up pipe, the idle spares' channels."""
        return (self.sock.detach(), self.wake_r, self.wake_w, *self.spares.descriptors())

    def _fork_spare(self, kind: str) -> tuple[int, socket.socket]:
        """A spare of ``kind`` (:mod:`.spares`): its pid and the zygote's end of its channel."""
        ours, theirs = forking.pair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._spare_child(kind, theirs)  # never returns
        theirs.close()
        return pid, ours

    def _spare_child(self, kind: str, channel: socket.socket) -> None:
        """Wait for a request, then become what a fork for it would have become; end with the zygote's end."""
        def work() -> int:
            _leave_zygote(closing=self._zygotes_descriptors())
            name_process(b"nbtrain-spare")
            if kind == "rank":
                warmup.warm_in_spare()
            request, fds = forking.receive(channel)
            channel.close()
            if request is None:
                return 0  # let go, or the zygote is gone
            if kind == "store":
                _serve_store(fds)
                return 0
            _become_rank(request, fds, start_dir=self.start_dir)
            return _run_rank()
        _live_as_child(work)


def _live_as_child(work: Callable[[], int]) -> NoReturn:
    """A fork's whole life: ``work`` (its exit code), what it raised printed, its streams flushed, then its exit —
    never a return into the zygote's loop."""
    code = 1
    try:
        code = work()
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve_store(fds: list[int]) -> None:
    name_process(b"nbtrain-store")
    store_server.serve(*fds)


def remove_dead_kernels_files(kernel_pid: int, wait_s: float = KERNEL_EXIT_WAIT_S) -> None:
    """The kernel's shared-memory files, once the kernel is gone for sure: this process, its child, was handed to
    another parent. The kernel's descriptors close before that, so no write of its can follow the sweep; a kernel
    still there after ``wait_s`` keeps its files."""
    deadline = time.monotonic() + wait_s
    while os.getppid() == kernel_pid:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    with contextlib.suppress(Exception):  # a sweep only tidies: the zygote exits all the same
        sweep_prefix(owner_prefix(kernel_pid))


CUDA_SUCCESS = 0


def unsafe_to_fork() -> str:
    """Why a fork of this process would not be a sound rank, or ""."""
    import torch

    if torch.cuda.is_initialized():
        return "the zygote saw CUDA initialised (a library imported for the notebook started it)"
    if cuda_driver_initialised():
        return "the zygote saw the CUDA driver initialised (a library imported for the notebook called cuInit)"
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"a library imported for the notebook started a thread in the zygote ({names})"
    return ""


def cuda_driver_initialised() -> bool:
    """Whether something in this process called ``cuInit`` behind torch's back (CuPy, JAX and Numba do).

    Only asked where the driver library is already loaded: importing torch or Triton may map it without
    initialising it (seen on an H200), and loading it is not ours to do. Before ``cuInit`` every driver call
    answers CUDA_ERROR_NOT_INITIALIZED, so a successful ``cuDeviceGetCount`` means it ran."""
    try:
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:  # not loaded: nothing here initialised it
        return False
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count)) == CUDA_SUCCESS


def _leave_zygote(closing: tuple[int, ...]) -> None:
    """A fresh fork: none of the zygote's signal handling or descriptors, a session of its own (as a spawned
    process: the signals sent to a rank's session reach it and its children, and nothing else)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    for fd in closing:
        with contextlib.suppress(OSError):
            os.close(fd)


def _become_rank(request: dict, fds: list[int], start_dir: str) -> None:
    """Turn this fork, which left the zygote, into the process a spawned rank is, up to the rank's own ``main``."""
    name_process(b"nbtrain-rank")  # its command line stays the zygote's: ps and top show this name
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if sys.path and sys.path[0] == start_dir:  # python -m puts the start-up directory first
        sys.path[0] = request["cwd"]
    sys.argv = [_MAIN_FILE]
    stop.reset()
    _reseed()
    _thread_counts(os.environ)


def _blas_loads_with_one_thread() -> None:
    """OpenBLAS (numpy's, scipy's) starts its worker threads as it loads, as many as the environment says (all the
    cores by default). A fork has none of them, and the first ``openblas_set_num_threads`` in a rank starts the
    zygote's count again, whatever it asks for; each new worker then spins for about 100 ms of CPU — while the rank
    joins its group, on every core the ranks need (a 2-core machine's cold start waited on it). Loaded with one
    thread here, a rank that asks for one starts none, as a spawned rank does; one that asks for more starts them,
    as a spawned rank does when it imports numpy. The zygote's own environment is not a rank's
    (:func:`_become_rank` replaces it)."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"


def _thread_counts(env) -> None:
    """The intra-op threads a fresh interpreter would start with: libraries the zygote loaded sized their pools
    from its environment, a spawned rank's from ``OMP_NUM_THREADS`` (torch; numpy's OpenBLAS reads its own
    variables first)."""
    import torch

    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    blas = env.get("OPENBLAS_NUM_THREADS") or env.get("GOTO_NUM_THREADS") or threads
    if blas.isdigit() and int(blas) > 0 and "numpy" in sys.modules:
        for setter in _openblas_setters():
            with contextlib.suppress(Exception):
                setter(int(blas))


def _openblas_setters() -> list:
    """``openblas_set_num_threads`` of each OpenBLAS this process has loaded (numpy's and scipy's bundle one)."""
    import ctypes

    found = []
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1]}
    for path in sorted(paths):
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                         "openblas_set_num_threads64_", "openblas_set_num_threads"):
                if hasattr(lib, name):
                    found.append(getattr(lib, name))
                    break
    return found


def name_process(name: bytes) -> None:
    """This process's name (``/proc/PID/comm``, what ps and top show), where the platform lets one set it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def _reseed() -> None:
    """Random generators as a fresh interpreter has them: seeded from the system, different in every rank.

    ``random`` reseeds itself after a fork; torch and numpy (if the zygote imported it) do not."""
    import random

    import torch

    random.seed()
    torch.default_generator.seed()  # the CPU's; CUDA's are untouched, as in a fresh interpreter (seeded when used)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run_rank() -> int:
    """The rank's ``main``, then an interpreter's exit: atexit handlers, non-daemon threads; the exit code."""
    from .main import main

    code: int = 0
    try:
        main(launched=time.time())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at an interpreter's end
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    return code


def _register_gloo() -> None:
    """torch registers even its built-in backends from entry points, at the first group a process makes: reading
    every installed distribution's metadata took 40–90 ms per rank in a notebook's environment, most of a cold
    rank's communicator set-up. Done here once, every forked rank inherits it. (NCCL's registration reads the
    rank's own environment, so a rank does that itself.)"""
    from torch.distributed import distributed_c10d

    register = getattr(distributed_c10d.Backend, "_ensure_backend_registered", None)  # absent from older torch
    if register is not None:
        with contextlib.suppress(Exception):  # the rank registers it then, as torch always did
            register("gloo")


def _close_all(fds) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def main() -> None:
    stop.install()  # the ranks it forks defer SIGINT from their first instruction, as spawned ones do
    name_process(b"nbtrain-zygote")
    started = time.perf_counter()
    sock = socket.socket(fileno=int(os.environ.pop(forking.ZYGOTE_FD_ENV)))
    kernel_pid = int(os.environ.pop(forking.KERNEL_PID_ENV))
    _blas_loads_with_one_thread()
    import torch  # noqa: F401  (what every rank needs, loaded once)

    from . import main as rank_main  # noqa: F401

    for name in WARM_IMPORTS:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    _register_gloo()
    warmup.warm_checkpoint_paths()
    gc.collect()
    gc.freeze()  # what the ranks inherit is never traversed by their collections: fast, and pages stay shared

    zygote = Zygote(sock, kernel_pid)
    zygote.unsafe = unsafe_to_fork()
    if zygote.unsafe:
        zygote.spares.stop()
    try:
        forking.send(sock, {"op": "ready", "pid": os.getpid(), "imports_s": time.perf_counter() - started,
                            "unsafe": zygote.unsafe})
        zygote.serve()
    except OSError:  # the kernel's end closed while this one spoke: it died
        remove_dead_kernels_files(kernel_pid)


if __name__ == "__main__":
    main()
