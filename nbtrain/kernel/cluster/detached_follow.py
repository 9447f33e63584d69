"""Following a detached run live: its events read on from the offset reached, each line once, until it ended.

The agent appends whole lines and rewrites the manifest's state only after its last append (unbuffered), so a
read made after the manifest was seen final holds everything: the follower checks the state first, then reads,
and stops after the first read that follows a final state. Nothing is read twice and nothing is skipped,
because each read starts where the last whole line ended (:func:`nbtrain.wire.runfolder.read_events`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ...wire.runfolder import RecordedState, RunFolderError, read_events, read_manifest

POLL_S = 0.2  # how often a live run's log is read again: a dashboard's pace, not a busy loop


def follow(run_id: str, on_events: Callable[[list[dict]], None], stop: threading.Event | None = None,
           poll_s: float = POLL_S) -> RecordedState:
    """Hand every event of ``run_id`` to ``on_events`` in batches, in order, from the first one, until the run
    ended (its final state is returned) or ``stop`` is set (then the state read last is)."""
    stop = stop or threading.Event()
    offset = 0
    while True:
        summary = read_manifest(run_id)
        if summary is None:
            raise RunFolderError(f"there is no run {run_id!r} of this user's to follow")
        events, offset = read_events(run_id, offset)
        if events:
            on_events(events)
        if summary.state is not RecordedState.RUNNING or stop.wait(poll_s):
            return summary.state
