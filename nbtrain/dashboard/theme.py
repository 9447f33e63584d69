"""Colours and styles of every dashboard view and plot, in one place.

The HTML panels (run table, device bars, ``%gpus``) and the matplotlib figures (live plot, final
figure) share these, so a rank has the same colour in the table, in the memory bar and in the final
timeline, and a style change is made once. Matplotlib's own cycle (``C0``, ``C1``…) colours the logged
series of one panel (:func:`series_color`); :data:`RANK_COLORS` is that cycle's palette (tab10) written
out, for HTML.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------------ colours
RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
OTHER_COLOR = "#b0b0b0"  # memory held by processes that are not ranks; a value not known
ACCENT = "#1f77b4"  # the progress bar and the machine's RAM bar
MUTED = "#777"  # notes and hints
BUSY_LOW, BUSY_HIGH, BUSY_FULL = "#2ca02c", "#ff9f0e", "#d62728"  # load under 70 %, under 95 %, above


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def device_color(position: int) -> str:
    """The colour of the ``position``-th device in the final figure's timelines."""
    return RANK_COLORS[position % len(RANK_COLORS)]


def busy_color(percent: float | None) -> str:
    if percent is None:
        return OTHER_COLOR
    return BUSY_LOW if percent < 70 else BUSY_HIGH if percent < 95 else BUSY_FULL


def series_color(position: int) -> str:
    """The ``position``-th series of a plot panel (training first, then its validation twin)."""
    return f"C{position}"


# ------------------------------------------------------------------------------------------ HTML
STYLE = ("<style>.nbt-row{font:12px monospace;margin:2px 0;white-space:nowrap}"
         ".nbt-bar{display:inline-block;width:160px;height:10px;background:#eee;vertical-align:middle;"
         "margin:0 6px;position:relative;overflow:hidden}.nbt-seg{height:100%;float:left}"
         f".nbt-note{{font:11px sans-serif;color:{MUTED}}}</style>")
TABLE_STYLE = "font:12px monospace;border-collapse:collapse"
CELL_STYLE = "padding:0 8px"
HEAD_STYLE = "padding:0 8px;text-align:left"
STATUS_STYLE = f"font:12px sans-serif;color:{MUTED}"  # the %gpus monitor's "live · …" line
HINT_STYLE = f"color:{MUTED}"


def swatch(rank: int) -> str:
    """The small square in a rank's colour that marks it in tables and legends."""
    return f'<span style="color:{rank_color(rank)}">■</span>'


# ------------------------------------------------------------------------------------------ matplotlib
SUPTITLE_SIZE = 11
TITLE_SIZE = 10
TICK_SIZE = 8
LABEL_SIZE = 8
LEGEND_SIZE = 8
SMALL_LEGEND_SIZE = 7  # the timelines' legend, which lists every device
FOOTNOTE_SIZE = 7
GRID_ALPHA = 0.3
RAW_ALPHA, RAW_WIDTH = 0.3, 0.8  # the unsmoothed values, drawn light under the smoothed curve
CURVE_WIDTH = 1.5
TIMELINE_WIDTH = 1
MARKER_SIZE = 3
BAND_ALPHA = 0.12  # the min–max band of downsampled buckets


def style_axes(ax, title: str) -> None:
    """Title, tick labels and grid of one panel, as every figure draws them."""
    ax.set_title(title, fontsize=TITLE_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.grid(alpha=GRID_ALPHA)
