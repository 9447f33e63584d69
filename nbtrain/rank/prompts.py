"""Prompts in a rank: ``input()``, ``sys.stdin`` and pdb answered from the notebook.

A rank's real stdin is the kernel's lifeline (:func:`nbtrain.rank.main._watch_parent`), so a cell's
``input()`` used to read ``/dev/null`` and raise EOFError. While a cell runs, :func:`begin` replaces

* ``builtins.input`` — what ``input()`` and pdb's ``(Pdb)`` prompt call (``cmd.Cmd`` uses ``input()``);
* ``sys.stdin`` — a text stream whose ``readline()`` asks the same way, for code that reads stdin;
* ``sys.breakpointhook`` — the builtin ``breakpoint()`` opens nbtrain's pdb (:mod:`nbtrain.rank.train.debug`)

and :func:`end` puts them back. Asking is one round trip on the rank's socket: the rank flushes its
streams, sends :class:`~nbtrain.wire.protocol.InputRequest`, writes
:data:`~nbtrain.wire.protocol.INPUT_MARK` and the prompt's number to stdout, and waits for the
:class:`~nbtrain.wire.protocol.InputReply`. The kernel asks the notebook (its own input request) when the
relay reaches the mark, so what the rank printed before the prompt — pdb's listing — is shown above it.
The cell's own thread reads the reply from the connection: during a job the kernel sends a rank nothing
else; a forked child (a DataLoader worker) inherits the replacements but gets EOFError instead of
writing on its parent's socket. A reply without text (the front end takes no input, the user pressed stop) raises EOFError with
the reason, as ``input()`` does at the end of a file.
"""

from __future__ import annotations

import contextlib
import builtins
import io
import os
import sys
from collections.abc import Callable, Iterator

from .train import debug
from ..wire import protocol as P

_state: dict = {"job": None, "rank": None, "send": None, "receive": None, "seq": 0, "saved": None, "pid": None}


@contextlib.contextmanager
def scope(job_id: int, rank: int, send: Callable[[object], None], receive: Callable[[], object]) -> Iterator[None]:
    """A cell's prompts (``input()``, stdin, pdb): asked through ``send``, answered through ``receive``; at the end
    ranks waiting at a breakpoint go on and ``input``, stdin and the hook are the rank's again."""
    _begin(job_id, rank, send, receive)
    try:
        yield
    finally:
        _end()


def _begin(job_id: int, rank: int, send: Callable[[object], None], receive: Callable[[], object]) -> None:
    _state.update(job=job_id, rank=rank, send=send, receive=receive, seq=0, pid=os.getpid(),
                  saved=(builtins.input, sys.stdin, sys.breakpointhook))
    builtins.input = rank_input
    sys.stdin = RankStdin()
    sys.breakpointhook = debug.breakpointhook
    debug.begin(job_id, send)


def _end() -> None:
    try:
        debug.end()
    finally:
        saved = _state["saved"]
        if saved is not None:
            builtins.input, sys.stdin, sys.breakpointhook = saved
        _state.update(job=None, send=None, receive=None, saved=None)


def ask(prompt: str) -> P.InputReply:
    """Ask the notebook for one line, showing ``prompt``; blocks until the user answers."""
    if _state["send"] is None:
        return P.InputReply(0, None, "no cell is running")
    if os.getpid() != _state["pid"]:  # a forked child (a DataLoader worker) must not talk on the rank's socket
        return P.InputReply(0, None, "only the rank's own process can ask the notebook, not a child process")
    _state["seq"] += 1
    seq = _state["seq"]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what the rank printed before the prompt reaches the pipe before the mark
    _state["send"](P.InputRequest(_state["job"], _state["rank"], seq, prompt))
    sys.stdout.write(f"{P.INPUT_MARK}{seq}\n")
    sys.stdout.flush()
    while True:
        try:
            reply = _state["receive"]()
        except (EOFError, OSError):
            return P.InputReply(seq, None, "the notebook's kernel is gone")
        if isinstance(reply, P.InputReply) and reply.seq == seq:
            return reply


def rank_input(prompt: object = "") -> str:
    """``input()`` in a rank: the prompt is shown under the cell and the user's line comes back."""
    reply = ask(str(prompt))
    if reply.text is None:
        raise EOFError(f"input() on rank {_state['rank']}: {reply.reason or 'no input'}")
    return reply.text


class RankStdin(io.TextIOBase):
    """``sys.stdin`` in a rank: each ``readline()`` asks the notebook for a line (with no prompt)."""

    name = "<stdin>"

    encoding = "utf-8"

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]  # a text stream: str, not bytes
        reply = ask("")
        return "" if reply.text is None else reply.text + "\n"  # "": end of file, as a closed stdin

    def read(self, size: int | None = -1) -> str:
        """One line: a notebook's input box gives lines, and the user cannot type an end of file."""
        return self.readline()
