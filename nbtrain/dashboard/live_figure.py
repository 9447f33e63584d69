"""A figure that is built once and then only gets new data: the cheap way to redraw a live plot.

Creating axes is most of matplotlib's cost (every tick is an object), so :class:`LiveFigure` keeps its
axes and lines between frames and only calls ``set_data`` and rescales. It is rebuilt when the set of
panels changes (a new name was logged) or when a log-scale panel gets a value ≤ 0 (it then uses a
symmetric log scale, linear around zero). The linear and the log picture are two ``LiveFigure``
objects, so neither ever switches scale (which would rebuild its tick machinery).

The final figure, drawn once, uses :func:`~nbtrain.dashboard.plotting.draw_series` instead, which also
draws the min–max bands of downsampled buckets.
"""

from __future__ import annotations

from typing import Any

from . import plotting, theme
from .series import smooth


LAYOUT_EVERY = 10


def _positive(series: dict, names) -> bool:
    return all(min(series[n][2], default=1.0) > 0 for n in names)


def _widen_flat(ax) -> None:
    """A constant series (a fixed learning rate) would get a y-range of a few ulps, showing rounding noise."""
    low, high = ax.get_ylim()
    if high - low <= 1e-9 * max(abs(high), abs(low), 1e-300):
        middle = (low + high) / 2
        half = abs(middle) * 0.1 or 1.0
        ax.set_ylim(middle - half if ax.get_yscale() == "linear" else middle * 0.8, middle + half)


class LiveFigure:
    def __init__(self, width: float, row_height: float, dpi: int, log: bool = False) -> None:
        self.width, self.row_height, self.dpi, self.log = width, row_height, dpi, log
        self.figure: Any = None  # a matplotlib Figure once drawn
        self._layout_key: tuple | None = None
        self._lines: dict[str, tuple] = {}  # name -> (axes, raw line, smoothed line)
        self.frames = 0

    def _key(self, groups, series) -> tuple:
        return tuple((key, tuple(names), self.log and _positive(series, names)) for key, names in groups)

    def _build(self, groups, series, key) -> None:
        rows, cols = plotting._layout(len(groups))
        if self.figure is None or rows * self.row_height + 0.3 != self.figure.get_figheight():
            self.figure = plotting.new_figure(self.width, self.row_height * rows + 0.3, self.dpi)
        fig = self.figure
        fig.clear()
        self._lines = {}
        for i, ((panel, names), (_, _, positive)) in enumerate(zip(groups, key, strict=True)):
            ax = fig.add_subplot(rows, cols, i + 1)
            if self.log:
                ax.set_yscale("log" if positive else "symlog")
            for j, name in enumerate(names):
                color = theme.series_color(j)
                raw, = ax.plot([], [], color=color, alpha=theme.RAW_ALPHA, linewidth=theme.RAW_WIDTH)
                smoothed, = ax.plot([], [], color=color, linewidth=theme.CURVE_WIDTH, label=name,
                                    markersize=theme.MARKER_SIZE)
                self._lines[name] = (ax, raw, smoothed)
            theme.style_axes(ax, panel)
            if len(names) > 1:
                ax.legend(fontsize=theme.LEGEND_SIZE, loc="upper right")
            if i >= len(groups) - cols:
                ax.set_xlabel("step", fontsize=theme.LABEL_SIZE)
        self._layout_key = key
        self.frames = 0

    def render(self, series: dict, smoothing: float) -> bytes:
        """``series``: ``{name: (steps, means, mins, maxs, width)}``; returns the PNG."""
        groups = plotting.group_names(series)[: plotting.MAX_PANELS]
        if not groups:
            if self.figure is None or self._layout_key != ():
                self.figure = plotting.new_figure(self.width, self.row_height, self.dpi)
                plotting.draw_series(self.figure, {}, smoothing)
                self._layout_key = ()
            return plotting.png_bytes(self.figure)
        key = self._key(groups, series)
        if key != self._layout_key:
            self._build(groups, series, key)
        for name, (_, raw, smoothed) in self._lines.items():
            steps, means = series[name][0], series[name][1]
            curve = smooth(means, smoothing) if smoothing > 0 and len(means) > 10 else means
            if curve is means:  # not smoothed: the raw line would only duplicate it
                raw.set_data([], [])
            else:
                raw.set_data(steps, means)
            smoothed.set_data(steps, curve)
            smoothed.set_marker("o" if len(steps) < 15 else "")
        for ax in {entry[0] for entry in self._lines.values()}:
            ax.relim()
            ax.autoscale_view()
            _widen_flat(ax)
        # The constrained layout is the costliest step of a frame: compute it after a rebuild and every
        # LAYOUT_EVERY frames (tick labels change width as values change), keep it fixed in between.
        relayout = self.frames % LAYOUT_EVERY == 0
        self.figure.set_layout_engine("constrained" if relayout else "none")
        self.frames += 1
        return plotting.png_bytes(self.figure)
