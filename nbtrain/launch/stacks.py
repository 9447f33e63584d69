"""Where is each rank? Python stacks of live ranks, read without their cooperation.

Each rank registers :mod:`faulthandler` on SIGUSR1 with a private file (``NBTRAIN_STACK_FILE``). Sending
the signal makes the rank write every thread's Python stack there — from C, so it works while the rank is
blocked inside a collective, a DataLoader queue or a lock, which is exactly when it matters.

:func:`summarise` turns such a dump into one line a person can act on::

    rank 1: waiting in barrier() (torch.distributed), from cell line 6: dist.barrier()
    rank 0: at cell line 4: time.sleep(600)

The kernel asks for stacks when a rank fails (to show where the others were) and when the user presses
stop (to show where every rank was) — the hang diagnosis nbtrain gives instead of silence.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_WORKER = os.sep + os.path.join("nbtrain", "worker") + os.sep
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


def summarise(dump: str, cell_filename_prefix: str, cell_lines: list[str], line_offset: int) -> str:
    """One line: which collective the rank waits in (if any) and where in the cell it is."""
    frames = [f for f in main_thread(parse_threads(dump)) if _WORKER not in f.filename]
    if not frames:
        return "no Python stack (the rank may be exiting)"
    in_cell = next((f for f in frames if f.filename.startswith(cell_filename_prefix)), None)
    collective = next((f for f in reversed(frames) if _DISTRIBUTED in f.filename
                       and not f.function.startswith("_") and f.function != "wrapper"), None)
    where = ""
    if in_cell is not None:
        source = cell_lines[in_cell.lineno - 1].strip() if 0 < in_cell.lineno <= len(cell_lines) else ""
        where = f"cell line {in_cell.lineno + line_offset}" + (f": {source}" if source else "")
    else:
        top = frames[0]
        where = f"{os.path.basename(top.filename)}:{top.lineno} in {top.function}"
    if collective is not None:
        return f"waiting in {collective.function}() (torch.distributed), from {where}"
    innermost = frames[0]
    if in_cell is not None and innermost is not in_cell:
        return f"at {where} (inside {innermost.function}, {os.path.basename(innermost.filename)}:{innermost.lineno})"
    return f"at {where}"
