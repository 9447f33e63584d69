"""The live chart of every logged series, drawn in the browser from the points the kernel streams to it.

:class:`LiveChart` is an `anywidget <https://anywidget.dev>`_ whose JavaScript — uPlot and the chart's
own code, bundled from npm by ``labextension/``'s ``build:chart`` (esbuild) into
``nbtrain/kernel/dashboard/static/chart.js`` — ships inside the wheel: no CDN, so it works offline, in
JupyterLab 4, Notebook 7 and VS Code alike. The kernel sends data only; everything the user does with the
chart happens in the browser, which matters because the kernel's main thread is busy running the cell and
reads no widget events until the run is over:

* a panel per logged name, a training value and its validation twin together (``loss`` with
  ``val_loss``), each series drawn raw (light), with the min–max band of its buckets, and smoothed;
* earlier runs of the kernel (the last 3 by default: ``nbtrain.kernel.dashboard.configure(compare=N)``), each drawn
  faded and dashed in its panel, labelled in the legend with what differed in its cell and options — a click
  on its legend row hides it (sent once, in the ``overlays`` trait; see :mod:`~nbtrain.kernel.dashboard.chart_feed`);
* a smoothing slider, linear/log (log becomes ``asinh`` when a series has values ≤ 0), step or wall
  time on the x axis, hover to read every series' value, drag to zoom (double-click to unzoom).

:class:`ChartPanel` feeds it from a :class:`~nbtrain.kernel.dashboard.chart_feed.ChartFeed`: one message every
:data:`SEND_EVERY_S` seconds on average, only when something new was logged or sampled, carrying the new
*tail* (now and then a new *base* too; see that module) and the telemetry samples the load panels lack
(:mod:`~nbtrain.kernel.dashboard.load_feed`: GPU utilisation and memory, or CPU and RAM, over the run). The data traits hold ``bytes`` columns, which ipywidgets sends
as binary buffers. The chart draws with the kernel's style (:func:`~nbtrain.kernel.dashboard.theme.chart_style`,
sent once in the ``chart_style`` trait, and each device's line style with the load samples), as the final figure
does: the chart's JavaScript holds no colour, width or smoothing rule of its own.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import theme
from .chart_feed import ChartFeed
from .load_feed import LoadFeed
from .metric_store import MetricStore
from .series import DEFAULT_SMOOTHING
from .telemetry_series import TelemetrySeries

SEND_EVERY_S = 0.5  # two updates a second while values arrive, on the dashboard's 0.25 s ticks
EARLY_S = 0.1  # a tick this much before the due time counts as on time: ticks jitter by a few ms either way
BUNDLE = Path(__file__).with_name("static") / "chart.js"


def bundle_source() -> str:
    """The chart's JavaScript module; a clear error for a checkout whose bundle was never built."""
    try:
        return BUNDLE.read_text(encoding="utf-8")
    except FileNotFoundError:
        sources = Path(__file__).resolve().parents[3] / "labextension"
        raise RuntimeError(f"the dashboard's chart ({BUNDLE}) is not built: cd {sources} && jlpm install && "
                           "jlpm build:chart (pip install builds it too)") from None


_LiveChart: type | None = None


def _chart_class() -> type:
    """The widget class, made on first use: importing this module imports neither anywidget nor ipywidgets."""
    global _LiveChart
    if _LiveChart is None:
        import anywidget
        import traitlets

        class LiveChart(anywidget.AnyWidget):
            base = traitlets.Dict().tag(sync=True)  # see chart_feed: closed buckets, per epoch
            tail = traitlets.Dict().tag(sync=True)  # the buckets after the base's
            load = traitlets.Dict().tag(sync=True)  # see load_feed: the telemetry samples new since the last
            overlays = traitlets.Dict().tag(sync=True)  # earlier runs to draw faded (chart_feed.overlays_of), once
            smoothing = traitlets.Float(DEFAULT_SMOOTHING).tag(sync=True)  # the slider's start; the browser's then
            curves = traitlets.Bool(True).tag(sync=True)  # False: the load panels alone (``%gpus``)
            # theme.chart_style(): the chart has no palette of its own. Not named ``style``: that is every DOM
            # widget's style model in the browser, which would try to make a view of this dict (a TypeError).
            chart_style = traitlets.Dict().tag(sync=True)

            def __init__(self, **kwargs) -> None:
                self._esm = bundle_source()
                super().__init__(chart_style=theme.chart_style(), **kwargs)

        _LiveChart = LiveChart
    return _LiveChart


def live_chart(smoothing: float = DEFAULT_SMOOTHING, curves: bool = True):
    return _chart_class()(smoothing=smoothing, curves=curves)


class ChartPanel:
    """The dashboard's chart panel: ``.widget`` and ``.update(model)``, like the other panels."""

    def __init__(self, store: MetricStore | None, smoothing: float = DEFAULT_SMOOTHING, telemetry: TelemetrySeries | None = None,
                 earlier=()) -> None:
        """``store``: the logged series (``None``: the load panels alone, as ``%gpus`` shows them);
        ``telemetry``: the samples of the load panels (``None``: none); ``earlier``: runs to draw beside this one."""
        self.feed = ChartFeed(store, earlier=earlier) if store is not None else None
        self.loads = LoadFeed(telemetry) if telemetry is not None else None
        self.smoothing = smoothing
        self.widget = live_chart(smoothing, curves=store is not None)
        self.sent = 0  # messages sent to the browser
        self._due = float("-inf")  # when the next update may go

    def update(self, model=None, force: bool = False) -> bool:
        """Send what was logged or sampled since the last update, if anything and if due; returns whether it sent."""
        now = time.monotonic()
        if not force and now < self._due - EARLY_S:
            return False
        news = self.feed.poll() if self.feed is not None else None
        loads = self.loads.poll() if self.loads is not None else None
        if news is None and loads is None:
            return False
        with self.widget.hold_sync():  # base, tail and load in one message
            if news is not None:
                if news.overlays is not None:
                    self.widget.overlays = news.overlays
                if news.base is not None:
                    self.widget.base = news.base
                self.widget.tail = news.tail
            if loads is not None:
                self.widget.load = loads
        self.sent += 1
        # On a fixed half-second grid, so a late tick does not stretch the period: two updates a second on
        # 0.25 s ticks (a tick a few ms early still counts, or every other update would slip a whole tick);
        # after a pause in the news (or a stall) the grid restarts, one tick later at the earliest.
        self._due = max(self._due + SEND_EVERY_S, now + SEND_EVERY_S / 2)
        return True
