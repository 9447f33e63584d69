"""The live plot of every logged series, redrawn in place and never more than the CPU budget allows.

The widget is a scale switch over the image. **scale** (linear / log): both versions of the image are
drawn and held in an ``ipywidgets.Stack``; the switch is linked to the stack *in the browser*
(``jslink``), so it works while the cell runs — when the kernel's main thread is busy with the run and
reads no widget events at all (which is why there is no kernel-side control here: it could only act
after the run, when the widget has been replaced by the final picture).

**Smoothing**: every series is drawn raw (light) with its exponential moving average on top; the
weight (default 0.6) is set with ``nbtrain.dashboard.configure(smoothing=0.9)`` before the cell.

Redrawing: :meth:`LossPlot.refresh` draws only when new values arrived, at least :data:`MIN_PERIOD_S`
apart, and only while the drawing's CPU time since the first frame stays within :data:`CPU_SHARE` of one
core (a big figure on a slow machine is refreshed less often instead of slowing the kernel).
"""

from __future__ import annotations

import threading
import time

from . import theme
from .live_figure import LiveFigure
from .metric_store import MetricStore

MIN_PERIOD_S = 2.0
CPU_SHARE = 0.03  # of one core, averaged from the first frame on (the sampler and the tables need ~1 %)
DEFAULT_SMOOTHING = 0.6
WIDTH_IN, ROW_HEIGHT_IN, DPI = 9.0, 2.6, 80


class PlotRenderer:
    """Draws the store's series into PNG bytes, linear and log; no widgets, usable anywhere."""

    def __init__(self) -> None:
        self.linear = LiveFigure(WIDTH_IN, ROW_HEIGHT_IN, DPI, log=False)
        self.log = LiveFigure(WIDTH_IN, ROW_HEIGHT_IN, DPI, log=True)

    def render(self, store_or_series, smoothing: float, both_scales: bool = True) -> tuple[bytes, bytes | None]:
        series = store_or_series.snapshot_series() if isinstance(store_or_series, MetricStore) else store_or_series
        linear = self.linear.render(series, smoothing)
        return linear, self.log.render(series, smoothing) if both_scales else None


class LossPlot:
    def __init__(self, store: MetricStore, smoothing: float = DEFAULT_SMOOTHING) -> None:
        import ipywidgets as W

        self.store = store
        self.smoothing = smoothing
        self.renderer = PlotRenderer()
        self._lock = threading.Lock()
        self.scale = W.ToggleButtons(options=["linear", "log"], value="linear", description="scale",
                                     style={"button_width": "60px"})
        self.linear = W.Image(format="png")
        self.log = W.Image(format="png")
        self.images = W.Stack([self.linear, self.log], selected_index=0)
        self.link = W.jslink((self.scale, "index"), (self.images, "selected_index"))
        # Until something is logged: a line of text, not a drawn figure (drawing costs CPU and delays the curves).
        self.hint = W.HTML(f"<span style='{theme.HINT_STYLE}'>nothing logged yet: call nbtrain.log(loss=...) in the cell</span>")
        self.widget = W.VBox([self.scale, self.hint, self.images])
        self.drawn_version = -1
        self.frames = 0
        self.render_seconds = 0.0
        self.last_cost = 0.0
        self.first_at = 0.0
        self._next_at = 0.0

    def update(self, model) -> None:
        """The panels' common entry (the store is the one given at construction, ``model.store``)."""
        self.refresh()

    def refresh(self, force: bool = False) -> bool:
        """Draw if something changed and the budget allows (or ``force``); returns whether it drew."""
        now = time.monotonic()
        version = self.store.version
        if not force and (version == 0 or version == self.drawn_version or now < self._next_at):
            return False
        if not force and self.frames and self.render_seconds + self.last_cost > CPU_SHARE * (now - self.first_at):
            return False  # the budget is an average since the first frame, so start-up frames count too
        with self._lock:
            started = time.thread_time()  # this thread's CPU, not the run loop's
            linear, log = self.renderer.render(self.store, self.smoothing)
            cost = time.thread_time() - started
            self.linear.value = linear
            self.log.value = log or linear
            self.drawn_version = version
            if not self.frames:
                self.first_at = now
            self.frames += 1
            self.render_seconds += cost
            self.last_cost = cost
            self._next_at = now + MIN_PERIOD_S
            if version and self.hint.layout.display != "none":
                self.hint.layout.display = "none"
        return True
