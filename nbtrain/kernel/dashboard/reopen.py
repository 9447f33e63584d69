"""A running dashboard seen again by a page that did not start the run: a reloaded page, a notebook reopened.

The kernel's main thread runs the cell, so it answers no request of a page that connects meanwhile: the
page's widget manager cannot fetch the widgets' state (its requests wait behind the cell) and the page,
which did not send the cell's execute request, ignores every output the run still publishes — the
live dashboard read "Loading widget…", and the final picture and summary never reached the notebook.

What holds instead:

* every output of the dashboard carries ``metadata["nbtrain"] = {"cell": <the cell's id>, "role":
  "dashboard" | "summary", "request": <the execute request's id>, "count": <its execution count>}``
  (:func:`output_metadata`; JupyterLab sends the cell's id with each execute request, :func:`current_cell`);
* nbtrain's JupyterLab extension (``labextension/src/reattach.ts``) puts such an output into the cell with
  that id when it comes from an execution another page started, in place of the cell's output of the same
  role: the final picture and the summary land in the cell, and with the next save in the ``.ipynb``; from
  then on it also adds that request's other outputs to the cell (rank 0's prints, nbtrain's closing lines, a
  traceback) and, when the kernel says the request is done, gives the cell its execution count;
* a page that opens a notebook whose kernel is busy asks the kernel, on a subshell of its own (JEP 91: the
  main shell is busy; ipykernel ≥ 7 runs a subshell's requests on a thread of their own), to
  :func:`show_again` its live dashboards: the kernel sends every widget's state again (``comm_open`` with
  the same model ids, as when it was first shown, :func:`reopen_comms`) and displays the dashboard once
  more; the page draws it live from the next update on.

* a page that opens a notebook whose kernel is idle asks the same, on the main shell: the final picture and the
  summary of the latest runs that ended (:func:`remember_final`, :data:`KEEP_ENDED` of them) are published
  again, so a run that ended while no page had the notebook open — a ``--background`` run, or a cell whose
  page was closed — leaves them in its cell when the notebook is opened again (the extension changes nothing
  where the cell holds them already).

Front ends other than JupyterLab, or a busy kernel without subshells, keep the earlier behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

_lock = threading.Lock()
_live: dict[int, Callable[[], None]] = {}  # a live dashboard's key -> how it shows itself again
_ended: dict[int, Callable[[], None]] = {}  # a finished dashboard's key -> how it shows its final picture again
KEEP_ENDED = 8  # the latest runs whose final picture a page opened later is given


def register(key: int, show: Callable[[], None]) -> None:
    with _lock:
        _live[key] = show


def unregister(key: int) -> None:
    with _lock:
        _live.pop(key, None)


def remember_final(key: int, show: Callable[[], None]) -> None:
    """A run ended: ``show`` publishes its final picture and summary again, for a page that was not open then."""
    with _lock:
        _ended[key] = show
        while len(_ended) > KEEP_ENDED:
            _ended.pop(next(iter(_ended)))


def show_again() -> int:
    """Show every live dashboard again, and the final picture of the latest runs that ended (what the JupyterLab
    extension asks for when it opens a notebook); returns how many."""
    with _lock:
        shows = list(_live.values()) + list(_ended.values())
    for show in shows:
        show()
    return len(shows)


@dataclass(frozen=True)
class CellRun:
    """The execution a dashboard belongs to: the cell's id (as JupyterLab sends it), the execute request's id and
    its execution count — what a page that did not send the request needs to give the cell its later outputs
    and its prompt."""

    cell: str
    request: str | None = None
    count: int | None = None


def current_cell() -> CellRun | None:
    """The cell being executed, if the front end sent its id (JupyterLab does), else ``None``."""
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent() or {}
    cell = (parent.get("metadata") or {}).get("cellId")
    if not isinstance(cell, str):
        return None
    request = (parent.get("header") or {}).get("msg_id")
    count = getattr(shell, "execution_count", None)  # IPython counts on as a cell starts: the running one's is one less
    return CellRun(cell, request if isinstance(request, str) else None, count - 1 if isinstance(count, int) else None)


def output_metadata(cell: CellRun | None, role: str) -> dict:
    """The metadata that lets the JupyterLab extension put an output of ``role`` into ``cell``, and the cell's
    later outputs (rank 0's prints, the closing lines) and prompt after it."""
    if cell is None:
        return {}
    return {"nbtrain": {"cell": cell.cell, "role": role, "request": cell.request, "count": cell.count}}


def reopen_comms(widget) -> None:
    """Send the state of every widget of ``widget``'s tree again, children first (a container's state names
    them), as a ``comm_open`` with the widget's own id: a page that connected since builds the models."""
    from ipywidgets import __protocol_version__
    from ipywidgets.widgets.widget import _remove_buffers

    for member in _tree(widget):
        if member.comm is None:
            continue  # closed meanwhile: the run ended
        state, buffer_paths, buffers = _remove_buffers(member.get_state())
        member.comm.open(data={"state": state, "buffer_paths": buffer_paths},
                         metadata={"version": __protocol_version__}, buffers=buffers)


def _tree(widget, seen: set[int] | None = None) -> list:
    """``widget`` and every widget its traits hold (children, layout, style), each after those it holds."""
    from ipywidgets import Widget

    seen = set() if seen is None else seen
    if id(widget) in seen:
        return []
    seen.add(id(widget))
    out = []
    for name in widget.keys:
        value = getattr(widget, name, None)
        for held in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(held, Widget):
                out += _tree(held, seen)
    return out + [widget]
