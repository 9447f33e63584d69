"""Rich output from a rank: ``display(obj)`` and matplotlib figures, shown in the cell like IPython's.

A rank is a plain Python process without IPython's shell: there IPython's ``display`` prints a repr, and
the kernel's inline matplotlib backend does not exist. So while a cell runs:

* :func:`display` turns each object into a MIME bundle — with IPython's own display formatter where
  IPython is installed (the notebook's pretty ``text/plain``, ``_repr_html_``, ``_repr_mimebundle_``, …),
  else by calling the ``_repr_*_`` methods itself; matplotlib figures are rendered to PNG — and sends it
  to the kernel as :class:`~nbtrain.wire.protocol.Display`. It takes IPython's arguments (``raw``,
  ``include``, ``exclude``, ``metadata``; ``display_id`` and ``update``, which replace an output in place). The cell's namespace has it as ``display``,
  and IPython's own display functions are routed to it in every rank (:mod:`.ipython_display`), so
  ``from IPython.display import display, HTML`` in the cell, or a library calling IPython's ``display``,
  shows the same way; the value of the cell's last expression is shown through it too (:mod:`.cellcode`);
* ``MPLBACKEND=module://nbtrain.rank.figures`` (set by the pool) makes ``plt.show()`` display every
  open figure this way and close it, as the inline backend does; figures still open when the cell ends
  are shown then, as in a notebook.

Only the displaying rank — rank 0, whose names come back — sends anything; on other ranks ``display``
does nothing and figures are closed without being rendered (N copies of one plot would only repeat).

Order: the bundle travels on the rank's socket, its text on the stdout pipe — two channels. So after
sending a bundle the rank writes :data:`~nbtrain.wire.protocol.DISPLAY_MARK` and the bundle's number
to stdout; the kernel shows the bundle where the mark is in the text (:mod:`nbtrain.kernel.relay.displays`).
"""

from __future__ import annotations

import contextlib
import base64
import io
import sys
import uuid
from collections.abc import Callable, Iterator

from ..wire import protocol as P

# IPython's formatter methods, in its order; bytes results are base64 text in the bundle, as in Jupyter.
_REPR_METHODS = (
    ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"), ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)

BACKEND = "module://nbtrain.rank.figures"  # MPLBACKEND in a rank (see nbtrain.kernel.ranks.pool)

_state: dict = {"job": None, "rank": None, "send": None, "seq": 0}
_formatter: dict = {}  # "formatter": IPython's DisplayFormatter (made on first use), or None without IPython


@contextlib.contextmanager
def scope(job_id: int, rank: int, display_rank: int, send: Callable[[object], None]) -> Iterator[None]:
    """A cell's displays: bundles go through ``send`` if this rank is the displaying one; at the end the figures
    the cell left open are shown (or, off the displaying rank, closed) — a broken figure must not lose the reply."""
    _state.update(job=job_id, rank=rank, send=send if rank == display_rank else None, seq=0)
    try:
        yield
    finally:
        try:
            show_open_figures()
        except Exception as exc:
            print(f"nbtrain: a figure left open by the cell could not be shown ({exc!r})", file=sys.stderr)
        finally:
            _state.update(job=None, send=None)


def displaying() -> bool:
    return _state["send"] is not None


def display(*objs, include=None, exclude=None, metadata: dict | None = None, transient: dict | None = None,
            display_id=None, raw: bool = False, clear: bool = False, update: bool = False, **_ignored):
    """Show objects in the cell (rank 0 only), like IPython's ``display``; ``raw=True``: objs are bundles.

    ``display_id`` (``True``: a new one) names the output so that ``update=True`` — or the returned
    ``DisplayHandle``'s ``update()`` — replaces it, as in a notebook; the handle is returned on every rank.
    ``clear`` is accepted for IPython's signature; a rank's output is not cleared."""
    transient = dict(transient or {})
    if display_id:
        transient["display_id"] = uuid.uuid4().hex if display_id is True else display_id
        if not objs:  # an empty output, to be filled by updates (as IPython does)
            objs, raw = ({},), True
    if displaying():
        for obj in objs:
            meta: dict
            if raw and isinstance(obj, dict):
                data, meta = obj, {}
            else:
                data, meta = mime_bundle(obj, include, exclude)
            if data or raw:  # nothing to show: an object's _ipython_display_ took over
                send_bundle(data, {**meta, **(metadata or {})}, transient, update)
    return _handle(transient["display_id"]) if display_id else None


def show_value(value: object) -> None:
    """The cell's last expression's value, shown as the notebook's ``Out[n]``; a figure is closed once shown
    (a notebook's inline backend would show it twice: as the value, then as an open figure)."""
    if value is None:
        return
    if displaying():
        data, metadata = mime_bundle(value)
        send_bundle(data, metadata, result=True)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and _is_figure(value):
        pyplot.close(value)


def publish_display_data(data: dict, metadata: dict | None = None, *, transient: dict | None = None,
                         update: bool = False, **_ignored) -> None:
    """IPython's ``publish_display_data`` in a rank: send the bundle as it is (rank 0 only)."""
    send_bundle(data, metadata, transient, update)


def _handle(display_id: str):
    """IPython's ``DisplayHandle`` (its ``update()`` comes back to :func:`display`); None without IPython."""
    try:
        from IPython.core.display_functions import DisplayHandle
    except ImportError:
        return None
    return DisplayHandle(display_id)


def send_bundle(data: dict, metadata: dict | None = None, transient: dict | None = None, update: bool = False,
                result: bool = False) -> None:
    """Send one bundle (``update``: it replaces the output named by ``transient``'s display_id; ``result``:
    it is the cell's value), then mark its place in stdout (see the module docstring)."""
    if not displaying():
        return
    _state["seq"] += 1
    seq = _state["seq"]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # text printed before the display reaches the pipe before its mark
    _state["send"](P.Display(_state["job"], _state["rank"], seq, dict(data), dict(metadata or {}),
                             dict(transient or {}), update, result))
    sys.stdout.write(f"{P.DISPLAY_MARK}{seq}\n")
    sys.stdout.flush()


def mime_bundle(obj, include=None, exclude=None) -> tuple[dict, dict]:
    """``(data, metadata)`` for ``obj``, as IPython's display formatter makes them (bytes as base64 text)."""
    if _is_figure(obj):
        return {"image/png": figure_png(obj), "text/plain": f"<{type(obj).__name__} with {len(obj.axes)} Axes>"}, {}
    formatter = _ipython_formatter()
    if formatter is None:
        data, metadata = _repr_bundle(obj)
    else:
        data, metadata = formatter.format(obj, include=include, exclude=exclude)
    encoded = {mime: base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
               for mime, value in data.items()}
    return encoded, dict(metadata or {})


def _ipython_formatter():
    """IPython's display formatter (it needs no shell), made once; None where IPython is not installed."""
    if "formatter" not in _formatter:
        try:
            from IPython.core.formatters import DisplayFormatter
        except ImportError:
            _formatter["formatter"] = None
        else:
            _formatter["formatter"] = DisplayFormatter()
    return _formatter["formatter"]


def _repr_bundle(obj) -> tuple[dict, dict]:
    """The bundle from ``obj``'s own ``_repr_*_`` methods, in IPython's order (without IPython)."""
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
        if value is not None:
            data[mime] = value
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
