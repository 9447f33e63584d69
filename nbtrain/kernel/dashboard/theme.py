"""Colours and styles of every dashboard view and plot, in one place.

The HTML panels (run table, device bars, ``%gpus``), the live chart in the browser and the final figure
share these, so a rank has the same colour in the table, in the memory bar, in the live load panels and in
the final picture, and a style change is made once. The browser chart has no palette of its own: the kernel
sends it :func:`chart_style` (the logged series' colours, line widths, the smoothing rule) with the widget,
and :func:`device_style` of each device with the load samples (:mod:`~nbtrain.kernel.dashboard.load_feed`).
:data:`RANK_COLORS` is matplotlib's tab10 palette written out.
"""

from __future__ import annotations

from .series import SMOOTH_DENSE_SHARE, SMOOTH_MIN_POINTS
from .telemetry_series import DeviceKey, DeviceKind

# ------------------------------------------------------------------------------------------ colours
RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
OTHER_COLOR = "#b0b0b0"  # memory held by processes that are not ranks; a value not known
ACCENT = "#1f77b4"  # the progress bar and the machine's RAM bar
MUTED = "#777"  # notes and hints
BUSY_LOW, BUSY_HIGH, BUSY_FULL = "#2ca02c", "#ff9f0e", "#d62728"  # load under 70 %, under 95 %, above


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


MACHINE_COLOR = "#999999"  # grey: the whole machine's CPU and RAM, beside the ranks' colours
# A device's dash pattern (on-off lengths in pixels; none: solid): two ranks whose RAM lines coincide are
# then both seen, the later dashed line over the earlier solid, wider one.
DEVICE_DASHES: tuple[tuple[int, ...], ...] = ((), (6, 3), (2, 2), (8, 3, 2, 3))
DEVICE_WIDTHS = (2.0, 1.5)  # the solid line, the dashed ones


def device_style(key: DeviceKey) -> dict:
    """``{"color", "dash", "width"}`` of one device's line, live and in the final figure alike: a rank in its
    table colour, a GPU in its index's colour, the machine in grey."""
    if key.kind is DeviceKind.MACHINE:
        return {"color": MACHINE_COLOR, "dash": [], "width": DEVICE_WIDTHS[0]}
    index = key.index or 0
    dash = DEVICE_DASHES[index % len(DEVICE_DASHES)]
    return {"color": RANK_COLORS[index % len(RANK_COLORS)], "dash": list(dash),
            "width": DEVICE_WIDTHS[0] if not dash else DEVICE_WIDTHS[1]}


def busy_color(percent: float | None) -> str:
    if percent is None:
        return OTHER_COLOR
    return BUSY_LOW if percent < 70 else BUSY_HIGH if percent < 95 else BUSY_FULL


def series_color(position: int) -> str:
    """The ``position``-th series of a plot panel (training first, then its validation twin)."""
    return RANK_COLORS[position % len(RANK_COLORS)]


# ------------------------------------------------------------------------------------------ HTML
STYLE = ("<style>.nbt-row{font:12px monospace;margin:2px 0;white-space:nowrap}"
         # a row of parts (machine · RAM · cores) wraps between its parts in a narrow notebook, never inside one
         ".nbt-row.nbt-wrap{white-space:normal}.nbt-part{white-space:nowrap}"
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
# Points at the final figure's 90 DPI (1 pt = 1.25 px): its PNG is 630 px wide, shown at that width or scaled down to
# the notebook's: a 600 px wide JupyterLab notebook shows it 554 px wide, where 10.5 pt reads as 11.5 px
# (tests/test_dashboard_narrow_browser.py measures it).
SUPTITLE_SIZE = 12
TITLE_SIZE = 11
TICK_SIZE = 10.5
LABEL_SIZE = 10.5
LEGEND_SIZE = 10.5
FOOTNOTE_SIZE = 10.5
GRID_ALPHA = 0.3
# Line widths in the browser's pixels (the final figure converts them to points).
RAW_ALPHA, RAW_WIDTH = 0.3, 1.0  # the unsmoothed values, drawn light under the smoothed curve
CURVE_WIDTH = 2.0
MARKER_SIZE = 3
BAND_ALPHA = 0.12  # the min–max band of downsampled buckets
OVERLAY_ALPHA, OVERLAY_DASH = 0.4, (6, 4)  # an earlier run of the kernel, drawn faded and dashed beside this one


def style_axes(ax, title: str) -> None:
    """Title, tick labels and grid of one panel, as every figure draws them."""
    ax.set_title(title, fontsize=TITLE_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.grid(alpha=GRID_ALPHA)


def chart_style() -> dict:
    """What the browser chart draws with (see the module docstring): the same numbers as the final figure."""
    return {"series_colors": list(RANK_COLORS), "raw_alpha": RAW_ALPHA, "raw_width": RAW_WIDTH,
            "curve_width": CURVE_WIDTH, "band_alpha": BAND_ALPHA, "overlay_alpha": OVERLAY_ALPHA,
            "overlay_dash": list(OVERLAY_DASH),
            "smooth_min_points": SMOOTH_MIN_POINTS, "smooth_dense_share": SMOOTH_DENSE_SHARE}
