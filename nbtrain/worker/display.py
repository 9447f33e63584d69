"""Rich output from a rank: ``display(obj)`` and matplotlib figures, shown in the cell like IPython's.

A rank is a plain Python process: IPython's ``display`` would print a repr there, and the kernel's
inline matplotlib backend does not exist. So while a cell runs:

* ``display`` in the cell's namespace is :func:`display`: it turns each object into a MIME bundle as
  IPython's formatter does (``_repr_mimebundle_``, ``_repr_png_``, ``_repr_html_``, … and matplotlib
  figures rendered to PNG), and sends it to the kernel as :class:`~nbtrain.wire.protocol.Display`;
* ``MPLBACKEND=module://nbtrain.worker.figures`` (set by the pool) makes ``plt.show()`` display every
  open figure this way and close it, as the inline backend does; figures still open when the cell ends
  are shown then, as in a notebook.

Only the displaying rank — rank 0, whose names come back — sends anything; on other ranks ``display``
does nothing and figures are closed without being rendered (N copies of one plot would only repeat).

Order: the bundle travels on the rank's socket, its text on the stdout pipe — two channels. So after
sending a bundle the rank writes :data:`~nbtrain.wire.protocol.DISPLAY_MARK` and the bundle's number
to stdout; the kernel shows the bundle where the mark is in the text (:mod:`nbtrain.launch.displays`).
"""

from __future__ import annotations

import base64
import io
import sys
from collections.abc import Callable

from ..wire import protocol as P

# IPython's formatter methods, in its order; bytes results are base64 text in the bundle, as in Jupyter.
_REPR_METHODS = (
    ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"), ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)

BACKEND = "module://nbtrain.worker.figures"  # MPLBACKEND in a rank (see nbtrain.launch.pool)

_state: dict = {"job": None, "rank": None, "send": None, "seq": 0}


def begin(job_id: int, rank: int, display_rank: int, send: Callable[[object], None]) -> None:
    """Start a cell: bundles go through ``send`` if this rank is the displaying one."""
    _state.update(job=job_id, rank=rank, send=send if rank == display_rank else None, seq=0)


def end() -> None:
    """End a cell: show (or, off the displaying rank, close) the figures it left open; stop sending."""
    try:
        show_open_figures()
    finally:
        _state.update(job=None, send=None)


def displaying() -> bool:
    return _state["send"] is not None


def display(*objs, raw: bool = False, metadata: dict | None = None, **_ignored) -> None:
    """Show objects in the cell (rank 0 only), like IPython's ``display``; ``raw=True``: objs are bundles."""
    if not displaying():
        return
    for obj in objs:
        meta: dict
        if raw and isinstance(obj, dict):
            data, meta = obj, {}
        else:
            data, meta = mime_bundle(obj)
        send_bundle(data, {**meta, **(metadata or {})})


def send_bundle(data: dict, metadata: dict | None = None) -> None:
    """Send one bundle, then mark its place in stdout (see the module docstring)."""
    if not displaying():
        return
    _state["seq"] += 1
    seq = _state["seq"]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # text printed before the display reaches the pipe before its mark
    _state["send"](P.Display(_state["job"], _state["rank"], seq, dict(data), dict(metadata or {})))
    sys.stdout.write(f"{P.DISPLAY_MARK}{seq}\n")
    sys.stdout.flush()


def mime_bundle(obj) -> tuple[dict, dict]:
    """``(data, metadata)`` for ``obj``, as IPython's display formatter would make them."""
    if _is_figure(obj):
        return {"image/png": figure_png(obj), "text/plain": f"<{type(obj).__name__} with {len(obj.axes)} Axes>"}, {}
    data: dict = {}
    metadata: dict = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method):
        found = method()
        if isinstance(found, tuple):
            found, metadata = found[0], dict(found[1] or {})
        data.update(found or {})
    for mime, name in _REPR_METHODS:
        method = getattr(obj, name, None)
        if mime in data or not callable(method):
            continue
        value = method()
        if isinstance(value, tuple):  # (data, metadata), as IPython allows
            value, metadata[mime] = value
        if value is None:
            continue
        data[mime] = base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
    data.setdefault("text/plain", repr(obj))
    return data, metadata


def _is_figure(obj) -> bool:
    """A matplotlib Figure, known without importing matplotlib (a rank that never plots never loads it)."""
    matplotlib_figure = sys.modules.get("matplotlib.figure")
    return matplotlib_figure is not None and isinstance(obj, matplotlib_figure.Figure)


def figure_png(figure) -> str:
    """The figure as base64 PNG text, drawn as the inline backend draws it (tight bounding box)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def show_open_figures() -> None:
    """Display every open pyplot figure (on the displaying rank), then close them all (on every rank)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:  # the cell never used pyplot: nothing to show, and no reason to import it
        return
    if pyplot.get_backend() != BACKEND:  # the cell chose another one (--env MPLBACKEND=…, matplotlib.use)
        return
    from matplotlib._pylab_helpers import Gcf

    try:
        if displaying():
            for manager in Gcf.get_all_fig_managers():
                display(manager.canvas.figure)
    finally:
        pyplot.close("all")
