"""Relay the ranks' stdout and stderr into the running cell, live, without mixing ranks within a line.

The kernel's main thread — the one executing the cell — writes what the ranks print, so output lands in
the cell that ran them (not in whichever cell is active when a background thread happens to flush).

**Several ranks shown** (``--output all``, the default, with 2+ ranks): each rank's stream is cut into
lines. A complete line is written at once, whole (other ranks' lines start with ``[rank k] ``). An
unfinished line — ``print("epoch 1 ... ", end="")`` — is held until its newline, until the cell ends, or
until it grows past :data:`HOLD_MAX` characters, and then written whole; so two ranks' text never shares
a line and the summary never runs into a rank's last words. A held line is kept as a terminal would
show it: ``\\r`` moves back to its start and later text overwrites (a tqdm bar held for a minute is one
bar, not a minute of redraws).

Progress bars (lines redrawn with ``\\r``) of rank 0 — the *live* rank — are drawn live: its bar is the
open last line of its stream. When another rank writes a line on that stream the bar is blanked, the line
written, and the bar drawn again below it. Other ranks' bars appear once finished, in their final
state; the end of the cell says so once and names ``--output rank<k>`` to watch rank k's live.

**One rank shown** (one rank, or ``--output rank<k>``): its text is written as it arrives (a partial line
shows at once); other ranks' text is not shown but still kept — a failure report quotes a rank's last
lines (:meth:`OutputRelay.tail`). At the end of the cell an unfinished last line gets its newline.

A job's end mark (:data:`~nbtrain.wire.protocol.END_MARK` + job id) is taken out of the stream and
recorded, so the run knows when it has shown every byte a rank printed for the job.

A display mark (:data:`~nbtrain.wire.protocol.DISPLAY_MARK` + number) is where a rank's figure or
``display()`` belongs: ``show_display(rank, number)`` shows it there (a line the rank left unfinished
before it is ended first, so it goes above the figure). Until it can (the bundle comes on the socket and
may be later than the mark), the stream's text from the mark on is held, and the next
:meth:`OutputRelay.feed` tries again; :meth:`OutputRelay.flush` (the run is over) lets it go. An input mark
(:data:`~nbtrain.wire.protocol.INPUT_MARK`, a rank's prompt) is handled the same way with
``answer_prompt(rank, number)`` (:mod:`nbtrain.kernel.relay.stdin`) — for shown and hidden ranks alike.
"""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ...wire.protocol import DISPLAY_MARK, END_MARK, INPUT_MARK, MARKS

TAIL_LINES = 20
HOLD_MAX = 8192  # characters of an unfinished line held before it is written anyway
LIVE_RANK = 0
_LINE_BREAKS = re.compile(r"([\r\n])")


def write_to_std_stream(stream: str, text: str) -> None:
    """The default writer of relayed text: the kernel's own ``sys.stdout`` / ``sys.stderr``, flushed at once."""
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write(text)
    target.flush()


class _Stream:
    def __init__(self) -> None:
        self.pending = ""  # maybe the start of an end mark
        # line mode: the unfinished line as a terminal shows it, and where the next character lands
        self.line = ""
        self.cursor = 0
        self.carriage_return = False  # a \r was seen in this line: a progress bar
        self.redrawn = False  # ... and text was drawn over earlier text
        self.shown = 0  # live rank: characters of `line` on screen now (0: none)
        # pass-through mode: the next character starts a line (prefix it); the text written ends mid-line
        self.at_line_start = True
        self.open_line = False
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.partial = ""


def _always(rank: int, number: int) -> bool:
    return True


@dataclass(frozen=True)
class AtMarks:
    """What the relay does where a rank's output holds a mark: show its display number N (rank 0's figures), answer
    its prompt N (``input()``, pdb); each says whether it could, now."""

    show_display: Callable[[int, int], bool] = _always
    answer_prompt: Callable[[int, int], bool] = _always


class OutputRelay:
    """``shown``: the one rank whose output is shown, or None for every rank."""

    def __init__(self, write: Callable[[str, str], None], nprocs: int, shown: int | None = None,
                 at_marks: AtMarks = AtMarks(), label: Callable[[int], str] | None = None) -> None:
        self._write = write
        self._label = label or (lambda rank: f"rank {rank}")  # several machines: "node b rank 3"
        self._at_mark = {DISPLAY_MARK: at_marks.show_display, INPUT_MARK: at_marks.answer_prompt}
        self._nprocs = self.nprocs = nprocs
        self._shown = shown
        self._line_mode = nprocs > 1 and shown is None
        self._streams: dict[tuple[int, str], _Stream] = collections.defaultdict(_Stream)
        self.marks: dict[tuple[int, str], set[int]] = collections.defaultdict(set)
        self._bars_held: set[int] = set()  # ranks whose progress bars were shown only when finished
        self._hinted = False

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
            elif mark != END_MARK and number.isdigit() and not self._reach_mark(mark, rank, stream, state, int(number)):
                state.pending = text  # its bundle (or request) has not arrived: hold what follows until it has
                return
            text = text[newline + 1:]

    def _reach_mark(self, mark: str, rank: int, stream: str, state: _Stream, number: int) -> bool:
        if self._line_mode and (state.line or state.shown):  # an unfinished line printed before the figure goes above it
            self._write_lines(rank, stream, self._end_line(rank, state))
        elif state.open_line:
            self._write(stream, "\n")
            state.at_line_start, state.open_line = True, False
        return self._at_mark[mark](rank, number)

    def write_direct(self, stream: str, text: str) -> None:
        """nbtrain's own words, written between the ranks' lines."""
        self._write_between(stream, text)

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

    def flush(self) -> None:
        """The cell's output ends: write every held line, and end every unfinished one with a newline."""
        for (rank, stream), state in list(self._streams.items()):
            if state.pending.startswith((DISPLAY_MARK, INPUT_MARK)) and "\n" in state.pending:
                rest = state.pending.split("\n", 1)[1]  # the run is over: its bundle (or request) will not come
                state.pending = ""
                self.feed(rank, stream, rest)
            if self._line_mode:
                if state.line or state.shown:
                    self._write_lines(rank, stream, self._end_line(rank, state))
            elif state.open_line:
                self._write(stream, "\n")
                state.at_line_start, state.open_line = True, False
        if self._bars_held and not self._hinted:
            self._hinted = True
            ranks = sorted(self._bars_held)
            self._write("stderr", f"nbtrain: progress bars of rank{'s' if len(ranks) > 1 else ''} "
                        f"{', '.join(map(str, ranks))} were shown once finished (rank 0's live); "
                        f"`--output rank{ranks[0]}` shows rank {ranks[0]}'s output live.\n")

    # ---------------------------------------------------------------------------------------- writing
    def _emit(self, rank: int, stream: str, state: _Stream, text: str) -> None:
        if not text:
            return
        self._remember(state, text)
        if self._line_mode:
            self._edit(rank, stream, state, text)
        elif self._shown is None or rank == self._shown:
            self._write(stream, self._prefixed(rank, state, text) if rank != 0 and self._nprocs > 1 else text)
            state.open_line = text[-1] != "\n"

    def _edit(self, rank: int, stream: str, state: _Stream, text: str) -> None:
        """Apply ``text`` to the rank's unfinished line as a terminal would; write the lines it completes
        (in one write: a chatty rank must not cost a message per line)."""
        finished: list[str] = []
        for part in _LINE_BREAKS.split(text):
            if part == "\n":
                finished.append(self._end_line(rank, state))
            elif part == "\r":
                state.cursor, state.carriage_return = 0, True
            elif part:
                if state.cursor < len(state.line):
                    state.redrawn = True
                state.line = state.line[:state.cursor] + part + state.line[state.cursor + len(part):]
                state.cursor += len(part)
                if len(state.line) > HOLD_MAX:
                    finished.append(self._end_line(rank, state))
        if finished:
            self._write_lines(rank, stream, "".join(finished))
        if rank == LIVE_RANK and state.carriage_return and state.line:
            self._write(stream, "\r" + state.line)  # the live bar: redraw in place
            state.shown = len(state.line)

    def _end_line(self, rank: int, state: _Stream) -> str:
        """The rank's unfinished line, ended: the text to write for it."""
        line, shown = state.line, state.shown
        if state.redrawn and rank != LIVE_RANK and line.strip():
            self._bars_held.add(rank)
        state.line, state.cursor, state.carriage_return, state.redrawn, state.shown = "", 0, False, False, 0
        if shown:  # the live bar is on screen: draw its final state over it and close the line
            return "\r" + line + "\n"
        return (f"[{self._label(rank)}] " if rank != 0 and line else "") + line + "\n"

    def _write_lines(self, rank: int, stream: str, text: str) -> None:
        if rank == LIVE_RANK:
            self._write(stream, text)  # its own bar, if shown, is closed by the text itself
        else:
            self._write_between(stream, text)

    def _write_between(self, stream: str, text: str) -> None:
        """Write whole lines; a live bar open on ``stream`` is blanked first and drawn again after them."""
        live = self._streams.get((LIVE_RANK, stream)) if self._line_mode else None
        if live is None or not live.shown:
            self._write(stream, text)
            return
        self._write(stream, "\r" + " " * live.shown + "\r" + text + ("" if text.endswith("\n") else "\n") + live.line)

    def _prefixed(self, rank: int, state: _Stream, text: str) -> str:
        prefix = f"[{self._label(rank)}] "
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
