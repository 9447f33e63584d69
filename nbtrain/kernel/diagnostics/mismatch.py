"""Uneven collectives: some ranks finished the cell while the others wait in a collective for them.

``if rank == 0: dist.all_reduce(x)`` is the classic distributed bug: rank 0 waits for a partner that has
already left the cell, and without help it waits for the process group's whole timeout (10 minutes by
default) and then reports a socket error deep inside gloo. Once a rank has finished the cell, though, it
will never join another collective of this job — so a rank that sits in one is stuck for good.

:class:`MismatchWatcher` runs inside the run's loop (:mod:`nbtrain.kernel.lifecycle.run`). When at least one rank
has finished and others have not for :data:`SETTLE_S`, it asks the unfinished ones where they are
(:mod:`nbtrain.kernel.diagnostics.stacks`: faulthandler stacks on SIGUSR1, readable while a rank is blocked in C).
Only if *every* unfinished rank sits in a torch.distributed collective (:data:`COLLECTIVES`), and is
still in the same one at the same cell line :data:`CONFIRM_S` later, is the run failed — with the
ranks, the collective and the cell line::

    rank 1 finished the cell; rank 0 waits in all_reduce() at cell line 3 — every rank must call the same collectives

A rank that is merely slower (computing, loading data, sleeping) is never stopped; its stacks are read
again after a growing pause (0.5 s, then 1.5 times longer each time, at most 10 s), so a long tail costs
a dump every 10 s. A dump that arrives late or cut short counts as "cannot tell", never as stuck. Ranks that wait in a collective
together with another unfinished rank (a subgroup) are left alone too: one of them is not in a
collective yet, or they finish within the confirmation pause.

The failure is a program error, like an exception in the cell: ``--max-restarts`` does not repeat it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...wire.protocol import Frame, RemoteError
from .stacks import Position, is_complete, locate

SETTLE_S = 2.0  # every rank finishing within this of the first is normal skew, not worth a look
CONFIRM_S = 0.5  # still in the same collective after this: stuck
FIRST_PAUSE_S, PAUSE_GROWTH, MAX_PAUSE_S = 0.5, 1.5, 10.0  # between looks at a slower rank
DUMP_WAIT_S = 1.0  # an upper bound: a busy machine may take a moment to schedule the dumping rank
MISMATCH_TYPE = "CollectiveMismatch"
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "send", "recv", "send_object_list", "recv_object_list",
    "batch_isend_irecv", "new_group", "new_subgroups",
})


@dataclass(frozen=True)
class Mismatch:
    """The diagnosis: who finished, who waits where."""

    finished: tuple[int, ...]
    waiting: dict[int, Position]
    cell: tuple[str, list[str], int]  # file name of the cell's code, its lines, the magic's line offset

    def message(self) -> str:
        done = f"rank {self.finished[0]}" if len(self.finished) == 1 else f"ranks {_join(self.finished)}"
        waits = ", ".join(f"rank {rank} waits in {pos.collective}()"
                          + (f" at cell line {pos.cell_line}" if pos.cell_line is not None else f" ({pos.where})")
                          for rank, pos in sorted(self.waiting.items()))
        return f"{done} finished the cell; {waits} — every rank must call the same collectives"

    def error(self) -> RemoteError:
        """As a rank's error, with the waiting rank's cell line as its one frame (mapped like a traceback's)."""
        cell_filename, cell_lines, line_offset = self.cell
        rank, pos = min(self.waiting.items())
        frames: tuple[Frame, ...] = ()
        if pos.cell_line is not None:
            lineno = pos.cell_line - line_offset
            source = cell_lines[lineno - 1] if 0 < lineno <= len(cell_lines) else None
            frames = (Frame(cell_filename, lineno, "<module>", source),)
        return RemoteError(MISMATCH_TYPE, self.message(), frames)


class MismatchWatcher:
    """Call :meth:`check` on every turn of the loop; it returns a :class:`Mismatch` once it is sure."""

    def __init__(self, pool, cell_filename: str, cell_source: str, line_offset: int) -> None:
        self.pool = pool
        self.cell = (cell_filename, cell_source.splitlines(), line_offset)
        self._next_look: float | None = None
        self._pause = FIRST_PAUSE_S
        self._suspect: dict[int, Position] | None = None

    def check(self, finished: set[int], now: float) -> Mismatch | None:
        unfinished = [r for r in range(self.pool.world_size) if r not in finished]
        if not finished or not unfinished:
            return None
        if self._next_look is None:
            self._next_look = now + SETTLE_S
        if now < self._next_look:
            return None
        dumps = self.pool.dump_stacks(DUMP_WAIT_S, unfinished)
        waiting = self._waiting(dumps) if set(dumps) == set(unfinished) else None
        if waiting is None:  # someone does something else (or did not answer in time): look again, less often
            self._suspect = None
            self._next_look = time.monotonic() + self._pause
            self._pause = min(self._pause * PAUSE_GROWTH, MAX_PAUSE_S)
            return None
        if self._suspect != waiting:  # first sighting (or it moved on): confirm before failing the run
            self._suspect = waiting
            self._next_look = time.monotonic() + CONFIRM_S
            return None
        return Mismatch(tuple(sorted(finished)), waiting, self.cell)

    def _waiting(self, dumps: dict[int, str]) -> dict[int, Position] | None:
        """Each rank's position if every one of them waits in a collective, else None."""
        if not all(is_complete(dump) for dump in dumps.values()):  # cut short: cannot tell
            return None
        positions = {rank: locate(dump, *self.cell) for rank, dump in dumps.items()}
        if all(pos.collective in COLLECTIVES for pos in positions.values()):
            return positions
        return None


def _join(ranks) -> str:
    return ", ".join(map(str, ranks))
