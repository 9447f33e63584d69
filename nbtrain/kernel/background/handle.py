"""A background run's handle: what any cell can ask of a ``%%distributed --background`` run and do to it.

The cell returns it at once (it is also ``nbtrain.last_run``); its thread (:mod:`.runner`) moves it from state to
state, and the notebook's cells read it: ``run.state``, ``run.wait()``, ``run.stop()``, ``run.result`` (rank 0's
names, once it finished), ``run.history`` (what was logged, however it ended). The names reach the notebook's
namespace only at a safe point (:mod:`.arrivals`), never in the middle of a cell.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..observers.events import RunState
from ..observers.history import History

STOP_WAIT_S = 30.0  # run.stop() waits this long for the ranks to be stopped (they take about 3 s)
_ENDED = (RunState.FINISHED, RunState.FAILED, RunState.INTERRUPTED)


class BackgroundRun:
    """One background run (see the module docstring); its state is written by its runner through the methods
    below, read by anyone."""

    def __init__(self, number: int, source: str, assigns: tuple[str, ...],
                 deliver: Callable[[BackgroundRun], None] = lambda run: None, detached: str = "") -> None:
        self.number = number  # the kernel's background runs, counted from 1
        self.detached = detached  # --detach: the run's id (%distributed_attach ID follows it from any kernel)
        self.source = source
        self.assigns = assigns  # the names rank 0 will bring back but imports: a cell reading them early is warned
        self.state = RunState.STARTING
        self.result: dict = {}  # rank 0's names, once the run finished
        self.history = History()  # what the ranks logged so far (the run's own, updated live)
        self.error: str = ""  # how it failed, in one line
        self.delivered = False  # its names and history reached the notebook's namespace
        self.stop_event = threading.Event()  # the runner's run stops when it is set (run_source's stop=)
        self._deliver = deliver  # hands the names to the notebook (arrivals.Arrivals.deliver)
        self._ended = threading.Event()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------- the runner's side
    def running(self) -> None:
        with self._lock:
            if self.state is RunState.STARTING:
                self.state = RunState.RUNNING

    def logged(self, rank: int, records) -> None:
        """What a rank logged, as it comes (the run's live ``history``)."""
        self.history.add(rank, records)

    def ended(self, state: RunState, result: dict, history: History, error: str = "") -> None:
        with self._lock:
            self.state, self.result, self.history, self.error = state, dict(result), history, error
        self._ended.set()

    def mark_delivered(self) -> None:
        self.delivered = True

    # ---------------------------------------------------------------------------- the notebook's side
    @property
    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> BackgroundRun:
        """Block until the run ends (at most ``timeout`` seconds); its names then arrive in the notebook at once."""
        self._ended.wait(timeout)
        if self.done:
            self._deliver(self)
        return self

    def stop(self, timeout: float = STOP_WAIT_S) -> BackgroundRun:
        """Stop the run as the stop button stops a cell: every rank and its child processes end."""
        if not self.done:
            self.stop_event.set()
            self._ended.wait(timeout)
        return self

    def __repr__(self) -> str:
        step = len(self.history.series(self.history.names[0])) if self.history.names else 0
        logged = f", {step} logged steps" if step else ""
        ended = f": {self.error}" if self.error else ""
        kind = f"detached run {self.detached}" if self.detached else f"background run {self.number}"
        return f"<nbtrain {kind}: {self.state.value}{logged}{ended}>"
