"""RunDashboard: the live widget under a ``%%distributed`` cell, and its replacement by a picture.

Layout, top to bottom: the run panel (progress line and rank table,
:mod:`~nbtrain.dashboard.run_view`), the device panel (GPU or CPU/RAM bars,
:mod:`~nbtrain.dashboard.devices_view`) and the plot of logged series
(:mod:`~nbtrain.dashboard.loss_plot`).

Updating: :meth:`RunDashboard.tick` runs on the dashboard's ticker thread four times a second. It
changes a widget only when its content changed — the panels when a new telemetry sample arrived (or the
elapsed second moved), the plot when new values arrived and its CPU budget allows — and each change is
one comm message with just the new value. Nothing is cleared and redrawn, so nothing flickers.

At the end, :meth:`RunDashboard.finish` replaces the widget's output, in place (``update_display``),
with the static figure of :mod:`~nbtrain.dashboard.final`, and adds the text summary below it: a saved
notebook then holds a picture, not a widget that needs a live kernel.
"""

from __future__ import annotations

import base64

from .devices_view import DevicePanel
from .final import final_png, summary_paragraph
from .loss_plot import DEFAULT_SMOOTHING, LossPlot
from .model import RunModel
from .run_view import RunPanel
from ..words import count


class FinalFigure:
    """The end-of-run picture as a display object: PNG for front ends, the summary as its text."""

    def __init__(self, png: bytes, text: str) -> None:
        self.png, self.text = png, text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/png": base64.b64encode(self.png).decode("ascii"), "text/plain": self.text}


class Summary:
    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": self.text, "text/plain": self.text}


class RunDashboard:
    def __init__(self, model: RunModel, smoothing: float = DEFAULT_SMOOTHING) -> None:
        import ipywidgets as W

        self.model = model
        self.run_panel = RunPanel()
        self.devices = DevicePanel()
        self.plot = LossPlot(model.store, smoothing)
        self.widget = W.VBox([self.run_panel.widget, self.devices.widget, self.plot.widget])
        self.handle = None
        self._seen = (-1, -1)
        self._seen_telemetry = -1

    def show(self) -> None:
        from IPython.display import display

        self.handle = display(self.widget, display_id=True)

    def tick(self) -> None:
        model = self.model
        seen = (model.history.version, int(model.elapsed()))
        if seen != self._seen:
            self._seen = seen
            snap = model.history.latest
            self.run_panel.update(model.store, snap, model.ranks, model.elapsed(), model.status_text())
            if seen[0] != self._seen_telemetry:
                self.devices.update(snap, model.history.sparks())
                self._seen_telemetry = seen[0]
        self.plot.refresh()

    def finish(self) -> None:
        """Draw the last state, then leave a PNG and a paragraph in the cell's output."""
        model = self.model
        self.run_panel.update(model.store, model.history.latest, model.ranks, model.elapsed(), model.status_text())
        progress = model.progress()
        paragraph = summary_paragraph(model.store, model.history, model.status or "ok", model.detail,
                                      len(model.ranks), model.where, progress)
        title = f"nbtrain · {count('rank', len(model.ranks))} · {model.where} · {model.status_text() or ''}"
        figure = FinalFigure(final_png(model.store, model.history, title, self.plot.smoothing), paragraph)
        from IPython.display import display

        if self.handle is not None:
            self.handle.update(figure)
        else:
            display(figure)
        display(Summary(paragraph))
        self.plot.link.close()
        close_tree(self.widget)  # the page shows the picture now; free the widgets' comms in the kernel too


def close_tree(widget) -> None:
    for child in getattr(widget, "children", ()):
        close_tree(child)
    widget.close()
