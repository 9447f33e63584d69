"""Drawing logged series with matplotlib, for the live plot and the final figure alike.

Series are grouped so that a training value and its validation twin share one panel: ``loss`` with
``val_loss``, ``train_acc`` with ``val_acc``, ``train/loss`` with ``eval/loss`` (prefixes and suffixes
``train``/``training`` and ``val``/``valid``/``validation``/``eval``/``test``, joined by ``_`` or ``/``).
Each series is drawn as its raw (downsampled) mean in a light line, the min–max band of its buckets
when several points share one, and the smoothed curve on top (exponential moving average with the
bias removed, see :func:`~nbtrain.kernel.dashboard.series.smooth`).

Only the object-oriented API is used (``matplotlib.figure.Figure`` with the Agg canvas, never
``pyplot``): drawing happens on the dashboard's thread, and nothing is left for the notebook's inline
backend to show twice.
"""

from __future__ import annotations

import io
import math
import textwrap

from . import theme
from .series import smooth, worth_smoothing
from .telemetry_series import TIME_AXIS
from .text import plot_literal

VALIDATION_WORDS = ("val", "valid", "validation", "eval", "test")
TRAINING_WORDS = ("train", "training")
MAX_PANELS = 6
LEGEND_LABEL_CHARS = 18  # a legend label's line: the legend beside a panel takes no more of its width
EARLIER_LABEL_CHARS = 100  # an earlier run's label in the legend under the panels: one line of the picture's width
MACHINE_BOTH = "machine (CPU, RAM)"  # the machine's line in the load panels' one legend
MAX_LEGEND_DEVICES = 12  # the load panels' legend beyond this names the rest by their count: a legend of 200
# ranks under the panels left them no height at all (matplotlib then warns into the cell)
PIXEL_PT = 0.75  # the theme's widths are the browser's pixels; matplotlib's are points (1 px = 0.75 pt)
OVERLAY_LINESTYLE = (0, tuple(d / theme.CURVE_WIDTH for d in theme.OVERLAY_DASH))  # matplotlib: in line widths


# the series nbtrain logs itself (nbtrain.rank.train.stepmeter): a panel's title says what their numbers are, so
# data_wait's 0.6 reads as 0.6 % and tflops' 0.006 on the CPU as TFLOP/s
MEASURED_UNITS = {"data_wait": "% of each step", "samples_per_s": "all ranks", "tokens_per_s": "all ranks",
                  "tflops": "TFLOP/s per rank", "mfu": "% of the dense peak"}


def panel_title(key: str, sep: str = " ") -> str:
    """A panel's title: its series' name, with the unit of the series nbtrain measures itself (after ``sep``: the
    picture's narrower panels have it on a line of its own)."""
    unit = MEASURED_UNITS.get(key)
    return f"{key}{sep}({unit})" if unit else key


def _split(name: str) -> tuple[str, str]:
    """``(key, role)``: ``val_loss`` → ("loss", "val"); ``loss`` → ("loss", "train")."""
    lowered = name.lower()
    for sep in ("_", "/", "."):
        for words, role in ((VALIDATION_WORDS, "val"), (TRAINING_WORDS, "train")):
            for word in words:
                if lowered.startswith(word + sep) and len(name) > len(word) + 1:
                    return name[len(word) + 1:], role
                if lowered.endswith(sep + word) and len(name) > len(word) + 1:
                    return name[: -len(word) - 1], role
    return name, "train"


def group_names(names) -> list[tuple[str, list[str]]]:
    """Panels in order of first appearance: ``[(key, [names, training first])]``."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for name in names:
        key, role = _split(name)
        groups.setdefault(key, []).append((role, name))
    return [(key, [n for _, n in sorted(members, key=lambda m: m[0] != "train")]) for key, members in groups.items()]


def grid_shape(n: int) -> tuple[int, int]:
    cols = 1 if n == 1 else 2 if n <= 4 else 3
    return math.ceil(n / cols), cols


def draw_series(fig, series: dict, smoothing: float, earlier=()) -> list:
    """Draw every panel on ``fig``; ``series``: ``{name: (steps, means, mins, maxs, width)}``; ``earlier``: the
    kernel's earlier runs drawn faded and dashed beside them, as the live chart does: ``(label, {name: (steps,
    values)})`` each (a name this run did not log has no panel). Returns the axes."""
    fig.clear()
    groups = group_names(series)
    if not groups:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "nothing logged yet: call nbtrain.log(loss=...) in the cell",
                ha="center", va="center", transform=ax.transAxes, color=theme.MUTED)
        ax.set_axis_off()
        return []
    shown = groups[:MAX_PANELS]
    rows, cols = grid_shape(len(shown))
    axes = []
    max_points = max(len(series[name][1]) for _, names in shown for name in names)
    runs_drawn: dict[str, None] = {}  # the earlier runs drawn in any panel, in order
    run_span = _span([series[name][0] for _, names in shown for name in names])
    for i, (key, names) in enumerate(shown):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, name in enumerate(names):
            steps, means, mins, maxs, width = series[name]
            color = theme.series_color(j)
            if width > 1:
                ax.fill_between(steps, mins, maxs, color=color, alpha=theme.BAND_ALPHA, linewidth=0)
            dense = worth_smoothing(len(means), max_points)
            curve = smooth(means, smoothing) if smoothing > 0 and dense else means
            if curve is not means:
                ax.plot(steps, means, color=color, alpha=theme.RAW_ALPHA, linewidth=theme.RAW_WIDTH * PIXEL_PT)
            ax.plot(steps, curve, color=color, linewidth=theme.CURVE_WIDTH * PIXEL_PT, label=plot_literal(name),
                    marker="o" if len(steps) < 15 else None, markersize=theme.MARKER_SIZE)
        runs_drawn.update(dict.fromkeys(_draw_earlier(ax, names, earlier, smoothing, max_points)))
        _follow_this_run(ax, [series[name][0] for name in names], run_span)
        theme.style_axes(ax, plot_literal(panel_title(key, "\n")))
        if len(names) > 1:
            _legend_beside(ax, len(names))
        axes.append(ax)
    if runs_drawn:
        _earlier_legend_below(fig, list(runs_drawn))
    if len(groups) > MAX_PANELS:
        more = plot_literal(", ".join(key for key, _ in groups[MAX_PANELS:]))
        fig.text(0.01, 0.005, f"not drawn (see history): {more}", fontsize=theme.FOOTNOTE_SIZE, color=theme.MUTED)
    for ax in axes[-cols:]:
        ax.set_xlabel("step", fontsize=theme.LABEL_SIZE)
    return axes


def _follow_this_run(ax, steps_of_names: list, run_span: tuple[float, float]) -> None:
    """The x axis spans this run's steps: a longer earlier run drawn beside it is cut, not the scale of the plot. A
    panel of one step (a rate measured over one window) spans the steps of the whole run (``run_span``), where that
    holds its step, not one step either side of it."""
    low, high = _span(steps_of_names)
    if high == low and run_span[0] <= low <= run_span[1]:
        low, high = run_span
    if high > low:
        margin = (high - low) * 0.02
        ax.set_xlim(low - margin, high + margin)


def _span(steps_of_names: list) -> tuple[float, float]:
    spans = [(steps[0], steps[-1]) for steps in steps_of_names if len(steps)]
    return min(s[0] for s in spans), max(s[1] for s in spans)


def _legend_beside(ax, own: int) -> None:
    """The legend of the panel's ``own`` series (drawn first) right of the plot, never over its lines, its labels
    wrapped short (the layout makes room)."""
    handles, labels = ax.get_legend_handles_labels()
    wrapped = [textwrap.fill(label, LEGEND_LABEL_CHARS) for label in labels[:own]]
    ax.legend(handles[:own], wrapped, fontsize=theme.LEGEND_SIZE, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0, frameon=False)


def _earlier_legend_below(fig, runs: list[str]) -> None:
    """The earlier runs drawn faded and dashed in the panels, named once under them. Named beside each panel, their
    long labels left three panels in a row no width at all (matplotlib then warned into the cell)."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=theme.MUTED, linewidth=theme.CURVE_WIDTH * PIXEL_PT, linestyle=OVERLAY_LINESTYLE)
               for _ in runs]
    labels = [textwrap.shorten(f"run {run}", EARLIER_LABEL_CHARS, placeholder=" …") for run in runs]
    fig.legend(handles, labels, loc="outside lower center", fontsize=theme.LEGEND_SIZE, frameon=False)


def _draw_earlier(ax, names: list[str], earlier, smoothing: float, max_points: int) -> list[str]:
    """The earlier runs' lines of this panel's ``names``, each in its name's colour, faded and dashed, labelled
    ``loss · run 3: --lr 0.1`` as in the live chart's legend. Returns the labels of the runs drawn."""
    drawn = []
    for label, runs_series in earlier:
        for j, name in enumerate(names):
            if name not in runs_series or not len(runs_series[name][0]):
                continue
            steps, values = runs_series[name]
            dense = worth_smoothing(len(values), max_points)
            curve = smooth(list(values), smoothing) if smoothing > 0 and dense else values
            ax.plot(steps, curve, color=theme.series_color(j), alpha=theme.OVERLAY_ALPHA,
                    linewidth=theme.CURVE_WIDTH * PIXEL_PT,
                    linestyle=OVERLAY_LINESTYLE,
                    label=plot_literal(f"{name} · run {label}"))
            drawn.append(plot_literal(label))
    return drawn


def new_figure(width: float, height: float, dpi: int = 80):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def draw_timelines(ax_busy, ax_memory, timelines: dict, styles: dict, titles: tuple[str, str]) -> None:
    """Load and memory of each device over the run (the final figure's bottom row), as the live load panels
    draw them: ``styles`` per device (:func:`~nbtrain.kernel.dashboard.theme.device_style`), ``titles`` theirs."""
    for key, ((t_busy, busy), (t_mem, memory)) in timelines.items():
        style = styles[key]
        line = {"color": style["color"], "linewidth": style["width"] * PIXEL_PT,
                "marker": "o" if len(t_busy) < 15 else None, "markersize": theme.MARKER_SIZE}  # few samples: seen
        if style["dash"]:
            line["linestyle"] = (0, tuple(d / style["width"] for d in style["dash"]))  # matplotlib: in line widths
        ax_busy.plot(t_busy, busy, label=key.label, **line)
        ax_memory.plot(t_mem, memory, label=key.memory_label, **line)
    for ax, title in zip((ax_busy, ax_memory), titles, strict=True):
        ax.set_title(title, fontsize=theme.TITLE_SIZE)
        ax.set_xlabel(TIME_AXIS, fontsize=theme.LABEL_SIZE)
        ax.tick_params(labelsize=theme.TICK_SIZE)
        ax.grid(alpha=theme.GRID_ALPHA)
        ax.set_ylim(bottom=0, top=max(100, ax.get_ylim()[1]))  # as the live panels: 0 to at least 100
    if timelines:
        _devices_legend_below(ax_busy, list(timelines))


def _devices_legend_below(ax_busy, keys: list) -> None:
    """One legend for both load panels, under them: a device is drawn alike in both, and inside a panel (``best``)
    a legend of every device covered its lines. The machine's line is its CPU in one panel and its RAM in the
    other: here it is named for both."""
    from matplotlib.lines import Line2D

    handles = ax_busy.get_lines()[:len(keys)]
    labels = [key.label if key.label == key.memory_label else MACHINE_BOTH for key in keys]
    if len(keys) > MAX_LEGEND_DEVICES:
        shown = MAX_LEGEND_DEVICES - 1
        handles = [*handles[:shown], Line2D([], [], linestyle="none")]
        labels = [*labels[:shown], f"and {len(keys) - shown} more"]
    ax_busy.get_figure(root=False).legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4),
                                          fontsize=theme.LEGEND_SIZE, frameon=False)
