"""Where is each rank? Python stacks of live ranks, read without their cooperation.

Each rank registers :mod:`faulthandler` on SIGUSR1 with a private file (``NBTRAIN_STACK_FILE``). Sending
the signal makes the rank write every thread's Python stack there — from C, so it works while the rank is
blocked inside a collective, a DataLoader queue or a lock, which is exactly when it matters.

:func:`summarise` turns such a dump into one line a person can act on::

    rank 1: waiting in barrier() (torch.distributed), from cell line 6: dist.barrier()
    rank 0: at cell line 4: time.sleep(600)

The kernel asks for stacks when a rank fails (to show where the others were), when the user presses
stop (to show where every rank was) and when some ranks finished the cell while others did not (to see
whether those wait in a collective that can never complete, :mod:`.mismatch`) — the hang diagnosis
nbtrain gives instead of silence. :func:`request_stacks` sends the signals and reads the files; it needs
only pids and file names, so it works for whatever started the ranks on this machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ...wire.stackfiles import request_stacks
from .failures import CellPlace

__all__ = ["request_stacks", "summarise", "whereabouts"]

_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_WORKER = os.sep + os.path.join("nbtrain", "rank") + os.sep
_DISTRIBUTED = os.sep + os.path.join("torch", "distributed") + os.sep


@dataclass(frozen=True)
class StackFrame:
    filename: str
    lineno: int
    function: str


def parse_threads(dump: str) -> list[list[StackFrame]]:
    """Threads of the last dump in ``dump``, each as frames innermost first (faulthandler's order)."""
    threads: list[list[StackFrame]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append(StackFrame(m["file"], int(m["line"]), m["func"]))
    return threads


def main_thread(threads: list[list[StackFrame]]) -> list[StackFrame]:
    """The thread running the cell: the one whose outermost frames are nbtrain's worker loop."""
    for frames in threads:
        if any(_WORKER in f.filename and f.function == "main" for f in frames):
            return frames
    return threads[0] if threads else []


@dataclass(frozen=True)
class Position:
    """Where a rank's main thread is: the collective it waits in (if any) and its place in the cell."""

    collective: str | None  # a public torch.distributed function, e.g. "all_reduce"
    cell_line: int | None  # as the user sees it (shifted by the magic's line)
    where: str  # "cell line 3: dist.all_reduce(x)" or "file.py:12 in f"
    inside: str | None = None  # the innermost function when it is not the cell's own line
    has_stack: bool = True


def locate(dump: str, cell_filename_prefix: str, cell_lines: list[str], line_offset: int) -> Position:
    """The rank's position, read from a faulthandler dump."""
    frames = [f for f in main_thread(parse_threads(dump)) if _WORKER not in f.filename]
    if not frames:
        return Position(None, None, "", has_stack=False)
    in_cell = next((f for f in frames if f.filename.startswith(cell_filename_prefix)), None)
    collective = next((f for f in reversed(frames) if _DISTRIBUTED in f.filename
                       and not f.function.startswith("_") and f.function != "wrapper"), None)
    if in_cell is not None:
        source = cell_lines[in_cell.lineno - 1].strip() if 0 < in_cell.lineno <= len(cell_lines) else ""
        where = f"cell line {in_cell.lineno + line_offset}" + (f": {source}" if source else "")
    else:
        top = frames[0]
        where = f"{os.path.basename(top.filename)}:{top.lineno} in {top.function}"
    innermost = frames[0]
    inside = (f"{innermost.function}, {os.path.basename(innermost.filename)}:{innermost.lineno}"
              if in_cell is not None and innermost is not in_cell else None)
    return Position(collective.function if collective else None,
                    in_cell.lineno + line_offset if in_cell else None, where, inside)


def is_complete(dump: str) -> bool:
    """Whether the dump reaches the rank's outermost frame (nbtrain's worker loop): not cut short or partial."""
    return any(_WORKER in f.filename and f.function == "main" for frames in parse_threads(dump) for f in frames)


def summarise(dump: str, cell_filename_prefix: str, cell_lines: list[str], line_offset: int) -> str:
    """One line: which collective the rank waits in (if any) and where in the cell it is."""
    pos = locate(dump, cell_filename_prefix, cell_lines, line_offset)
    if not pos.has_stack:
        return "no Python stack (the rank may be exiting)"
    if pos.collective is not None:
        return f"waiting in {pos.collective}() (torch.distributed), from {pos.where}"
    return f"at {pos.where}" + (f" (inside {pos.inside})" if pos.inside else "")


def whereabouts(pool, cell: CellPlace, wait: float, ranks=None) -> dict[int, str]:
    """One line per live rank of ``pool`` (of ``ranks``, default all) saying where it is in ``cell``."""
    lines = cell.source.splitlines()
    return {rank: summarise(dump, cell.filename, lines, cell.line_offset)
            for rank, dump in sorted(pool.dump_stacks(wait, ranks).items())}
