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
"""

from __future__ import annotations

import contextlib
import signal
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
