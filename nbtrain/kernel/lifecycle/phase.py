"""The phase of one cell's run, which only the run's loop (:class:`~nbtrain.kernel.lifecycle.run._Run`) changes.

A run starts its ranks (``STARTING``), sends them the cell once all joined (``RUNNING``), then either every rank
says Done and the loop waits for their last output (``FINISHING``, then ``FINISHED``) or a rank fails and the
others get a moment to report the same error (``FAILING``, then ``FAILED``). A rank may still fail while the loop
waits for the last output, so ``FINISHING`` can turn into ``FAILING``; nothing leaves ``FINISHED`` or ``FAILED``.
A run stopped by the stop button keeps the phase it was in: the stop (:mod:`.stopping`) ends it from any.
"""

from __future__ import annotations

from enum import Enum


class RunPhase(Enum):
    STARTING = "starting"  # the ranks are started or join; the cell is not sent yet
    RUNNING = "running"  # every rank has the cell
    FINISHING = "finishing"  # every rank said Done: their output up to the job's end mark is awaited
    FAILING = "failing"  # a rank failed: the others get a moment to report the same error
    FINISHED = "finished"
    FAILED = "failed"


_NEXT = {
    RunPhase.STARTING: {RunPhase.RUNNING, RunPhase.FAILING},
    RunPhase.RUNNING: {RunPhase.FINISHING, RunPhase.FAILING},
    RunPhase.FINISHING: {RunPhase.FINISHED, RunPhase.FAILING},
    RunPhase.FAILING: {RunPhase.FAILED},
    RunPhase.FINISHED: set(),
    RunPhase.FAILED: set(),
}


class IllegalPhaseChange(RuntimeError):
    """A run was asked to go to a phase that cannot follow its own: a mistake in nbtrain, not the user's."""


def checked_next(current: RunPhase, new: RunPhase) -> RunPhase:
    """``new`` when a run in ``current`` may go there; :class:`IllegalPhaseChange` otherwise."""
    if new not in _NEXT[current]:
        raise IllegalPhaseChange(f"a run cannot go from {current.name} to {new.name}")
    return new
