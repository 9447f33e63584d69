"""A rank: one spawned Python process that runs cells for the kernel until told to stop.

Start-up (``python -m nbtrain.rank``, environment as torchrun sets it: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True):

1. read the pool's key from stdin, then watch stdin in a thread: end-of-file means the kernel is gone
   (died, restarted), and the rank removes the kernel's shared-memory files (which it can no longer
   remove itself) and kills its whole process group — itself and any DataLoader workers. On a node
   (``python -m nbtrain.node``, whose torch elastic agent starts the ranks) the key is in a private file
   (``NBTRAIN_KEY_FILE``) and the watch is on the agent: a rank whose parent changed kills its group;
2. connect to the kernel's socket (HMAC-authenticated) and say :class:`Hello`;
3. pick the device (``cuda:LOCAL_RANK`` of the GPUs made visible to the pool, else CPU) and initialise the
   default process group with ``init_method="env://"`` against the store the kernel hosts — the same
   rendezvous torchrun's agent provides — then say :class:`Ready`.

Then, per :class:`Job`: a fresh ``__main__`` module (so classes defined in the cell pickle, and
``if __name__ == "__main__":`` scripts run; a job of a session gets the module its session keeps,
:mod:`.session`), the notebook's current directory and ``sys.path``
(:mod:`.modules`, which also reports the user's own modules after the job), the runtime names (``rank``,
``local_rank``, ``world_size``, ``device``, and ``display``: :mod:`nbtrain.rank.display`, to which IPython's
own display functions are routed, :mod:`.ipython_display`) and the
notebook's inputs; ``input()``, ``sys.stdin`` and ``breakpoint()`` ask the notebook (:mod:`.prompts`) and
``--profile`` profiles the cell (:mod:`nbtrain.rank.train.profile`); the cell runs as a notebook runs it (its
last expression's value shown, warnings naming the cell's lines: :mod:`.cellcode`); rank 0 packs the results; figures still open are shown (rank 0) or
closed; the memory is released (``gc.collect``; ``torch.cuda.empty_cache`` where CUDA was initialised)
*before* the streams are marked and the reply is sent, so the GPU reads as free when the cell returns.
The cell's training settings (``--amp``, ``--grad-accum``, ``--checkpoint``) are opened as a
:mod:`nbtrain.rank.train.state` context for the cell and closed after it. Failures are reported as
:class:`Failed` with the traceback's frames, which the kernel maps to the cell's lines. The stop
button's SIGINT raises KeyboardInterrupt only while the cell's code runs (:mod:`.stop`): the reporting,
flushing and cleanup around it always complete. A SIGTERM from outside the pool while a cell runs is a
preemption notice (:mod:`.stop`, :mod:`nbtrain.rank.train.preempt_checkpoint`); a thread reads the channel all the time, so
the kernel's notices (:class:`Preempt`) reach a rank in the middle of a cell.

Errors outside a job (bad environment, rendezvous failure) are written to torch elastic's error file
(``TORCHELASTIC_ERROR_FILE``) through ``@record``, where the kernel reads them like torchrun's agent.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import gc
import linecache
import os
import queue
import signal
import sys
import threading
import time
import traceback
import types
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import Client
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from .train import debug, ft_cell, metrics, preempt_checkpoint, profile, shard
from .train import state as train_state
from ..wire import protocol as P
from ..wire import stop_marks
from ..wire.names import RUNTIME_NAMES
from ..wire.payload import load_inputs, pack_results
from ..wire.restart_policy import ATTEMPT_ENV, ft_attempt
from ..wire.shm import abandon_and_sweep
from . import cellcode, compat, display, integrations, ipython_display, prompts, results_file, stop
from .modules import LocalModules
from .session import RankSessions

RESULT_RANK = 0  # the rank whose names come back to the notebook and whose displays show in the cell


def _read_key(fd: int) -> bytes:
    """The pool's key: one hex line on stdin, read unbuffered so the watcher owns the rest of the pipe."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            raise SystemExit("nbtrain.rank: no key on stdin (ranks are started by the notebook, not by hand)")
        line += chunk
    return bytes.fromhex(line.decode().strip())


def _watch_parent(fd: int) -> None:
    """Block on stdin; when the kernel's end closes, take this rank and its children down."""

    def watch() -> None:
        try:
            while os.read(fd, 4096):  # raw reads: no buffered-reader lock to trip over at exit
                pass
        except OSError:
            pass
        _orphaned(os.getppid())

    threading.Thread(target=watch, name="nbtrain-parent-watch", daemon=True).start()


def _watch_agent(parent: int) -> None:
    """On a node (started by torch elastic's agent, stdin not ours): when the agent is gone, so is this rank."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        _orphaned(parent)

    threading.Thread(target=watch, name="nbtrain-agent-watch", daemon=True).start()


def _orphaned(parent: int) -> None:
    """The kernel (or the node's agent) is gone: remove its shared-memory files, which it cannot any more, then
    take this rank and its children down."""
    try:
        abandon_and_sweep(int(os.environ.get("NBTRAIN_KERNEL_PID", parent)))
    except Exception:
        pass
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(1)


def _lifeline() -> bytes:
    """The channel's key, and a watch that ends this rank with whoever started it (the kernel, or a node agent)."""
    key_file = os.environ.get("NBTRAIN_KEY_FILE")
    if key_file:  # a node's rank: the key is in a 0600 file of the agent's private directory
        with open(key_file) as f:
            key = bytes.fromhex(f.read().strip())
        _watch_agent(os.getppid())
        return key
    lifeline = os.dup(0)
    key = _read_key(lifeline)
    _watch_parent(lifeline)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a cell calling input() must not eat the kernel's lifeline
    sys.stdin = open(0, closefd=False)
    return key


def _select_device():
    import torch

    local_rank = int(os.environ["LOCAL_RANK"])
    if os.environ.get("NBTRAIN_DEVICE_TYPE") == "cuda":
        count = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % count)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _init_process_group(device) -> tuple[float, float]:
    """Join the kernel's store (rendezvous), then build the default group (communicator set-up); when each ended.

    This is ``init_process_group(init_method="env://")`` in its two halves, timed apart. With NCCL the group is
    given its device (``device_id``), so the communicator is built now, not at the cell's first collective."""
    import torch.distributed as dist

    backend = os.environ["NBTRAIN_BACKEND"]
    timeout = timedelta(seconds=float(os.environ.get("NBTRAIN_TIMEOUT", "600")))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    group_size = int(os.environ.get("NBTRAIN_FT", "0"))  # --ft: the process group is the rank's replica group
    store: Any
    if group_size == 1:  # a group of its own; the groups meet through torchft (rank/train/ft_cell.py)
        store, rank, world_size = dist.HashStore(), 0, 1
    else:
        store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
        if group_size:  # each group (and each new start of one, after a loss) meets under its own prefix
            group = f"nbtrain-ft/{rank // group_size}/{ft_attempt()}"
            store, rank, world_size = dist.PrefixStore(group, store), rank % group_size, group_size
    joined = time.time()
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world_size,
                            timeout=timeout, **kwargs)
    return joined, time.time()


def _write_results_file(namespace: dict, names) -> None:
    """A detached run's tensors among its results, also as a safetensors file in its folder (:mod:`.results_file`)."""
    folder = os.environ.get(results_file.FOLDER_ENV)
    if not folder:
        return
    try:
        said = results_file.write({name: namespace[name] for name in names if name in namespace}, folder)
    except Exception as exc:  # the names reach the notebook all the same: the file is a copy of some of them
        said = f"nbtrain: the results' tensors could not be written as {results_file.NAME} ({type(exc).__name__}: {exc})"
    if said:
        print(said, file=sys.stderr)


class Rank:
    def __init__(self, conn, device) -> None:
        import torch

        self.conn = conn
        self._send_lock = threading.Lock()  # the metrics thread sends too
        self.device = device
        self.torch = torch
        self.rank = int(os.environ["RANK"])
        self.real_main = sys.modules["__main__"]
        self.local_modules = LocalModules()
        self.sessions = RankSessions()  # --session: namespaces kept between jobs
        self.inbox: queue.Queue = queue.Queue()  # the kernel's messages but those the reader acts on at once
        threading.Thread(target=self._read_loop, name="nbtrain-channel-reader", daemon=True).start()

    def send(self, message) -> None:
        with self._send_lock:
            self.conn.send(message)

    def _read_loop(self) -> None:
        """Read the channel all the time, also while a cell runs: a preemption notice must reach a busy rank."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.inbox.put(None)
                return
            if isinstance(msg, P.Preempt):
                preempt_checkpoint.notice(msg)
            elif isinstance(msg, P.PreemptAt):
                preempt_checkpoint.target_heard(msg)
            elif isinstance(msg, P.PreemptAgreed):
                preempt_checkpoint.agreed(msg)
            elif isinstance(msg, P.BreakpointRelease):
                debug.released(msg)
            elif isinstance(msg, P.FtGo):
                ft_cell.go(msg)
            elif isinstance(msg, P.FtOut):
                ft_cell.groups_out(msg)
            elif isinstance(msg, P.Stopping):
                preempt_checkpoint.stopping()
            else:
                self.inbox.put(msg)

    def receive(self):
        msg = self.inbox.get()
        if msg is None:
            raise EOFError("the kernel's channel closed")
        return msg

    def serve(self) -> None:
        while True:
            try:
                msg = self.receive()
            except EOFError:
                return
            if isinstance(msg, P.Shutdown):
                return
            if isinstance(msg, P.Job):
                self.run(msg)
            elif isinstance(msg, P.CloseSession):
                self.sessions.close(msg.name)
                self._release_memory()

    def _namespace(self) -> types.ModuleType:
        main = types.ModuleType("__main__")
        main.__dict__.update(
            __builtins__=builtins,
            rank=self.rank,
            local_rank=int(os.environ["LOCAL_RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            device=self.device,
            display=display.display,  # IPython's would print a repr here; this one shows it in the cell
        )
        return main

    def run(self, job: P.Job) -> None:
        started = time.perf_counter()
        job = _as_attempt(job, int(os.environ.get(ATTEMPT_ENV, "0")))
        main = self.sessions.enter(job, self._namespace)  # fresh, or the session's kept namespace
        sys.modules["__main__"] = main
        reply: object
        # As torchrun's agent sets them for each attempt (a warm pool's next cell starts again at 0).
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(job.train.restart)
        os.environ["TORCHELASTIC_MAX_RESTARTS"] = str(job.train.max_restarts)
        try:
            with self._cell_scopes(job):
                reply = self._execute(job, main.__dict__, started)
                reply = self.sessions.leave(job, main, reply, self.torch)  # a failed session cell: bindings restored
        finally:
            sys.modules["__main__"] = self.real_main
            del main
            self._release_memory()  # before the end mark: what a finaliser prints belongs to this cell
            self._flush_and_mark(job.job_id)
        self.send(reply)

    def _cell_scopes(self, job: P.Job) -> contextlib.ExitStack:
        """What a cell runs inside, each part owning its own end; they end in the reverse order: the profile's
        summary first, then the preemption watch, the training context (prepared models and loaders do not
        outlive their cell), prompts, displays (the figures left open), and last the logs, sent before the reply."""
        scopes = contextlib.ExitStack()
        with scopes:
            scopes.enter_context(metrics.scope(self.rank, self.send, self.sessions.step_counters(job)))
            # a session's next cell goes on from here (read before the logging scope ends)
            scopes.callback(lambda: self.sessions.keep_step_counters(job, metrics.step_counters()))
            scopes.enter_context(display.scope(job.job_id, self.rank, RESULT_RANK, self.send))
            scopes.enter_context(prompts.scope(job.job_id, self.rank, self.send, self.receive))  # asked in the notebook
            scopes.enter_context(train_state.scope(job.train, self.device, self.rank, int(os.environ["WORLD_SIZE"])))
            scopes.enter_context(integrations.scope(job.train.integrations))  # Trainers' logs as nbtrain's series
            scopes.enter_context(preempt_checkpoint.scope(job.job_id, self.rank, self.send))
            scopes.enter_context(ft_cell.scope(job, self.rank, self.send))  # --ft: its replica group, left before the context ends
            scopes.enter_context(profile.scope(job.train.profile, job.train.profile_dir, self.rank, self.device,
                                               job.job_id, self.send))
            return scopes.pop_all()  # entered whole, or (one failed to start) the ones entered ended again

    def _release_memory(self) -> None:
        """Free what the cell left behind *before* replying, so the GPU reads as free when the cell returns.

        gc.collect() breaks the cycles that hold tensors; empty_cache() gives the caching allocator's
        blocks back to the driver — only where CUDA was initialised (never starting it on a CPU rank).
        """
        gc.collect()
        if self.torch.cuda.is_initialized():
            self.torch.cuda.empty_cache()

    def _execute(self, job: P.Job, ns: dict, started: float):
        with compat.torchrun_script_support():
            return self._execute_patched(job, ns, started)

    def _execute_patched(self, job: P.Job, ns: dict, started: float):
        try:
            self.local_modules.enter(job.cwd, job.sys_path)  # before unpickling: modules come from there
            inputs = load_inputs(job.inputs)
        except BaseException as exc:
            return P.Failed(job.job_id, self.rank, describe(exc, stage="inputs"))
        for name, value in inputs.items():
            if name not in RUNTIME_NAMES:
                ns[name] = value
        del inputs
        self.send(P.Loaded(job.job_id, self.rank))
        lines = job.source.splitlines(keepends=True)
        linecache.cache[job.filename] = (len(job.source), None, lines, job.filename)
        first_step = FirstStep()
        try:
            with first_step, stop.interruptible(), cellcode.cell_warnings(job.filename, job.line_offset):
                cellcode.run(job.source, job.filename, ns)  # SIGINT raises only in here (see .stop)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                return P.Failed(job.job_id, self.rank, describe(exc))
        except BaseException as exc:
            return P.Failed(job.job_id, self.rank, describe(exc))
        try:  # every rank: what its shards took, then sharded models among the results gathered whole to rank 0
            shard.report_state(train_state.current())
            shard.report_nothing_sharded(train_state.current(), ns)
            brings_back = _brings_back(self.rank)
            whole = shard.bring_back(train_state.current(), ns, job.out_names, brings_back)
        except BaseException as exc:
            return P.Failed(job.job_id, self.rank, describe(exc, stage="results"))
        results = None
        if brings_back:
            try:
                results = pack_results({**ns, **whole}, job.out_names, job.result_prefix)
            except BaseException as exc:
                return P.Failed(job.job_id, self.rank, describe(exc, stage="results"))
            _write_results_file({**ns, **whole}, job.out_names)
        return P.Done(job.job_id, self.rank, results, time.perf_counter() - started,
                      modules=self.local_modules.stamps(), rank_path=self.local_modules.baseline,
                      first_step=first_step.at)

    @staticmethod
    def _flush_and_mark(job_id: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
                stream.write(f"{P.END_MARK}{job_id}\n")
                stream.flush()
            except Exception:
                pass


def _brings_back(rank: int) -> bool:
    """Whether this rank's names go back to the notebook: rank 0's; under ``--ft``, those of the first rank of the
    last quorum's first replica group — every group holds the same state, and rank 0's may have been lost."""
    ft = ft_cell.active()
    return ft.brings_back() if ft is not None else rank == RESULT_RANK


def _as_attempt(job: P.Job, attempt: int) -> P.Job:
    """The job as attempt ``attempt`` runs it: a detached run's agent that restarts the ranks (``--max-restarts``
    with no kernel there) delivers the first attempt's job again and says which attempt this is; it resumes
    from the checkpoint, as a restart the kernel makes does (:meth:`nbtrain.kernel.lifecycle.cellrun.CellRun.again`)."""
    if attempt <= job.train.restart:
        return job
    return replace(job, train=replace(job.train, resume=True, restart=attempt))


class FirstStep:
    """When the cell's first optimizer step ended, for the cold start's split: a global post-step hook, there
    only while the cell runs."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._handle: Any = None

    def _seen(self, optimizer, args, kwargs) -> None:
        if self.at is None:
            self.at = time.time()

    def __enter__(self) -> FirstStep:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._seen)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()


_INTERNAL = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def describe(exc: BaseException, stage: str = "cell") -> P.RemoteError:
    """Reduce an exception to frames and text; drop nbtrain's own frames above the user's code."""
    frames = [
        P.Frame(f.filename, f.lineno or 0, f.name, f.line)
        for f in traceback.extract_tb(exc.__traceback__)
        if not os.path.abspath(f.filename).startswith(_INTERNAL + os.sep)
    ]
    chained = []
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None:
        chained.append("".join(traceback.format_exception(type(cause), cause, cause.__traceback__)).rstrip())
    message = str(exc) if not isinstance(exc, SystemExit) else f"sys.exit({exc.code!r})"
    return P.RemoteError(type(exc).__qualname__, message, tuple(frames), stage, tuple(chained))


@record
def main(launched: float | None = None) -> None:
    """A rank's life; ``launched``: when its process started running Python (spawned: its first line; forked:
    the fork), for the cold start's split (:class:`~nbtrain.wire.protocol.Ready`)."""
    launched = launched or time.time()
    imported = time.time()
    # several ranks of a node share one environment: the file is named by the local rank there
    stack_file = open(os.environ["NBTRAIN_STACK_FILE"].replace("{local_rank}", os.environ["LOCAL_RANK"]), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)  # "where are you?" from the kernel
    workdir = os.path.dirname(stack_file.name)  # the pool's private directory, where the kernel marks its own stop
    stop.install_sigterm(preempt_checkpoint.in_cell, lambda wait: stop_marks.announced(workdir) or preempt_checkpoint.kernel_stops(wait),
                         preempt_checkpoint.sigterm_notice, metrics.flush_before_exit)
    key = _lifeline()
    for stream in (sys.stdout, sys.stderr):
        # whole lines, live: ranks' lines do not interleave (the interpreter's streams are io.TextIOWrapper)
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    conn = Client(os.environ["NBTRAIN_SOCKET"], family="AF_UNIX", authkey=key)
    rank = int(os.environ["RANK"])
    conn.send(P.Hello(rank, os.getpid()))
    device = _select_device()
    joined, built = _init_process_group(device)
    conn.send(P.Ready(rank, str(device), P.StartTimes(launched, imported, joined, built)))
    ipython_display.route_ipython_display()  # IPython's display() shows in the cell, as the cell's own does
    gc.collect()
    gc.freeze()  # torch & co. live as long as the rank: the collection before each reply skips them (~50 ms → ~0)
    Rank(conn, device).serve()
    compat.shutdown_process_group()
    conn.close()
