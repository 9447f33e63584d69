"""The kernel's handle on the zygote, a process with torch imported that forks ranks, so a cold cell skips the interpreter start.

:meth:`ZygoteHandle.start` (called when the extension loads, never on import) starts ``python -m nbtrain.rank.zygote``
(:mod:`nbtrain.rank.zygote`) in its own session, with the environment a rank's interpreter starts with
(:func:`.interpreter.interpreter_env`), and hands it one end of a socketpair — the only way to talk to it
(:mod:`nbtrain.wire.forking`: JSON, nothing unpickled). It imports torch in the background; the kernel does not
wait for it.

:meth:`ZygoteHandle.fork` asks for one rank: the kernel makes the rank's stdin, stdout and stderr pipes itself (as
:class:`subprocess.Popen` would) and sends their far ends with the rank's environment, its directory and the
installed packages the notebook imported since the zygote started (:func:`new_imports`), which the zygote
imports before it forks. The answer is a :class:`ForkedRank`, which the process group
(:mod:`.procs`) uses as it uses a ``Popen``: pid, pipes, ``poll``/``wait`` (the exit code comes from the
zygote, which reaps its children). Signals go to the pid and its session, as for a spawned rank.

A fork is refused, and the rank spawned instead with the reason in the cell, when the zygote cannot fork soundly
(:meth:`ZygoteHandle.why_not`): no ``fork`` on this platform, the zygote died or never started, it saw CUDA
initialised or a thread started by a library it imported for the notebook, or the rank's environment differs
from the zygote's in what an interpreter, its C library or torch reads when it starts (``PYTHON*``, ``LD_*``,
``TORCH_*``, ``MPLBACKEND``, ``MALLOC_*``, ``GLIBC_TUNABLES``: ``--env`` or the notebook changed it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import subprocess
import sys
import sysconfig
import threading
import time

import psutil

from ...wire import forking
from .interpreter import interpreter_env

READY_WAIT_S = 60.0  # a first cell right after %load_ext waits this long at most for torch's import
REPLY_WAIT_S = 30.0  # a fork request's answer (it includes importing the notebook's new packages)
# read when an interpreter, its C library (malloc's tunables) or torch starts: a forked rank would ignore them
START_TIME_KEYS = ("PYTHON", "LD_", "TORCH_", "MPLBACKEND", "MALLOC_", "GLIBC_TUNABLES")
KERNEL_MACHINERY = frozenset({  # what the kernel imports to be a kernel, not for the notebook's code
    "IPython", "ipykernel", "ipywidgets", "ipython_genutils", "jupyter_client", "jupyter_core", "zmq", "tornado",
    "traitlets", "debugpy", "comm", "matplotlib_inline", "jedi", "parso", "prompt_toolkit", "pygments", "pexpect",
    "ptyprocess", "nest_asyncio", "anywidget", "widgetsnbextension", "nbclient", "nbformat", "psutil", "nbtrain",
    "decorator", "pickleshare", "backcall", "stack_data", "executing", "asttokens", "pure_eval", "wcwidth",
    "platformdirs", "jupyterlab_widgets", "appnope", "colorama",
})


class ForkRefused(Exception):
    """The zygote cannot give this rank; the message says why (the rank is spawned)."""


class ZygoteHandle:
    """The kernel's handle on its zygote process (see the module docstring)."""

    def __init__(self, unavailable: str = "") -> None:
        self._popen: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._env: dict[str, str] = {}
        self._baseline: frozenset[str] = frozenset()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._exits: dict[int, int] = {}
        self._replies: dict[int, dict] = {}
        self._ready = False
        self._unsafe = ""
        self._gone = unavailable  # why it cannot fork at all ("": it may)

    @classmethod
    def start(cls) -> ZygoteHandle:
        """Start the zygote in the background; a zygote that cannot start says why in :meth:`why_not`."""
        if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
            return cls(f"ranks are forked only on Linux (this is {sys.platform})")
        zygote = cls()
        kernel_end, zygote_end = forking.pair()
        env = interpreter_env(dict(os.environ))
        env[forking.ZYGOTE_FD_ENV] = str(zygote_end.fileno())
        env[forking.KERNEL_PID_ENV] = str(os.getpid())
        try:
            zygote._popen = subprocess.Popen(
                [sys.executable, "-m", "nbtrain.rank.zygote"], env=env, pass_fds=[zygote_end.fileno()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True)
        except OSError as exc:
            kernel_end.close()
            return cls(f"the zygote could not start ({exc})")
        finally:
            zygote_end.close()
        del env[forking.ZYGOTE_FD_ENV], env[forking.KERNEL_PID_ENV]
        zygote._sock, zygote._env = kernel_end, env
        zygote._baseline = frozenset(_top_level(sys.modules))
        return zygote

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def why_not(self, env: dict[str, str] | None = None) -> str:
        """Why a rank with environment ``env`` cannot be forked now, or ""."""
        with self._lock:
            self._pump(0)
            if not self._gone and self._popen is not None and self._popen.poll() is not None:
                self._gone = f"the zygote process ended (exit code {self._popen.returncode})"
            if self._gone or self._unsafe:
                return self._gone or self._unsafe
        changed = [] if env is None else sorted(k for k in set(env) | set(self._env)
                                                if k.startswith(START_TIME_KEYS) and env.get(k) != self._env.get(k))
        if changed:
            them = "it" if len(changed) == 1 else "them"
            return (f"{', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'} from the zygote's, and an "
                    f"interpreter reads {them} when it starts")
        return ""

    def fork(self, env: dict[str, str], cwd: str) -> ForkedRank:
        """One rank, forked with this environment in this directory; :class:`ForkRefused` if it cannot be."""
        why = self.why_not(env)
        if why:
            raise ForkRefused(why)
        ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read, write) each
        theirs = (ends[0][0], ends[1][1], ends[2][1])
        ours = (ends[0][1], ends[1][0], ends[2][0])
        try:
            reply = self._ask({"op": "fork", "env": env, "cwd": cwd, "modules": new_imports(self._baseline),
                               "sys_path": list(sys.path)}, theirs)
        except ForkRefused:
            _close(ours)
            raise
        finally:
            _close(theirs)  # the rank's ends: its pipes close when it exits, not when the kernel does
        return ForkedRank(self, int(reply["pid"]), ours, float(reply.get("imports_s", 0.0)))

    def fork_store(self, listening: int, lifeline: int) -> int:
        """The process that hosts a pool's store (:mod:`nbtrain.rank.store_server`) on the socket ``listening``
        until ``lifeline``'s write end closes: its pid (its exit: :meth:`exit_code`); :class:`ForkRefused` if it
        cannot be forked. The descriptors stay the caller's to close."""
        why = self.why_not()
        if why:
            raise ForkRefused(why)
        return int(self._ask({"op": "store"}, (listening, lifeline))["pid"])

    def _ask(self, request: dict, fds: tuple[int, ...]) -> dict:
        """Send a request with ``fds`` beside it (the caller closes them) and wait for the zygote's ``forked``;
        :class:`ForkRefused` otherwise."""
        request_id = next(self._ids)
        try:
            with self._lock:
                self._wait_ready()
                assert self._sock is not None
                forking.send(self._sock, {**request, "id": request_id}, fds)
        except (OSError, ForkRefused) as exc:
            raise ForkRefused(str(exc) if isinstance(exc, ForkRefused) else
                              f"the zygote cannot be reached ({exc})") from None
        reply = self._reply(request_id)
        if reply.get("op") != "forked":
            raise ForkRefused(reply.get("reason", "the zygote refused"))
        return reply

    def exit_code(self, pid: int) -> int | None:
        """``pid``'s exit code once the zygote reported it (a rank that has just ended: waited for briefly)."""
        with self._lock:
            self._pump(0)
            if pid not in self._exits and _ended(pid):
                deadline = time.monotonic() + 1.0
                while pid not in self._exits and not self._gone and time.monotonic() < deadline:
                    self._pump(0.05)
                if pid not in self._exits and self._gone:  # reaped by init, code unknown: say it was killed
                    self._exits[pid] = -9
            return self._exits.pop(pid, None)

    def close(self) -> None:
        """End the zygote (``close``, then its end of the socketpair closes: it exits); ranks it forked live on."""
        with self._lock:
            self._gone = self._gone or "the zygote was closed"
            if self._sock is not None:
                with contextlib.suppress(OSError):  # said, so the zygote leaves this live kernel's shared memory
                    forking.send(self._sock, {"op": "close"})
                self._sock.close()
                self._sock = None
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(2.0)
            if self._popen.poll() is None:
                self._popen.kill()
                self._popen.wait()

    def wait_ready(self, timeout: float = READY_WAIT_S) -> bool:
        """Until the zygote has imported what it imports at start (at most ``timeout`` s); whether it may fork."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._ready and not self._gone and time.monotonic() < deadline:
                self._pump(min(0.5, max(0.0, deadline - time.monotonic())))
        return self._ready and not self.why_not()

    # ------------------------------------------------------------------------ messages
    def _wait_ready(self) -> None:
        self.wait_ready()
        if not self._ready:
            raise ForkRefused(self._gone or f"the zygote was not ready after {READY_WAIT_S:.0f} s")
        if self._unsafe:
            raise ForkRefused(self._unsafe)

    def _reply(self, request_id: int) -> dict:
        deadline = time.monotonic() + REPLY_WAIT_S
        with self._lock:
            while request_id not in self._replies and not self._gone and time.monotonic() < deadline:
                self._pump(0.2)
            return self._replies.pop(request_id, {"reason": self._gone or "the zygote did not answer in time"})

    def _pump(self, timeout: float) -> None:
        """Take in what the zygote said within ``timeout`` seconds (0: only what is there already)."""
        sock = self._sock
        while sock is not None and not self._gone:
            if not select.select([sock], [], [], timeout)[0]:
                return
            timeout = 0
            try:
                message, fds = forking.receive(sock)
            except (OSError, ValueError) as exc:
                message, fds = None, []
                self._gone = f"the zygote's channel broke ({exc})"
            _close(fds)
            if message is None:
                code = self._popen.wait(1.0) if self._popen is not None else None
                self._gone = self._gone or f"the zygote process ended (exit code {code})"
                return
            self._take(message)

    def _take(self, message: dict) -> None:
        op = message.get("op")
        if op == "ready":
            self._ready, self._unsafe = True, message.get("unsafe") or ""
        elif op == "exited":
            self._exits[int(message["pid"])] = int(message["code"])
        elif op == "unsafe":
            self._unsafe = str(message.get("reason"))
        elif op in ("forked", "refused"):
            if op == "forked":  # a pid used again: an earlier rank's exit with it (reported before) is not this one's
                self._exits.pop(int(message["pid"]), None)
            self._replies[int(message["id"])] = message


class ForkedRank:
    """A rank the zygote forked, as the process group uses a :class:`subprocess.Popen`."""

    def __init__(self, zygote: ZygoteHandle, pid: int, ours: tuple[int, int, int], imports_s: float) -> None:
        self.pid = pid
        self.args = ["nbtrain-rank", str(pid)]
        self.imports_s = imports_s  # the zygote imported the notebook's new packages for it this long
        self.returncode: int | None = None
        self._zygote = zygote
        self.stdin = open(ours[0], "wb", buffering=0)
        self.stdout = open(ours[1], "rb", buffering=0)
        self.stderr = open(ours[2], "rb", buffering=0)

    def poll(self) -> int | None:
        # The run's thread and a teardown may poll at once; the zygote hands an exit code out once, so the one that
        # got None must not overwrite the code the other one just got (the rank would look alive for ever).
        if self.returncode is None:
            code = self._zygote.exit_code(self.pid)
            if code is not None:
                self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


def new_imports(baseline: frozenset[str]) -> list[str]:
    """Installed packages (standard library, site-packages) the notebook imported since ``baseline``, by
    top-level name: the zygote imports them before forking, as the ranks would when the cell imports them."""
    roots = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
    names = []
    for name in sorted(set(_top_level(sys.modules)) - baseline - KERNEL_MACHINERY):
        path = getattr(sys.modules.get(name), "__file__", None) or ""
        installed = os.path.abspath(path).startswith(roots) or any(
            part in ("site-packages", "dist-packages") for part in path.split(os.sep))
        if path and installed and not name.startswith("_"):
            names.append(name)
    return names


def _top_level(modules) -> set[str]:
    return {name.partition(".")[0] for name in list(modules)}


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _close(fds) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
