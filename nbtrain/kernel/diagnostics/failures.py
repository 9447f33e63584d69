"""What the notebook shows when a rank fails: which rank, what happened, and where in *your* code.

A rank reports an exception as frames (file, line, function); the kernel formats them here, because the
kernel knows the sources: the cell body (its lines shifted by the ``%%distributed`` line, so "line 5" is
the fifth line of the cell as you see it) and the notebook's earlier cells (IPython keeps them in
``linecache``; functions sent by value keep their original file names and line numbers), labelled
``Cell In[3], line 4`` as IPython does.

A rank that dies without a Python exception is described by how it died: killed by a signal (SIGKILL
is usually the out-of-memory killer), or exited with a code — with the error torch elastic's ``@record``
wrote for it, if any, and the last lines the rank printed.

:class:`RankFailedError` is raised in the notebook. IPython shows its :meth:`_render_traceback_` instead
of a kernel-side traceback that would only show nbtrain's own frames.

Frames inside torch's own files are folded into one line (``… 3 frames inside torch hidden``): the cell's lines,
the notebook's cells and the user's own modules are what the user can change. Under the error, a hint where its
words lead away from the fix (:mod:`.error_hints`).

A traceback inside an exception's text — a DataLoader worker's, which torch re-raises in the rank as
the message, or a chained cause's — has its frames named the same way.

A failure's one-line :meth:`RankFailure.summary` (the report's first line, the dashboard's summary, the
JupyterLab panel) keeps only the first sentence of the exception's message (:func:`first_sentence`):
a CUDA out-of-memory message runs to several lines of advice, and the full text is already at the end
of the traceback, once. The sentence says what failed: a C++ check's location prefix
(``[enforce fail at alloc_cpu.cpp:127] err == 0.``) is skipped, and an out-of-memory sentence keeps
the size that was asked for.
"""

from __future__ import annotations

import linecache
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...wire.protocol import Frame, RemoteError
from ...wire.restart_policy import peer_lost
from ...common.words import count
from .error_hints import error_hints

# A traceback printed into text: a DataLoader worker's (torch re-raises it in the rank with the worker's
# formatted traceback as the message), a chained cause's.
_TRACEBACK_FILE = re.compile(r'^(?P<indent>[ \t]*)File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)
# c10's failed check, "[enforce fail at alloc_cpu.cpp:127] err == 0. ": where and which condition, before
# the words that say what failed
_ENFORCE_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\][^\n]*?\.\s+(?=\S)")
_SIZE_SENTENCE = re.compile(r"\s*Tried to allocate [^.\n]*(\.\d+[^.\n]*)*\.", re.IGNORECASE)  # CUDA's: how much

# A frame in torch's own files (site-packages on this machine, or on a node's): folded into one line of the report
_TORCH_FILE = re.compile(r"[/\\](site|dist)-packages[/\\]torch[/\\]")

SIGNAL_HINTS = {
    signal.SIGKILL: "often the out-of-memory killer (see `dmesg`), or a `kill -9`",
    signal.SIGSEGV: "a crash in native code (a CUDA/C++ extension, or a bad tensor access)",
    signal.SIGBUS: "often /dev/shm too small for DataLoader workers (raise --shm-size in Docker)",
    signal.SIGABRT: "native code aborted (see the rank's last output above)",
    signal.SIGTERM: "something outside nbtrain asked it to stop",
}


@dataclass
class RankFailure:
    rank: int
    error: RemoteError | None = None  # a Python exception in the rank
    exit_code: int | None = None  # the process ended: < 0 is a signal
    error_file_message: str | None = None
    output_tail: list[str] = field(default_factory=list)
    order: int = 0  # arrival order: the first failure is usually the cause
    starting: bool = False  # ended before joining the process group
    diagnosis: str | None = None  # nbtrain's own account of a program error (uneven collectives)
    label: str | None = None  # how the rank is named where that says more: "node b rank 3" on several machines
    account: str | None = None  # how an exit came about, where nbtrain knows better than the code: a machine lost
    machine_stopping: bool = False  # SIGTERM from outside on this machine: it is going, a restart here would not help

    @property
    def who(self) -> str:
        return self.label or f"rank {self.rank}"

    @property
    def secondary(self) -> bool:
        """A communication error that another rank's death causes: never shown as the cause if one is known."""
        if self.error is None:
            return False
        return peer_lost(self.error.type_name, self.error.message)

    def summary(self) -> str:
        if self.diagnosis is not None:
            return self.diagnosis
        if self.account is not None and self.error is None:
            return self.account
        if self.error is not None:
            where = {"inputs": " while loading the notebook's variables", "results": " while sending results back"}
            message = first_sentence(self.error.message)
            raised = f"{self.error.type_name}: {message}" if message else self.error.type_name
            return f"{self.who} raised {raised}{where.get(self.error.stage, '')}"
        if self.exit_code is not None and self.exit_code < 0:
            sig = signal.Signals(-self.exit_code)
            hint = SIGNAL_HINTS.get(sig)
            return f"{self.who} was killed by {sig.name}" + (f" — {hint}" if hint else "")
        when = "while starting, before the cell ran" if self.starting else "while running the cell"
        return f"{self.who} exited with code {self.exit_code} {when}"


def rank_failure(cause: RemoteError | int, known: RankFailure) -> RankFailure:
    """``known`` (a rank, with what its group knows of it) failed by ``cause``: the exception it reported, or its
    process's exit code. An exception it reported says more than an error file: that file is then left out."""
    if isinstance(cause, RemoteError):
        return replace(known, error=cause, error_file_message=None)
    return replace(known, exit_code=cause)


def order_failures(failures: list[RankFailure]) -> list[RankFailure]:
    """The likely cause first: a rank's own error before the communication errors it caused in the others,
    one with a message (an exception, an error file) before a bare exit, then arrival order, then rank."""
    return sorted(failures, key=lambda f: (f.secondary, not (f.error or f.error_file_message), f.order, f.rank))


@dataclass(frozen=True)
class CellPlace:
    """Where a failed rank's code came from: the cell's code name, its source and its first line in the notebook,
    and IPython's name for the cell's code (``code_name``), to map a rank's traceback onto the cell."""

    filename: str
    source: str
    line_offset: int
    code_name: Callable[[str], str] | None = None


@dataclass(frozen=True)
class StopAccount:
    """What became of the other ranks: those stopped, where each stood, notes on the run's session, and the run's
    device type (``"cpu"``, ``"cuda"``) for the hints under the error."""

    stopped: tuple[int, ...] = ()
    whereabouts: dict[int, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    device_type: str | None = None


class RankFailedError(RuntimeError):
    """One or more ranks failed; the others were stopped. Shows the first failure's mapped traceback."""

    def __init__(self, failures: list[RankFailure], cell: CellPlace, account: StopAccount = StopAccount()):
        self.failures = order_failures(failures)
        self.rank = self.failures[0].rank
        self._cell = (cell.filename, cell.source.splitlines(), cell.line_offset)
        self._code_name = cell.code_name
        self.stopped = list(account.stopped)
        self.whereabouts = dict(account.whereabouts)
        self.notes = list(account.notes)  # what became of the run's session
        self.device_type = account.device_type  # the run's ("cpu", "cuda"), for the hints under the error
        super().__init__(self.failures[0].summary())

    @property
    def remote_type(self) -> str | None:
        first = self.failures[0]
        return first.error.type_name if first.error else None

    def _render_traceback_(self) -> list[str]:
        return f"RankFailedError: {self.report()}".splitlines()

    def __str__(self) -> str:  # the error's name is said once, by whoever shows it (IPython, a traceback's last line)
        return self.report()

    def report(self) -> str:
        first = self.failures[0]
        lines = [first.summary()]
        same = [f.rank for f in self.failures[1:] if f.error and first.error and f.error.headline == first.error.headline]
        if same:
            lines.append(f"({_ranks(same).rsplit(' ', 1)[0]} raised the same error)")
        others, told = [], {first.summary()}
        for f in self.failures[1:]:  # a lost machine's ranks share one account: say it once
            if f.rank not in same and f.summary() not in told:
                others.append(f)
                told.add(f.summary())
        if first.diagnosis is not None:
            lines += self._diagnosis(first)
        elif first.error is not None:
            lines.append("")
            for text in first.error.chained:
                lines += [self._map_text(text), "", "The above exception led to:", ""]
            if first.error.frames:
                lines.append(f"Traceback on {first.who} (most recent call last):")
                lines += self._frames(first.error.frames)
            lines.append(self._map_text(first.error.headline))
            lines += error_hints(first.error, self.device_type)
        else:
            if first.error_file_message:
                lines += ["", f"Error recorded by rank {first.rank}:", str(first.error_file_message).rstrip()]
            elif first.output_tail:
                lines += ["", f"Last output of rank {first.rank}:"] + [f"    {line}" for line in first.output_tail]
        for f in others:
            lines += ["", f"Also: {f.summary()}"]
        if first.error is not None and "timed out" in first.error.message.lower():
            lines += ["", f"Rank {first.rank} waited in a collective longer than the process group's timeout "
                          "(--timeout): a rank that never reaches the same collective is the usual cause."]
        if self.whereabouts:
            lines += ["", "Where the other ranks were:"] + [f"  rank {r}: {w}" for r, w in sorted(self.whereabouts.items())]
        if self.stopped:
            lines += ["", f"{_ranks(self.stopped).capitalize()} stopped. The notebook's variables are unchanged."]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)

    def _diagnosis(self, failure: RankFailure) -> list[str]:
        lines = []
        if failure.error is not None and failure.error.frames:
            lines += ["", f"Rank {failure.rank} is stuck here:"] + self._frames(failure.error.frames)
        return lines + ["", "A collective returns only when every rank of its group calls it: call it on every rank "
                            "(not inside `if rank == ...`), the same number of times and in the same order."]

    def _frames(self, frames: tuple[Frame, ...]) -> list[str]:
        """The frames as the user reads them: the cell's lines, notebook cells and the user's own modules whole; a
        run of frames inside torch folded into one line that says how many were hidden."""
        filename, cell_lines, _ = self._cell
        out: list[str] = []
        hidden = 0
        for frame in frames:
            if _TORCH_FILE.search(frame.filename):
                hidden += 1
                continue
            out += _folded(hidden)
            hidden = 0
            if frame.filename == filename:
                source = cell_lines[frame.lineno - 1] if 0 < frame.lineno <= len(cell_lines) else frame.line
            else:
                source = linecache.getline(frame.filename, frame.lineno) or frame.line
            out.append(f"  {self._where(frame.filename, frame.lineno)}, in {frame.name}")
            if source and source.strip():
                out.append(f"    {source.strip()}")
        return out + _folded(hidden)

    def _where(self, filename: str, lineno: int) -> str:
        """A frame's place as the user knows it: ``Cell line 4`` (this cell), ``Cell In[3], line 2`` (another)."""
        cell_filename, _, offset = self._cell
        if filename == cell_filename:
            return f"Cell line {lineno + offset}"
        named = self._code_name(filename) if self._code_name else None
        if named:
            return f"{named[0]} {named[1]}, line {lineno}"
        return f'File "{filename}", line {lineno}'

    def _map_text(self, text: str) -> str:
        """A traceback inside text (a DataLoader worker's, a chained cause) with its frames named as :meth:`_frames` does."""
        return _TRACEBACK_FILE.sub(lambda m: m["indent"] + self._where(m["file"], int(m["line"])), text)


def first_sentence(message: str, limit: int = 200) -> str:
    """The message up to its first sentence end or line break, at most ``limit`` characters (… if cut).

    What failed, not where C++ checked it: c10's ``[enforce fail at file:line] condition.`` prefix is
    skipped; an out-of-memory sentence keeps the next one when it says how much was asked for."""
    text = _ENFORCE_PREFIX.sub("", message.strip(), count=1)
    line = text.split("\n", 1)[0].strip()
    end = next((i + 1 for i, c in enumerate(line[:-1]) if c in ".!?" and line[i + 1] == " "), len(line))
    size = _SIZE_SENTENCE.match(line, end)
    if size is not None:
        end = size.end()
    short = line[:end]
    if len(short) > limit:
        short = short[:limit - 1].rstrip() + "…"
    return short + (" …" if len(short) < len(text) and not short.endswith("…") else "")


def _folded(hidden: int) -> list[str]:
    """The line that stands for ``hidden`` frames inside torch (none for none)."""
    if not hidden:
        return []
    return [f"  … {count('frame', hidden)} inside torch hidden"]


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]} was" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} were"
