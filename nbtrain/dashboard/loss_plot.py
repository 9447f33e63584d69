"""The live plot of every logged series, redrawn in place and never more than the CPU budget allows.

The widget is a row of controls over the image:

* **scale** (linear / log): both versions of the image are drawn and held in an ``ipywidgets.Stack``;
  the toggle is linked to the stack *in the browser* (``jslink``), so it switches instantly even while
  the cell runs — when the kernel's main thread is busy with the run and cannot receive widget events.
* **smoothing** (0 – 0.99): the weight of the moving average drawn over the raw curve. It is applied by
  the kernel, so during a run a change shows after the run's end (the kernel reads widget events only
  between cells); after the run it applies at once.

Redrawing: :meth:`LossPlot.refresh` draws only when new values arrived (or a control changed), and
waits between two drawings for at least :data:`MIN_PERIOD_S`, or longer when drawing is slow — the
pause is chosen so that drawing takes at most :data:`CPU_SHARE` of one core (a big figure on a slow
machine is refreshed less often instead of slowing the kernel).
"""

from __future__ import annotations

import threading
import time

from .live_figure import LiveFigure
from .metric_store import MetricStore

MIN_PERIOD_S = 2.0
MAX_PERIOD_S = 15.0
CPU_SHARE = 0.04
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
    def __init__(self, store: MetricStore) -> None:
        import ipywidgets as W

        self.store = store
        self.renderer = PlotRenderer()
        self._lock = threading.Lock()
        self.scale = W.ToggleButtons(options=["linear", "log"], value="linear", description="scale",
                                     style={"button_width": "60px"})
        self.smoothing = W.FloatSlider(value=DEFAULT_SMOOTHING, min=0.0, max=0.99, step=0.01, description="smoothing",
                                       continuous_update=False, readout_format=".2f")
        self.linear = W.Image(format="png")
        self.log = W.Image(format="png")
        self.images = W.Stack([self.linear, self.log], selected_index=0)
        self.link = W.jslink((self.scale, "index"), (self.images, "selected_index"))
        self.widget = W.VBox([W.HBox([self.scale, self.smoothing]), self.images])
        self.smoothing.observe(lambda _: self.refresh(force=True), names="value")
        self.drawn_version = -1
        self.frames = 0
        self.render_seconds = 0.0
        self._next_at = 0.0

    def refresh(self, force: bool = False) -> bool:
        """Draw if something changed and the budget allows (or ``force``); returns whether it drew."""
        now = time.monotonic()
        version = self.store.version
        if not force and (version == self.drawn_version or now < self._next_at):
            return False
        with self._lock:
            started = time.thread_time()  # this thread's CPU, not the run loop's
            linear, log = self.renderer.render(self.store, self.smoothing.value)
            cost = time.thread_time() - started
            self.linear.value = linear
            self.log.value = log or linear
            self.drawn_version = version
            self.frames += 1
            self.render_seconds += cost
            self._next_at = now + min(max(MIN_PERIOD_S, cost / CPU_SHARE), MAX_PERIOD_S)
        return True
