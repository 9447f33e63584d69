"""The stop button inside a rank: KeyboardInterrupt only while the cell's own code runs.

When the user presses stop, the kernel sends every process of the pool exactly one SIGINT. Python's
default handler raises KeyboardInterrupt wherever the rank happens to be: in the cell (wanted — the
cell sees it, as in a plain notebook), but also in the middle of ``import torch`` while the rank starts,
or in nbtrain's own bookkeeping after the cell (reporting the failure, flushing the streams, a
DataLoader iterator's ``__del__`` as the cell's namespace is dropped) — each of which prints a
traceback nobody asked for.

:func:`install` replaces the handler, first thing in the rank process, with one that raises only inside
:func:`interruptible` — the block that runs the cell. Anywhere else the signal is only noted: the rank finishes what it is doing quietly and the kernel's SIGTERM ends it. A stop
that arrives while nbtrain prepares the cell (loading the inputs) raises as soon as the cell would
start, so the cell never runs after the button was pressed.

DataLoader workers forked from the rank inherit the handler and the flag: in the cell they raise
KeyboardInterrupt, which their loop catches quietly, as it does for Ctrl-C in a terminal.

**SIGTERM** (:func:`install_sigterm`) is how the kernel and a node agent end ranks — and how a container
runtime, Slurm or Kubernetes announce that the machine is going. The kernel says :class:`~nbtrain.wire.protocol.Stopping`
on the channel before its own SIGTERM; a SIGTERM without it, while a cell runs, is a preemption notice
(:mod:`nbtrain.rank.train.preempt_checkpoint`): the rank goes on to its next step boundary, saves and tells the kernel. A
second one, one between cells, or one in a process forked from the rank ends the process as SIGTERM always did
(a prepared DataLoader's workers have their own rule: :func:`nbtrain.rank.train.preempt_checkpoint.loader_worker_init`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

_in_cell = False
_requested = False


def _on_sigint(signum, frame) -> None:
    global _requested
    _requested = True
    if _in_cell:
        raise KeyboardInterrupt


def install() -> None:
    """Defer SIGINT outside :func:`interruptible` (call before anything slow, such as importing torch)."""
    signal.signal(signal.SIGINT, _on_sigint)


def reset() -> None:
    """A rank forked from the zygote starts with no stop noted (the zygote's own SIGINTs are not its)."""
    global _requested, _in_cell
    _requested = _in_cell = False


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """The one place a SIGINT raises KeyboardInterrupt: the cell's code."""
    global _in_cell
    _in_cell = True
    try:
        if _requested:  # stopped while the cell was being prepared: do not start it
            raise KeyboardInterrupt
        yield
    finally:
        _in_cell = False


KERNEL_STOP_WAIT_S = 1.0  # the kernel's Stopping is sent before its SIGTERM; its reader thread may be slow to run on a
# loaded machine, and a notice waiting this long still has most of its grace (25 s; AWS gives 120, GCP 30)
_sigterm: dict = {}


def install_sigterm(in_cell, kernel_stops, notice, last_words) -> None:
    """SIGTERM from outside during a cell calls ``notice()`` (in a thread: a handler must not take locks); the
    kernel's own SIGTERM during a cell calls ``last_words()`` (the logged values not sent yet) before the rank goes."""
    wake_r, wake_w = os.pipe()
    _sigterm.update(owner=os.getpid(), in_cell=in_cell, kernel_stops=kernel_stops, last_words=last_words,
                    wake=wake_w, noticed=False)

    def relay() -> None:
        while os.read(wake_r, 1):
            notice()

    threading.Thread(target=relay, name="nbtrain-sigterm", daemon=True).start()
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame) -> None:
    s = _sigterm
    if s.get("handling"):
        # Python runs a handler again, inside the first, for a SIGTERM that arrives while the first one runs (the
        # kernel signals each rank's session and then each process: two at once). The first one decides; a second
        # run here would start the last words again under the first one's locks and hang the rank until SIGKILL.
        return
    s["handling"] = True
    try:
        _decide(s)
    finally:
        s["handling"] = False


def _decide(s: dict) -> None:
    if os.getpid() != s["owner"] or s["noticed"] or not s["in_cell"]() or s["kernel_stops"](KERNEL_STOP_WAIT_S):
        if os.getpid() == s["owner"] and s["in_cell"]():
            s["last_words"]()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    s["noticed"] = True
    os.write(s["wake"], b"t")
