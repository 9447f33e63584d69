"""Debugging a rank: ``breakpoint()`` and ``nbtrain.breakpoint(rank=k)`` open pdb in the cell's output.

A rank's prompts travel to the notebook (:mod:`nbtrain.rank.prompts`: ``input()`` is answered by the
kernel's own input request), so pdb works in a rank as in a notebook cell: its listing is the rank's
output, its ``(Pdb)`` prompt is an input box under the cell. This module adds the debugger itself:

* :class:`RankPdb` — pdb that leaves SIGINT to nbtrain (the stop button still stops the run, it does not
  break into the debugger), skips nbtrain's own frames, and stops tracing when the cell's own frame
  returns (``n`` at the cell's last line ends the session instead of stepping into what the rank runs
  after the cell: packing the results). The builtin ``breakpoint()`` in a rank opens one (:func:`breakpointhook`);
* :func:`breakpoint` — ``nbtrain.breakpoint(rank=1)``, called by *every* rank like a collective: rank 1
  stops in pdb at the caller's next line, the others wait until it leaves the debugger (``c``, ``q``, or
  the cell's end).

**The collective timeout while a human debugs.** A collective gives up after the process group's timeout
(``--timeout``, 600 s by default) — gloo raises, NCCL's watchdog aborts — and a timeout cannot be
paused for a collective already waiting. So the waiting ranks of :func:`breakpoint` are not in a
collective: they wait (a tenth of a second at a time, interruptible by the stop button) for the kernel's
:class:`~nbtrain.wire.protocol.BreakpointRelease`, which it sends every rank when the debugged rank says it left
pdb — on their authenticated channels, never through the rendezvous store, where anyone who reaches its port
could release them early. No timeout runs while they wait, however long the human takes, and the kernel's uneven-collective detector
(:mod:`nbtrain.kernel.diagnostics.mismatch`) does not report them: it acts only when every unfinished rank sits in
a collective. Once every rank is past the breakpoint the collectives after it pair up as before.

The builtin ``breakpoint()`` stops only the rank that calls it; the others run on, and if they reach a
collective the debugged rank has not, they wait there under the process group's timeout (the reason
:func:`breakpoint` exists). While stepping with ``n`` in :func:`breakpoint`'s rank, a line with a
collective waits for the other ranks, which are still at the breakpoint: continue (``c``) past it.
"""

from __future__ import annotations

import os
import pdb  # noqa: T100 - a debugger for the ranks is what this module is for
import sys
import time
from collections.abc import Callable

from ...wire import protocol as P

POLL_S = 0.1  # the waiting ranks look for the release this often (the stop button lands in between)
SKIP = ("nbtrain", "nbtrain.*")  # frames pdb does not stop in: nbtrain's own code around the cell

_job: dict = {"id": None, "calls": 0, "release": [], "send": None}
_released: set[tuple[int, int]] = set()  # (job, call) the kernel released: the channel's thread adds to it


class RankPdb(pdb.Pdb):
    """pdb for a rank: no SIGINT handler of its own, nbtrain's frames skipped, ``on_leave`` called once
    when the user continues or quits."""

    def __init__(self, on_leave: Callable[[], None] | None = None) -> None:
        super().__init__(nosigint=True, skip=SKIP)
        self._on_leave = on_leave

    def dispatch_return(self, frame, arg):
        result = super().dispatch_return(frame, arg)
        if _is_nbtrain(frame.f_back):  # the cell's own frame returns into nbtrain: debugging ends with the cell
            self.set_continue()  # (stepping on would stop in whatever the rank runs after the cell)
            return None
        return result

    def set_continue(self) -> None:
        self._leave()
        super().set_continue()

    def set_quit(self) -> None:
        self._leave()
        super().set_quit()

    def _leave(self) -> None:
        on_leave, self._on_leave = self._on_leave, None
        if on_leave is not None:
            on_leave()


def _is_nbtrain(frame) -> bool:
    return frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] == "nbtrain"


def _caller():
    """The innermost frame outside nbtrain: where the user called breakpoint() (past nbtrain's facade)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _is_nbtrain(frame):
        frame = frame.f_back
    return frame


def begin(job_id: int, send: Callable[[object], None] | None = None) -> None:
    """A cell starts: breakpoints are counted from 1 again (each rank counts its calls the same way); ``send``
    tells the kernel this rank left the debugger."""
    _job.update(id=job_id, calls=0, release=[], send=send)
    _released.clear()


def released(message: P.BreakpointRelease) -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.BreakpointRelease` (on the channel's thread)."""
    _released.add((message.job_id, message.call))


def end() -> None:
    """The cell ended (perhaps while its rank was still in pdb): let every rank still waiting go on."""
    for release in list(_job["release"]):
        release()
    _job["release"] = []


def breakpointhook(*args, **kwargs) -> None:
    """``sys.breakpointhook`` in a rank: the builtin ``breakpoint()`` stops this rank, at the caller's next line."""
    if os.environ.get("PYTHONBREAKPOINT") == "0":  # as the default hook: breakpoints switched off
        return
    RankPdb().set_trace(_caller())


def breakpoint(rank: int = 0) -> None:
    """Stop rank ``rank`` in pdb at the caller's next line; the other ranks wait for it, outside any collective.

    Every rank must call it (like a collective). See the module docstring for why no timeout fires.
    """
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        RankPdb().set_trace(_caller())
        return
    if not 0 <= rank < dist.get_world_size():
        raise ValueError(f"nbtrain.breakpoint(rank={rank}): this run's ranks are 0 to {dist.get_world_size() - 1}")
    _job["calls"] += 1
    call, send = (_job["id"], _job["calls"]), _job["send"]
    if dist.get_rank() != rank:
        while call not in _released:
            time.sleep(POLL_S)
        return

    def release() -> None:
        if release in _job["release"]:
            _job["release"].remove(release)
            if send is not None:
                send(P.BreakpointLeft(*call))

    _job["release"].append(release)
    print(f"nbtrain: rank {rank} stopped in the debugger; the other ranks wait (n: next line, c: continue)")
    RankPdb(on_leave=release).set_trace(_caller())
