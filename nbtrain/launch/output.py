"""Relay the ranks' stdout and stderr into the running cell, live.

The kernel's main thread — the one executing the cell — writes what the ranks print, so output lands in
the cell that ran them (not in whichever cell is active when a background thread happens to flush).

* Ranks print line by line; with several ranks shown, an unfinished line is held up to :data:`HOLD_S`
  so two ranks never interleave inside one line (a ``print(..., end="")`` still shows within 0.1 s).
* Rank 0's text is written as printed; other ranks' lines start with ``[rank k] `` (also after a ``\\r``,
  so a tqdm bar redrawn in place keeps its prefix). With ``--output rank0`` other ranks are not shown,
  but their last lines are still kept: a failure report quotes them.
* A job's end mark (:data:`~nbtrain.launch.protocol.END_MARK` + job id) is taken out of the stream and
  recorded, so the run knows when it has shown every byte a rank printed for the job.
* A display mark (:data:`~nbtrain.launch.protocol.DISPLAY_MARK` + number) is where a rank's figure or
  ``display()`` belongs: ``show_display(rank, number)`` shows it there. Until it can (the bundle comes on
  the socket and may be later than the mark), the stream's text from the mark on is held, and the next
  :meth:`OutputRelay.feed` tries again. :meth:`OutputRelay.flush` with 0 (the run is over) lets it go.
"""

from __future__ import annotations

import collections
import re
import sys
import time
from typing import Callable

from .protocol import DISPLAY_MARK, END_MARK, MARKS

TAIL_LINES = 20
HOLD_S = 0.1
_LINE_BREAKS = re.compile(r"([\r\n])")


def write_to_std_stream(stream: str, text: str) -> None:
    """The default writer of relayed text: the kernel's own ``sys.stdout`` / ``sys.stderr``, flushed at once."""
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write(text)
    target.flush()


class _Stream:
    def __init__(self) -> None:
        self.pending = ""
        self.held = ""  # an unfinished line, kept briefly so ranks do not interleave mid-line
        self.held_since = 0.0
        self.at_line_start = True
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.partial = ""


class OutputRelay:
    def __init__(self, write: Callable[[str, str], None], nprocs: int, show_all: bool = True,
                 show_display: Callable[[int, int], bool] | None = None) -> None:
        self._write = write
        self._show_display = show_display or (lambda rank, number: True)
        self._nprocs = nprocs
        self._show_all = show_all
        self._streams: dict[tuple[int, str], _Stream] = collections.defaultdict(_Stream)
        self.marks: dict[tuple[int, str], set[int]] = collections.defaultdict(set)

    def feed(self, rank: int, stream: str, text: str) -> None:
        state = self._streams[(rank, stream)]
        text = state.pending + text
        state.pending = ""
        while text:
            cut = text.find(END_MARK[0])
            if cut < 0:
                self._emit(rank, stream, state, text)
                return
            self._emit(rank, stream, state, text[:cut])
            text = text[cut:]
            if any(len(text) < len(m) and m.startswith(text) for m in MARKS):
                state.pending = text  # maybe the start of a mark: wait for more
                return
            mark = next((m for m in MARKS if text.startswith(m)), None)
            if mark is None:
                self._emit(rank, stream, state, text[0])
                text = text[1:]
                continue
            newline = text.find("\n")
            if newline < 0:
                state.pending = text
                return
            number = text[len(mark):newline]
            if mark == END_MARK and number.isdigit():
                self.marks[(rank, stream)].add(int(number))
            elif mark == DISPLAY_MARK and number.isdigit() and not self._display(rank, stream, state, int(number)):
                state.pending = text  # its bundle has not arrived: hold what follows until it has
                return
            text = text[newline + 1:]

    def _display(self, rank: int, stream: str, state: _Stream, number: int) -> bool:
        if state.held:  # an unfinished line printed before the figure goes above it
            text, state.held, state.held_since = state.held, "", 0.0
            self._write_as(rank, stream, state, text)
        return self._show_display(rank, number)

    def write_direct(self, stream: str, text: str) -> None:
        """nbtrain's own words, written between the ranks' lines."""
        self._write(stream, text)

    def ended(self, rank: int, job_id: int) -> bool:
        return all(job_id in self.marks[(rank, s)] for s in ("stdout", "stderr"))

    def tail(self, rank: int) -> list[str]:
        """The last lines rank ``rank`` printed on either stream (shown or not)."""
        lines: list[str] = []
        for stream in ("stdout", "stderr"):
            state = self._streams.get((rank, stream))
            if state is not None:
                lines.extend(state.tail)
                if state.partial.strip():
                    lines.append(state.partial)
        return lines[-TAIL_LINES:]

    def _emit(self, rank: int, stream: str, state: _Stream, text: str) -> None:
        if not text:
            return
        self._remember(state, text)
        if rank != 0 and not self._show_all:
            return
        if self._nprocs > 1 and self._show_all:
            text = state.held + text
            end = max(text.rfind("\n"), text.rfind("\r")) + 1
            text, state.held = text[:end], text[end:]
            if state.held and not text:
                state.held_since = state.held_since or time.monotonic()
                return
            state.held_since = time.monotonic() if state.held else 0.0
        self._write_as(rank, stream, state, text)

    def _write_as(self, rank: int, stream: str, state: _Stream, text: str) -> None:
        if text:
            self._write(stream, self._prefixed(rank, state, text) if rank != 0 and self._nprocs > 1 else text)

    def flush(self, older_than: float = HOLD_S) -> None:
        """Write unfinished lines held longer than ``older_than`` seconds (0: all of them)."""
        now = time.monotonic()
        for (rank, stream), state in list(self._streams.items()):
            if older_than == 0 and state.pending.startswith(DISPLAY_MARK) and "\n" in state.pending:
                rest = state.pending.split("\n", 1)[1]  # the run is over: its bundle will not come
                state.pending = ""
                self.feed(rank, stream, rest)
            if state.held and now - state.held_since >= older_than:
                text, state.held, state.held_since = state.held, "", 0.0
                self._write_as(rank, stream, state, text)

    @staticmethod
    def _prefixed(rank: int, state: _Stream, text: str) -> str:
        prefix = f"[rank {rank}] "
        out = []
        for part in _LINE_BREAKS.split(text):
            if part in ("\r", "\n"):
                state.at_line_start = True
            elif part and state.at_line_start:
                out.append(prefix)
                state.at_line_start = False
            out.append(part)
        return "".join(out)

    @staticmethod
    def _remember(state: _Stream, text: str) -> None:
        parts = (state.partial + text).replace("\r\n", "\n").split("\n")
        state.partial = parts.pop()[-2000:]
        for line in parts:
            line = line.rsplit("\r", 1)[-1]  # a redrawn progress bar: its final state
            state.tail.append(line)
