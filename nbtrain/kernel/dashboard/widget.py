"""RunDashboard: the live widget under a ``%%distributed`` cell, and its replacement by a picture.

Layout, top to bottom: the run panel (progress line and rank table,
:mod:`~nbtrain.kernel.dashboard.run_view`), the device panel (GPU or CPU/RAM bars,
:mod:`~nbtrain.kernel.dashboard.devices_view`) and the chart of logged series, drawn in the browser
(:mod:`~nbtrain.kernel.dashboard.chart`).

Updating: :meth:`RunDashboard.tick` runs on the dashboard's ticker thread four times a second and calls
``update(model)`` on each panel in turn. A panel changes its widget only when what it shows changed —
the run panel and the device panel when a new telemetry sample arrived, the chart when new values or
samples arrived (at most twice a second, only the new points) — and
each change is one comm message with just the new value. Nothing is cleared and redrawn in the kernel,
so nothing flickers and the kernel draws nothing while the cell runs.

Under the widget, from the start, a second output holds the run's latest state in words, refreshed a few times a
minute and hidden while the widget is live (:mod:`~nbtrain.kernel.dashboard.snapshot`): a notebook saved during the run
shows it where the widget cannot be drawn. At the end, :meth:`RunDashboard.finish` replaces the widget's output, in
place (``update_display``), with the static figure of :mod:`~nbtrain.kernel.dashboard.final`, and the snapshot with the
text summary: a saved notebook then holds a picture, not a widget that needs a live kernel. Each of these outputs names its
cell and its role in its metadata, and a live dashboard can be shown again to a page that connected during
the run (a reloaded page): see :mod:`~nbtrain.kernel.dashboard.reopen`.

A cell gets the widget through :class:`DeferredDashboard`: shown once the run has lasted :data:`SHOW_AFTER_S`, so a
run over sooner leaves its final outputs without a widget built and replaced in the same breath.
"""

from __future__ import annotations

import base64
import functools
import threading
import time

from ..observers.events import RunState
from ...common.words import count
from . import kernel_status, reopen
from .chart import ChartPanel
from .devices_view import DevicePanel
from .final import Beside, final_png, summary_paragraph
from .model import RunModel
from .run_view import RunPanel
from .series import DEFAULT_SMOOTHING
from .snapshot import EVERY_S as SNAPSHOT_EVERY_S
from .snapshot import LIVE_CLASS, LiveView, Snapshot, snapshot_text
from .text import markdown_lines

DEFAULT_COMPARE = 3  # earlier runs drawn beside a run (nbtrain.kernel.dashboard.configure(compare=N))
SHOW_AFTER_S = 0.2  # a run shows its live dashboard from its second tick on (the ticker's period: 0.25 s)


class FinalFigure:
    """The end-of-run picture as a display object: PNG for front ends, the summary as its text; a run with nothing
    to draw (``png`` None) leaves no picture, its summary below says it all."""

    def __init__(self, png: bytes | None, text: str) -> None:
        self.png, self.text = png, text

    def _repr_mimebundle_(self, include=None, exclude=None):
        if self.png is None:
            return {"text/plain": ""}
        return {"image/png": base64.b64encode(self.png).decode("ascii"), "text/plain": self.text}


class Summary:
    """The run's summary, a line a topic; its markdown shows metric names and failure text as text, never as markup."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": markdown_lines(self.text), "text/plain": self.text}


class RunDashboard:
    def __init__(self, model: RunModel, smoothing: float = DEFAULT_SMOOTHING, compare: int = DEFAULT_COMPARE) -> None:
        """``compare``: how many of the kernel's last runs the chart draws beside this one."""
        import ipywidgets as W

        self.model = model
        self.run_panel = RunPanel()
        self.devices = DevicePanel()
        self.earlier = model.earlier[-compare:] if compare > 0 else ()  # drawn beside this run, live and in the picture
        self.chart = ChartPanel(model.store, smoothing, model.telemetry, self.earlier)
        self.panels = (self.run_panel, self.devices, self.chart)  # each: .widget and .update(model)
        self.widget = W.VBox([panel.widget for panel in self.panels])
        self.widget.add_class(LIVE_CLASS)  # while it is drawn, the extension hides the snapshot below it
        self.handle = None
        self.snapshot = None  # the output under the widget with the latest state in words (kernel/dashboard/snapshot.py)
        self._snapshot_at = 0.0  # when the ticker next refreshes it
        self.cell: reopen.CellRun | None = None  # the cell's execution, as the front end sent it
        # show_again runs on a kernel subshell's thread: it never shows the live widget after the final picture.
        self._showing = threading.Lock()
        self._finished = False

    def show(self) -> None:
        from IPython.display import display

        self.cell = reopen.current_cell()
        self.handle = display(LiveView(self.widget), display_id=True, metadata=reopen.output_metadata(self.cell, "dashboard"))
        self.snapshot = display(Snapshot(snapshot_text(self.model)), display_id=True,
                                metadata=reopen.output_metadata(self.cell, "summary"))
        self._snapshot_at = time.monotonic() + SNAPSHOT_EVERY_S
        reopen.register(id(self), self.show_again)
        kernel_status.follow(id(self))

    def show_again(self) -> None:
        """For a page that connected during the run: every widget's state again, then the dashboard's output."""
        from IPython.display import display

        with self._showing:
            if self._finished:
                return
            reopen.reopen_comms(self.widget)
            display(LiveView(self.widget), metadata=reopen.output_metadata(self.cell, "dashboard"))

    def tick(self) -> None:
        for panel in self.panels:
            panel.update(self.model)
        if self.snapshot is not None and time.monotonic() >= self._snapshot_at:
            self._snapshot_at = time.monotonic() + SNAPSHOT_EVERY_S
            self.snapshot.update(Snapshot(snapshot_text(self.model)),
                                 metadata=reopen.output_metadata(self.cell, "summary"))

    def finish(self) -> None:
        """Draw the last state, then leave a PNG and a paragraph in the cell's output."""
        reopen.unregister(id(self))
        kernel_status.unfollow(id(self))
        with self._showing:
            self._finished = True
        model = self.model
        self.run_panel.update(model)  # the run's end is news to it: it shows how it ended
        self.devices.update(model)
        self.chart.update(model, force=True)  # the last points, drawn live before the picture replaces the chart
        figure, paragraph = final_outputs(model, self.chart.smoothing, self.earlier)
        from IPython.display import display

        if self.handle is not None:
            self.handle.update(figure, metadata=reopen.output_metadata(self.cell, "dashboard"))
        else:
            display(figure, metadata=reopen.output_metadata(self.cell, "dashboard"))
        summary_metadata = reopen.output_metadata(self.cell, "summary")
        if self.snapshot is not None:
            self.snapshot.update(Summary(paragraph), metadata=summary_metadata)  # in the snapshot's place
        else:
            display(Summary(paragraph), metadata=summary_metadata)
        close_tree(self.widget)  # the page shows the picture now; free the widgets' comms in the kernel too
        if self.cell is not None:  # for a page that opens the notebook later (kernel/dashboard/reopen.py)
            reopen.remember_final(id(self), functools.partial(_show_final, figure, paragraph, self.cell))


def final_outputs(model: RunModel, smoothing: float, earlier) -> tuple[FinalFigure, str]:
    """The end-of-run picture and the summary paragraph under it."""
    paragraph = summary_paragraph(model.store, model.telemetry, model.status or RunState.FINISHED, model.detail,
                                  len(model.ranks), model.where, model.progress(), model.cold_start)
    title = f"nbtrain · {count('rank', len(model.ranks))} · {model.where} · {model.status_text() or ''}"
    beside = Beside(tuple(earlier), model.step_splits())
    return FinalFigure(final_png(model.store, model.telemetry, title, smoothing, beside), paragraph), paragraph


class DeferredDashboard:
    """The widget front end as a cell gets it: the live :class:`RunDashboard` appears once the run has lasted
    :data:`SHOW_AFTER_S`. A run over sooner (a quick warm cell) gets its final outputs alone: building the
    widgets and their outputs, then replacing them at once, was most of what the dashboard added to such a cell."""

    def __init__(self, model: RunModel, smoothing: float = DEFAULT_SMOOTHING, compare: int = DEFAULT_COMPARE) -> None:
        self.model, self.smoothing, self.compare = model, smoothing, compare
        self.live: RunDashboard | None = None
        self._show_at: float | None = None
        self._cell: reopen.CellRun | None = None

    def show(self) -> None:
        self._cell = reopen.current_cell()  # on the cell's own thread: the unshown run's final outputs name it
        self._show_at = time.monotonic() + SHOW_AFTER_S
        kernel_status.follow(id(self))  # here, not on the ticker's thread, where the live one is shown

    def tick(self) -> None:
        if self.live is None:
            if self._show_at is None or time.monotonic() < self._show_at:
                return
            self.live = RunDashboard(self.model, self.smoothing, self.compare)
            self.live.show()
        self.live.tick()

    def finish(self) -> None:
        """The live dashboard's end, or the final outputs alone for a run that never showed it. Called once the
        ticker has stopped (:class:`~nbtrain.kernel.dashboard.observer.DashboardObserver`)."""
        kernel_status.unfollow(id(self))
        if self.live is not None:
            self.live.finish()
            return
        earlier = self.model.earlier[-self.compare:] if self.compare > 0 else ()
        figure, paragraph = final_outputs(self.model, self.smoothing, earlier)
        _show_final(figure, paragraph, self._cell)
        if self._cell is not None:
            reopen.remember_final(id(self), functools.partial(_show_final, figure, paragraph, self._cell))


def _show_final(figure: FinalFigure, paragraph: str, cell: reopen.CellRun | None) -> None:
    from IPython.display import display

    if figure.png is not None:  # no picture (nothing logged): no empty output before the summary
        display(figure, metadata=reopen.output_metadata(cell, "dashboard"))
    display(Summary(paragraph), metadata=reopen.output_metadata(cell, "summary"))


def close_tree(widget) -> None:
    for child in getattr(widget, "children", ()):
        close_tree(child)
    widget.close()
