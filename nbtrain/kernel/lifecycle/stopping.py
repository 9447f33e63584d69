"""The stop button, kernel side: one clear message, one SIGINT per process, then SIGTERM and SIGKILL.

Pressing stop sends the kernel SIGINT. :func:`stop_button` (held for the whole run) turns the first
press into a KeyboardInterrupt in the run's loop — and notes it in a flag, in case some code swallows
the exception — and every later press into a mere note that escalates the stop already under way: a
second press never interrupts the teardown half-way (which used to leave ranks behind and print the
kernel's own traceback). While the pool is being spawned a press is only noted, so a half-finished
``import torch`` in the kernel is never left behind; the loop sees the flag a moment later.

:func:`stop_run` then ends the run:

* once the ranks run the cell: ask each rank where it is (:mod:`nbtrain.kernel.diagnostics.stacks`), print *"stopped by the user"*
  with one line per rank, send exactly one SIGINT to each process of the pool (:meth:`LocalPool.interrupt`
  — the cell sees KeyboardInterrupt, DataLoader workers end quietly; the rank defers it outside the cell,
  see :mod:`nbtrain.rank.stop`) and give the ranks a moment to report;
* while the ranks are still starting (importing torch, joining the process group): no SIGINT at all —
  there is no cell to interrupt, only imports to spoil — and the message says so;
* then SIGTERM and SIGKILL to everything left (:meth:`PoolManager.teardown`, which forgets the pool and
  ends it); the whole stop takes well under 3 s, and at once after a second press.

From the stop on, the ranks' stderr is no longer relayed: what a process prints while it is being torn
down (a DataLoader's ``Exception ignored in …``, a half-import's traceback) says nothing the stop message
has not said. Their stdout still is, so a cell's own ``except KeyboardInterrupt: print(...)`` shows.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from ..ranks.rankgroup import RankGroup

REPORT_WAIT_S = 0.7  # after the SIGINT, how long the ranks get to say they were interrupted
TERM_GRACE_S = 0.6  # after SIGTERM, and again after SIGKILL
ESCALATED_GRACE_S = 0.1  # the same after a second press of stop


class StopButton:
    """What the kernel's SIGINT handler saw during one run."""

    def __init__(self, requested: threading.Event | None = None) -> None:
        self.requested = requested or threading.Event()  # given: a stop from elsewhere too (a background run's stop())
        self.presses = 0
        self._deferred = False

    @property
    def escalated(self) -> bool:
        return self.presses > 1

    @contextlib.contextmanager
    def deferred(self):
        """A press here is only noted (the loop acts on it right after)."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    def on_sigint(self, signum, frame) -> None:
        self.presses += 1
        self.requested.set()
        if self.presses == 1 and not self._deferred:  # later presses must not interrupt the stop under way
            raise KeyboardInterrupt


@contextlib.contextmanager
def stop_button(requested: threading.Event | None = None):
    """Notice SIGINT (the kernel's stop button) for the run's whole length, whatever code it lands in; and
    ``requested``, set from elsewhere (a background run's ``stop()``; off the main thread, the only way)."""
    button = StopButton(requested)
    if threading.current_thread() is not threading.main_thread():
        yield button
        return
    previous = signal.signal(signal.SIGINT, button.on_sigint)
    try:
        yield button
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_run(run, pool: RankGroup, manager, button: StopButton) -> None:
    """Say where each rank was, SIGINT each process once (if the cell runs), then escalate; within ~3 s.
    ``run`` is the run's loop (:class:`~nbtrain.kernel.lifecycle.run._Run`), asked through its methods."""
    run.flush_output()
    elsewhere = pool.stopped_elsewhere()
    if elsewhere:  # a detached run another kernel controls: this kernel stops following it, the run goes on
        run.say(f"\nnbtrain: {elsewhere}\n")
    elif run.cell_running():
        where = run.where_each_rank_is(wait=0.4)
        report = "".join(f"  rank {rank}: {line}\n" for rank, line in where.items())
        run.say("\nnbtrain: stopped by the user." + (f" Where each rank was:\n{report}" if report else "\n"))
        if not button.escalated:
            pool.interrupt()
            _await_reports(run, pool, button)
    else:
        run.say("\nnbtrain: stopped by the user while the ranks were starting.\n")
    manager.teardown(pool, grace=ESCALATED_GRACE_S if button.escalated else TERM_GRACE_S,
                     drain=lambda: run.drain(0.2, streams=("stdout",)))


def _await_reports(run, pool: RankGroup, button: StopButton) -> None:
    """Until every rank said it was interrupted (or exited), :data:`REPORT_WAIT_S` passed, or stop is pressed again."""
    reported = run.reported_ranks()
    deadline = time.monotonic() + REPORT_WAIT_S
    while time.monotonic() < deadline and not button.escalated and len(reported) < pool.world_size:
        for event in pool.poll_events(0.05):
            if run.take(event, late=("stdout",)):  # its stdout, and the metrics the interrupted cell flushed
                reported.add(event.rank)
