"""The kernel's status as a page sees it while a dashboard's cell runs: Busy until the cell ends.

JupyterLab takes every ``status`` message on the kernel's IOPub for the whole kernel's, whichever request it
follows. While a cell runs, the requests that a kernel subshell answers (JEP 91) end with an ``idle`` of their
own: the widgets' comms, which JupyterLab sends over subshells, and, from a page reloaded during the run, the
request of nbtrain's extension to show the dashboard again (:mod:`~nbtrain.kernel.dashboard.reopen`). Such a page also
never saw the cell's own ``busy``, sent before it connected; it said Idle while the ranks trained.

While a dashboard's cell runs (:func:`follow` to :func:`unfollow`), every ``idle`` the kernel publishes for
another request is followed at once by a ``busy`` of the cell's execute request — what is true: the main shell
still runs it. The cell's own ``idle``, at its end, is left alone.
"""

from __future__ import annotations

import threading

# The Jupyter protocol's execution states (a status message's content), not nbtrain's run or node states.
IDLE, BUSY = "idle", "busy"
_lock = threading.Lock()
_cells: dict[int, dict] = {}  # a live dashboard's key -> its cell's execute request, as the kernel got it
_wrapped: set[int] = set()  # the kernels (by id) whose status publisher is wrapped


def follow(key: int) -> None:
    """From now until :func:`unfollow`, the kernel says the cell running now is busy after any other request's idle.
    A background run (off the main thread) is followed by no cell: the kernel is idle while it trains."""
    if threading.current_thread() is not threading.main_thread():
        return
    kernel = _kernel()
    request = kernel.get_parent("shell") if kernel is not None else None
    if not request or not request.get("header"):
        return  # not in a kernel, or a front end's request the kernel does not name
    with _lock:
        _cells[key] = request
        if id(kernel) not in _wrapped:
            _wrapped.add(id(kernel))
            kernel._publish_status = _busy_after_other_idles(kernel, kernel._publish_status)


def unfollow(key: int) -> None:
    with _lock:
        _cells.pop(key, None)


def _busy_after_other_idles(kernel, publish):
    def publish_status(status, channel, parent=None):
        publish(status, channel, parent)
        if status != IDLE:
            return
        ended = ((parent or kernel.get_parent(channel) or {}).get("header") or {}).get("msg_id")
        with _lock:
            for key in [key for key, cell in _cells.items() if cell["header"].get("msg_id") == ended]:
                del _cells[key]  # the cell's own end: whatever its dashboard did, nothing more to say of it
            running = list(_cells.values())
        for cell in running[:1]:  # one cell runs on the main shell at a time
            kernel.session.send(kernel.iopub_socket, "status", {"execution_state": BUSY}, parent=cell,
                                ident=kernel._topic("status"))

    return publish_status


def _kernel():
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None)
