"""A preemption notice on the rank: a checkpoint at the next optimizer-step boundary, then wait to be stopped.

A notice reaches a rank in one of two ways: the kernel's :class:`~nbtrain.wire.protocol.Preempt` (a node's
agent got SIGTERM or its cloud's reclaim notice, or another rank got SIGTERM), which the worker's channel
thread hands to :func:`notice`; or SIGTERM sent to this rank from outside the pool (a container or a job
being stopped: :mod:`nbtrain.worker.stop`), which also tells the kernel, so every rank hears of it.

**Where.** The boundary is the moment a prepared DataLoader is about to hand out its next batch with no
accumulation window open — the previous step's ``optimizer.step()`` and everything the loop logged after it
are done, so the checkpoint holds the step's metrics and the loader's position is exactly the batches
consumed (a resumed run repeats no step and skips none). A cell without a prepared loader saves right after
the prepared optimizer's step instead (the values it logs after ``step()`` for that step are then the
resumed run's first).

**Agreement.** ``save_checkpoint()`` is a collective: every rank must save at the same step, though each hears
of the notice at its own moment. The first rank that has heard it at a boundary proposes *its step + 1* in
the process group's store (``compare_set``: the first proposal wins), and every rank reads the store at each
boundary of a cell that has ``--checkpoint``. DDP and FSDP keep the ranks within one step of each other (a
step's gradient collective needs them all), so no rank can be past step s + 1 before the rank at step s has
proposed: all of them save at the same step — the end of the step in progress when the first rank heard of the
notice, or of the next one. One store read per optimizer step is the price; without ``--checkpoint``, or on one
rank, there is no read.

**After.** Rank 0 tells the kernel (:class:`~nbtrain.wire.protocol.PreemptSaved`, with the step and how long the
write took); every rank then waits for the kernel to stop it — no step after the checkpoint is taken, so none is
lost. A notice while a checkpoint is being written changes nothing about that write: it finishes (or, if the
machine goes first, the previous checkpoint stays: the write is atomic).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

from ..wire import protocol as P
from .checkpoint import save_checkpoint
from .state import TrainContext

_STORE_KEY = "nbtrain/preempt/{job}"


class _Cell:
    """What this rank knows of a notice during one cell."""

    def __init__(self, job_id: int, rank: int, send) -> None:
        self.job_id, self.rank, self.send = job_id, rank, send
        self.noticed = threading.Event()
        self.proposed = False
        self.target: int | None = None  # the step every rank saves at, once agreed


_cell: _Cell | None = None
_stopping = threading.Event()  # the kernel (or node agent) said it stops this rank: its SIGTERM is no notice


def begin(job_id: int, rank: int, send) -> None:
    """A cell starts (the worker): notices from now on are this cell's."""
    global _cell
    _stopping.clear()
    _cell = _Cell(job_id, rank, send)


def end() -> None:
    global _cell
    _cell = None


def in_cell() -> bool:
    return _cell is not None


def notice() -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.Preempt`, or SIGTERM from outside: save at the next boundary."""
    cell = _cell
    if cell is not None:
        cell.noticed.set()


def sigterm_notice() -> None:
    """SIGTERM from outside the pool: note it here and tell the kernel, which tells every other rank."""
    cell = _cell
    if cell is not None:
        cell.noticed.set()
        cell.send(P.PreemptNotice(cell.rank, "SIGTERM", time.time()))


def stopping() -> None:
    _stopping.set()


def kernel_stops(wait: float) -> bool:
    """Whether the kernel announced the SIGTERM this rank just got (its announcement may still be on the way)."""
    return _stopping.wait(wait)


def at_boundary(context: TrainContext) -> None:
    """An optimizer-step boundary (a prepared loader's next batch, or after the step): save here if it is agreed."""
    cell = _cell
    if cell is None or context.settings.checkpoint_path is None:
        return
    if context.distributed and context.world_size > 1:
        if cell.target is None:
            cell.target = _agreed_step(cell, context.step)
    elif cell.noticed.is_set():
        cell.target = context.step
    if cell.target is not None and context.step >= cell.target:
        _save_and_wait(cell, context)


def _agreed_step(cell: _Cell, step: int) -> int | None:
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    key = _STORE_KEY.format(job=cell.job_id)
    if cell.noticed.is_set() and not cell.proposed:
        cell.proposed = True
        return int(store.compare_set(key, "", str(step + 1)))  # the first proposal wins; this returns it
    if store.check([key]):
        return int(store.get(key))
    return None


def _save_and_wait(cell: _Cell, context: TrainContext) -> None:
    started = time.perf_counter()
    path = save_checkpoint()
    context.wait_for_save()  # --checkpoint-async: written, not only copied
    if context.rank == 0:
        cell.send(P.PreemptSaved(cell.job_id, context.rank, context.step, time.perf_counter() - started, path))
    while True:  # the kernel stops the ranks now (the stop button still raises KeyboardInterrupt here)
        time.sleep(0.5)


def loader_worker_init(worker_init_fn=None):
    """A prepared DataLoader's ``worker_init_fn`` in a ``--checkpoint`` cell: its workers outlive a SIGTERM from
    outside the pool. Slurm signals every process of a job step, a container runtime may signal them all; torch's
    own handler ends a worker at once, and the rank's loader would then fail before the notice's checkpoint. The
    worker ends as before when its rank (torch's shutdown) or the kernel or node agent above it sends the SIGTERM."""
    return functools.partial(_outlive_outside_sigterm, worker_init_fn)


def _outlive_outside_sigterm(worker_init_fn, worker_id: int) -> None:
    rank, above = os.getppid(), _parent_of(os.getppid())
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the thread below takes it, with its sender

    def watch() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid in (rank, above):
                os._exit(0)  # as torch's handler does for its parent's SIGTERM

    threading.Thread(target=watch, name="nbtrain-loader-sigterm", daemon=True).start()
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1
