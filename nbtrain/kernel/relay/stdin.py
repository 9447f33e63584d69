"""A rank's prompts (``input()``, ``sys.stdin``, pdb) answered through the notebook's own stdin.

A rank sends :class:`~nbtrain.wire.protocol.InputRequest` on its socket and then writes
:data:`~nbtrain.wire.protocol.INPUT_MARK` and the prompt's number to its stdout
(:mod:`nbtrain.rank.prompts`). As with figures (:mod:`.displays`), socket and pipe race, so:

* :meth:`PendingPrompts.add` keeps a request that came before its mark;
* the output relay, meeting the mark (after writing everything the rank printed before it — pdb's
  listing), calls :meth:`PendingPrompts.answer`; if the request is not there yet the relay holds that
  stream's text and :meth:`add` lets it go on.

:meth:`answer` calls the kernel's ``input()`` on the kernel's main thread, inside the ``%%distributed``
cell: in ipykernel that is the kernel's input request, so the front end shows an input box under the
cell (Jupyter's ``allow_stdin``); from plain Python it reads the terminal. The prompt names the rank
(``[rank 1] (Pdb) ``) when several ranks run — also for a rank whose output ``--output`` hides, so its
prompt still reaches the user. The answer goes back to that rank only.

While the user types, the run's loop waits: the other ranks' output and metrics are read when the answer
is in (a rank that prints more than a pipe holds, 64 KiB, pauses until then). The stop button still works:
the kernel's ``input()`` raises KeyboardInterrupt and the run is stopped as usual. A front end that takes
no input (nbclient and nbconvert by default) raises StdinNotImplementedError: the rank gets an EOFError
that says so, and a line under the cell says which rank asked.

A kernel that follows a detached run through its record (:mod:`nbtrain.kernel.cluster.recorded`) answers nothing
(:func:`asker`): the prompt was the run's agent's to answer — with the starting kernel's answer while that kernel
lived, else with EOFError — so a line says which rank asked and the rank's output goes on.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable

from ...wire import protocol as P


def _ask_in_kernel(prompt: str) -> str:
    """The kernel's ``input()``: ipykernel's input request while a cell runs; the terminal from plain Python."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # the rank's text relayed so far goes out before the prompt
    return builtins.input(prompt)


class FollowingOnly(Exception):
    """The prompt's rank is not this kernel's to answer: it follows a detached run's record."""


def _follower_cannot_ask(prompt: str) -> str:
    raise FollowingOnly


def asker(following: bool) -> Callable[[str], str]:
    """How a run's prompts are asked: in the kernel, or (``following`` a detached run's record) not at all."""
    return _follower_cannot_ask if following else _ask_in_kernel


class PendingPrompts:
    """Input requests of one run, by (rank, seq), until their mark is reached in the rank's stdout."""

    def __init__(self, reply: Callable[[int, P.InputReply], None], write: Callable[[str, str], None],
                 nprocs: int, ask: Callable[[str], str] = _ask_in_kernel) -> None:
        self._reply = reply
        self._write = write
        self._label_ranks = nprocs > 1
        self._ask = ask
        self._waiting: dict[tuple[int, int], P.InputRequest] = {}
        self.asked = 0

    def add(self, message: P.InputRequest, relay) -> None:
        """A request arrived: keep it, and let the relay go on if the rank's stdout waits at its mark."""
        self._waiting[(message.rank, message.seq)] = message
        relay.feed(message.rank, "stdout", "")

    def answer(self, rank: int, seq: int) -> bool:
        """The mark of (rank, seq) was reached: ask the user and answer the rank; False if not arrived yet."""
        request = self._waiting.pop((rank, seq), None)
        if request is None:
            return False
        self.asked += 1
        prompt = (f"[rank {rank}] " if self._label_ranks else "") + request.prompt
        try:
            text: str | None = self._ask(prompt)
            reason = ""
        except EOFError:
            text, reason = None, "the notebook's stdin is closed"
        except FollowingOnly:
            text, reason = None, "followed from another kernel"
            self._write("stderr", f"nbtrain: rank {rank} asked for input ({request.prompt.strip() or 'a line'!r}); "
                        "this kernel follows the detached run and cannot answer: the kernel that started the run "
                        "answered it if it was still running, else the rank got EOFError.\n")
        except Exception as exc:  # IPython's StdinNotImplementedError: the front end takes no input
            if type(exc).__name__ != "StdinNotImplementedError":
                raise
            text, reason = None, "this notebook front end does not take input (allow_stdin is off)"
            self._write("stderr", f"nbtrain: rank {rank} asked for input ({request.prompt.strip() or 'a line'!r}), "
                        "but this front end does not take input; the rank got EOFError.\n")
        self._reply(rank, P.InputReply(seq, text, reason))
        return True
