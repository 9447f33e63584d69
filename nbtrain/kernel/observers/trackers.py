"""Experiment trackers: every ``nbtrain.log`` series to TensorBoard (``--tensorboard DIR``), MLflow, W&B, ….

A tracker is a :class:`~nbtrain.kernel.observers.events.RunObserver` — the seam the dashboard and the run registry
already use: ``run_started(info)``, ``metrics(rank, records)`` with ``(step, unix_time, {name: float})``
records, ``run_finished(status, summary)``. :class:`Tracker` names that seam for users;
:func:`track` registers one for every following cell of this kernel (``nbtrain.track(MyTracker())``),
:func:`untrack` removes it, and :func:`trackers_for` gives a run its trackers: the registered ones and,
with ``--tensorboard DIR``, a new :class:`TensorBoardTracker`.

**Why in the kernel, not on the ranks.** The kernel already receives every rank's series, batched, with
the steps and times the ranks logged, and turned into numbers (:mod:`nbtrain.rank.train.metrics`). Writing
there costs the ranks nothing — no TensorBoard import at start-up, no writer thread beside the training
loop — the files land next to the notebook even when ranks run elsewhere, and the same records reach every
tracker, so an MLflow or W&B adapter is a dozen lines with nothing to install on the ranks. A run restarted
by ``--max-restarts`` is one run to its trackers, as to the dashboard: ``run_started`` comes for each attempt,
the series a restart resends from its checkpoint are not passed again, and ``run_finished`` comes once.

:class:`TensorBoardTracker` writes each rank's series with ``torch.utils.tensorboard.SummaryWriter`` under
``DIR/rank<k>`` (one TensorBoard run per rank), as scalars named as logged, at the step and wall time the
rank logged them, so ``tensorboard --logdir DIR`` shows the run: written by a thread of its own (the run's
loop only queues the batches), flushed when the run ends. When ``--max-restarts`` starts the ranks again, each
rank's first event after the restart is preceded by TensorBoard's "session start" mark, so TensorBoard drops
what the failed attempt logged past the checkpoint and shows one curve. A detached run followed by a kernel that
attaches comes again from its record, every series from its first step: each rank's first event is marked the
same way, so what the kernel that started it (or an earlier attach) wrote is dropped and the curve is drawn once
— also where that kernel died half-way, the attach writing the whole run.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from .events import RunInfo, RunObserver
from .hosted_trackers import TrackSpec, tracker_for


class Tracker(RunObserver):
    """Follows every run of this kernel once registered with :func:`track`; override what you need.

    Called on the kernel's main thread between the run's events: return quickly. A tracker that raises is
    detached from that run with a one-line note; the run goes on.
    """


_registered: list[RunObserver] = []


def track(tracker: RunObserver) -> RunObserver:
    """Follow every later ``%%distributed`` cell of this kernel with ``tracker``; returns it."""
    if tracker not in _registered:
        _registered.append(tracker)
    return tracker


def untrack(tracker: RunObserver) -> None:
    """Stop following cells with ``tracker`` (registered with :func:`track`)."""
    if tracker in _registered:
        _registered.remove(tracker)


def trackers_for(tensorboard_dir: str | None, tracks: tuple[TrackSpec, ...] = (), replay: bool = False) -> list[RunObserver]:
    """The trackers of one run: those registered, TensorBoard's if ``--tensorboard`` was given, and each ``--track``
    (``replay``: a detached run followed through its record, by a kernel that attaches)."""
    return [*_registered, *([TensorBoardTracker(tensorboard_dir, replay)] if tensorboard_dir else []),
            *(tracker_for(spec) for spec in tracks)]


class TrackerSetupError(ValueError):
    """``--tensorboard`` cannot work: the package is missing or the directory cannot be written."""


def tensorboard_dir(text: str, cwd: str) -> str:
    """The absolute directory ``--tensorboard`` names (relative to the notebook's ``cwd``), once it is known
    that TensorBoard's writer can be imported and the directory written; else :class:`TrackerSetupError`."""
    try:
        import tensorboard  # noqa: F401  # what torch.utils.tensorboard writes with
    except ImportError:
        raise TrackerSetupError("--tensorboard needs the tensorboard package, which is not installed in this "
                                "kernel's environment: pip install 'nbtrain[tensorboard]' (or pip install "
                                "tensorboard), then restart the kernel.") from None
    path = os.path.expanduser(text.strip())
    if not path:
        raise TrackerSetupError("--tensorboard needs a directory, such as --tensorboard runs/tb.")
    path = os.path.normpath(os.path.join(cwd, path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise TrackerSetupError(f"--tensorboard {text} is a file; give a directory (each rank writes in DIR/rank<k>).")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
        raise TrackerSetupError(f"--tensorboard {text}: cannot write in {parent}; choose a writable directory.")
    return path


_RESTART = ("restart",)


def _mark_resumed(writer, step: int, walltime: float) -> None:
    """TensorBoard's sign of a run restarted from a checkpoint: events at ``step`` and later are orphans.

    A SessionLog START makes TensorBoard drop what the failed attempt logged past the checkpoint, so the
    curve continues once instead of twice.
    """
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    writer.file_writer.add_event(Event(step=step, wall_time=walltime, session_log=SessionLog(status=SessionLog.START)))


class TensorBoardTracker(Tracker):
    """Each rank's logged series as TensorBoard scalars under ``logdir/rank<k>``.

    Writing an event costs about 60 µs a scalar (protobuf and the event file's queue), too much for the run's
    loop when eight ranks log several values a step: :meth:`metrics` only queues the batch, a thread of the
    tracker writes it, and :meth:`run_finished` waits for that thread, then closes (flushes) the files.
    """

    _shown_as = "the TensorBoard writer (--tensorboard)"

    def __init__(self, logdir: str, replay: bool = False) -> None:
        """``replay``: the run is followed through its record (an attach), every series from its first step."""
        self.logdir = logdir
        self.replay = replay
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # (rank, records) | RESTART, then None at the end
        self._thread: threading.Thread | None = None
        self._attempts = 0

    def run_started(self, info: RunInfo) -> None:
        os.makedirs(self.logdir, exist_ok=True)
        self._attempts += 1
        if self._attempts > 1:  # --max-restarts started the ranks again, from the checkpoint
            self._queue.put(_RESTART)

    def metrics(self, rank: int, records: list) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write, name="nbtrain-tensorboard", daemon=True)
            self._thread.start()
        self._queue.put((rank, records))

    def run_finished(self, status: str, summary: str) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _write(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # importing torch here does not initialise CUDA

        writers: dict[int, Any] = {}  # rank -> SummaryWriter
        resumed: set[int] = set()  # ranks that logged since the last restart
        try:
            while (item := self._queue.get()) is not None:
                if item is _RESTART:
                    resumed = set(writers)
                    continue
                rank, records = item
                if rank not in writers:
                    writers[rank] = SummaryWriter(log_dir=os.path.join(self.logdir, f"rank{rank}"))
                    if self.replay:  # each rank's first records replace what was written of the run before
                        resumed.add(rank)
                if rank in resumed and records:
                    resumed.discard(rank)
                    _mark_resumed(writers[rank], records[0][0], records[0][1])
                for step, walltime, values in records:
                    for name, value in values.items():
                        writers[rank].add_scalar(name, value, global_step=step, walltime=walltime)
        finally:
            for writer in writers.values():
                writer.close()
