"""Rich output from rank 0 (``display(obj)``, ``plt.show()``), shown in the cell at its place in the text.

A rank sends each bundle as :class:`~nbtrain.wire.protocol.Display` on its socket, then writes
:data:`~nbtrain.wire.protocol.DISPLAY_MARK` and the bundle's number to its stdout (see
:mod:`nbtrain.rank.display`). Socket and pipe are read separately, so either can arrive first:

* :meth:`PendingDisplays.add` keeps a bundle that came before its mark;
* the output relay, meeting a mark, calls :meth:`PendingDisplays.show`; if the bundle is not there yet,
  the relay holds that stream's text from the mark on, and :meth:`add` lets it go on once it is.

The rank sends the bundle before it writes the mark, so a mark never waits for a bundle that was not
sent. Shown through IPython's ``display`` (the kernel's streams are flushed first, so text printed
before the figure stays above it); without an IPython shell (``run_source`` from plain Python), the
bundle's ``text/plain`` is written instead, saying what would have been shown.

A bundle with a ``display_id`` (``display(obj, display_id=True)`` in the rank) names its output; one
sent with ``update`` replaces that output where it is, as IPython's ``update_display`` does. The cell's
last value comes as a bundle marked ``result`` and is shown as the notebook's ``Out[n]``, through the
shell's display hook.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ...wire import protocol as P


class PendingDisplays:
    """Bundles of one run, by (rank, seq), until their mark is reached in the rank's stdout."""

    def __init__(self, write: Callable[[str, str], None], publish: Callable[[P.Display], None] | None = None) -> None:
        self._write = write
        self._publish = publish or self._publish_in_notebook
        self._waiting: dict[tuple[int, int], P.Display] = {}
        self.shown = 0

    def add(self, message: P.Display, relay) -> None:
        """A bundle arrived: keep it, and let the relay go on if its stdout waits at this bundle's mark."""
        self._waiting[(message.rank, message.seq)] = message
        relay.feed(message.rank, "stdout", "")

    def show(self, rank: int, seq: int) -> bool:
        """The mark of (rank, seq) was reached: show the bundle; False when it has not arrived yet."""
        message = self._waiting.pop((rank, seq), None)
        if message is None:
            return False
        self._publish(message)
        self.shown += 1
        return True

    def _publish_in_notebook(self, message: P.Display) -> None:
        shell = _ipython_shell()
        data = message.data
        if shell is None:
            kinds = ", ".join(sorted(k for k in data if k != "text/plain")) or "text"
            self._write("stdout", f"{data.get('text/plain', '<display>')} [{kinds}: shown in a notebook]\n")
            return
        from IPython.display import display

        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # the text relayed before this display goes out first
        if message.result:
            _show_as_out(shell, data, message.metadata)
            return
        extra = {"transient": message.transient, "update": message.update} if message.transient else {}
        display(data, metadata=message.metadata, raw=True, **extra)


def _show_as_out(shell, data: dict, metadata: dict) -> None:
    """The cell's value as the notebook's ``Out[n]`` (an execute_result), through the shell's display hook —
    without binding ``_`` or ``Out[n]``: the value itself stays on rank 0."""
    hook = shell.displayhook
    hook.start_displayhook()
    hook.write_output_prompt()
    hook.write_format_data(data, metadata)
    hook.finish_displayhook()


def _ipython_shell():
    """The running IPython shell, if any — without importing IPython where it is not loaded."""
    if "IPython" not in sys.modules:
        return None
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance() if InteractiveShell.initialized() else None
