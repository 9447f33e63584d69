"""A preemption notice on the rank: a checkpoint at the next optimizer-step boundary, then wait to be stopped.

A notice reaches a rank in one of two ways: the kernel's :class:`~nbtrain.wire.protocol.Preempt` (a node's
agent got SIGTERM or its cloud's reclaim notice, or another rank got SIGTERM), which the worker's channel
thread hands to :func:`notice`; or SIGTERM sent to this rank from outside the pool (a container or a job
being stopped: :mod:`nbtrain.rank.stop`), which also tells the kernel, so every rank hears of it.

**Where.** The boundary is the moment a prepared DataLoader is about to hand out its next batch with no
accumulation window open — the previous step's ``optimizer.step()`` and everything the loop logged after it
are done, so the checkpoint holds the step's metrics and the loader's position is exactly the batches
consumed (a resumed run repeats no step and skips none). A cell without a prepared loader saves right after
the prepared optimizer's step instead — or, when it loops over ``nbtrain.epochs()``, at the end of the epoch
(before the next one is entered: a checkpoint without a loader's position ends its epoch, so the values the
epoch's body logs after its last ``step()`` must be in it, or neither the stopped run nor the resumed one would
have them).

**Agreement.** ``save_checkpoint()`` is a collective: every rank must save at the same step, though each hears
of the notice at its own moment. The agreement travels on the authenticated channel, never through the process
group's store, which anyone who reaches its port may write (a value planted there would make the ranks save and
stop at a step of someone else's choosing, or fail). The first rank that has heard the notice at a boundary
proposes *its step + 1* to the kernel (:class:`~nbtrain.wire.protocol.PreemptPropose`) and waits there; the kernel
takes the first proposal of the cell and sends it to every rank (``PreemptAt``), each rank's channel thread
notes it and answers (``PreemptHeard``), and once every rank has, the kernel releases the proposer
(``PreemptAgreed``). DDP and FSDP keep the ranks within one step of each other (a step's gradient collective
needs them all), so while the proposer waits at step s no rank can pass boundary s + 1, and when it goes on every
rank knows the step: all of them save at the same step — the end of the step in progress when the first rank
heard of the notice, or of the next one. Nothing is asked at a boundary before a notice; without
``--checkpoint``, or on one rank, there is no agreement at all.

**After.** Rank 0 tells the kernel (:class:`~nbtrain.wire.protocol.PreemptSaved`, with the step and how long the
write took); every rank then waits for the kernel to stop it — no step after the checkpoint is taken, so none is
lost. A notice while a checkpoint is being written changes nothing about that write: it finishes (or, if the
machine goes first, the previous checkpoint stays: the write is atomic). A rank that is not stopped within the
notice's grace (``--preemption-grace``) after its checkpoint, or whose proposal gets no agreement in that time,
fails the cell with what happened instead of waiting for ever.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Iterator

from ...wire import protocol as P
from .checkpoint import save_checkpoint
from .state import TrainContext

DEFAULT_GRACE_S = 25.0  # a SIGTERM heard before the kernel's Preempt (which carries --preemption-grace)


class PreemptionStalled(RuntimeError):
    """The kernel did not answer a rank waiting at a preemption's step: the cell fails saying so."""


class _Cell:
    """What this rank knows of a notice during one cell."""

    def __init__(self, job_id: int, rank: int, send) -> None:
        self.job_id, self.rank, self.send = job_id, rank, send
        self.noticed = threading.Event()
        self.grace = DEFAULT_GRACE_S
        self.proposed = False
        self.target: int | None = None  # the step every rank saves at: the kernel's PreemptAt
        self.agreed = threading.Event()  # every rank has heard the target (the kernel's PreemptAgreed)


_cell: _Cell | None = None
_stopping = threading.Event()  # the kernel (or node agent) said it stops this rank: its SIGTERM is no notice


@contextlib.contextmanager
def scope(job_id: int, rank: int, send) -> Iterator[None]:
    """A cell (the worker enters it around each cell): notices while it runs are this cell's."""
    global _cell
    _stopping.clear()
    _cell = _Cell(job_id, rank, send)
    try:
        yield
    finally:
        _cell = None


def in_cell() -> bool:
    return _cell is not None


def notice(message: P.Preempt) -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.Preempt`: save at the next boundary."""
    cell = _cell
    if cell is not None and message.job_id == cell.job_id:
        cell.grace = message.grace
        cell.noticed.set()


def target_heard(message: P.PreemptAt) -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.PreemptAt` (on the channel's thread): note it, then say so."""
    cell = _cell
    if cell is not None and message.job_id == cell.job_id and cell.target is None:
        cell.target = message.step
        cell.noticed.set()
        cell.send(P.PreemptHeard(cell.job_id, cell.rank))


def agreed(message: P.PreemptAgreed) -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.PreemptAgreed`: every rank knows the step."""
    cell = _cell
    if cell is not None and message.job_id == cell.job_id:
        cell.agreed.set()


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
    """An optimizer-step boundary (a prepared loader's next batch, or after the step): save here if it is agreed
    (after the step of a cell looping over ``nbtrain.epochs()`` without a loader: agree only, save at the epoch's
    end)."""
    _boundary(context, save=bool(context.loaders) or not context.epochs_used)


def at_epoch_end(context: TrainContext) -> None:
    """``nbtrain.epochs()`` between two epochs of a cell without a prepared loader: save here if it is agreed."""
    if not context.loaders:
        _boundary(context, save=True)


def _boundary(context: TrainContext, save: bool) -> None:
    cell = _cell
    if cell is None or context.settings.checkpoint_path is None:
        return
    if context.distributed and context.world_size > 1:
        if cell.target is None and cell.noticed.is_set():
            _propose(cell, context.step)
    elif cell.noticed.is_set():
        cell.target = context.step
    if save and cell.target is not None and context.step >= cell.target:
        _save_and_wait(cell, context)


def _propose(cell: _Cell, step: int) -> None:
    """Propose the next step to the kernel and wait here until every rank knows the agreed one (the module
    docstring says why no rank can pass it meanwhile)."""
    if not cell.proposed:
        cell.proposed = True
        cell.send(P.PreemptPropose(cell.job_id, cell.rank, step + 1))
    if not cell.agreed.wait(cell.grace):
        raise PreemptionStalled(f"nbtrain: rank {cell.rank} heard a preemption notice at step {step} but the ranks "
                                f"did not agree on a step to save at within {cell.grace:.0f} s (--preemption-grace): "
                                "the kernel or another rank did not answer")


def _save_and_wait(cell: _Cell, context: TrainContext) -> None:
    started = time.perf_counter()
    path = save_checkpoint()
    context.wait_for_save()  # --checkpoint-async: written, not only copied
    group = context.save_group()
    if group.writes and group.rank == 0:  # under --ft, the replica group that wrote it
        cell.send(P.PreemptSaved(cell.job_id, context.rank, context.step, time.perf_counter() - started, path))
    deadline = time.monotonic() + cell.grace
    while time.monotonic() < deadline:  # the kernel stops the ranks now (the stop button still raises here)
        time.sleep(0.5)
    raise PreemptionStalled(f"nbtrain: the preemption's checkpoint at step {context.step} is saved ({path}), but "
                            f"rank {context.rank} was not stopped within {cell.grace:.0f} s (--preemption-grace); "
                            "run the cell again to resume from it")


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
