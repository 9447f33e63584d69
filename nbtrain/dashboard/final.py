"""What stays in the notebook after a run: one static PNG and one paragraph of text.

Both are ordinary cell outputs (``image/png``, ``text/markdown`` and ``text/plain``), so they survive
saving and reopening the notebook, ``nbconvert``, GitHub's viewer and VS Code — none of which keep a
live widget. The figure shows every logged series (as the live chart draws them: the same colours, widths and
smoothing rule, :func:`~nbtrain.dashboard.theme.chart_style`; the kernel's earlier runs it drew beside them, faded and
dashed) above the devices' load over the run (as the
live load panels: the same units, titles, colours and dashes, a legend in both panels); the paragraph says how the run ended, how long it took, how fast
it went, where each series started and ended, and how busy the devices were.
"""

from __future__ import annotations

from ..launch.observers.events import RunState
from ..words import count, plural
from . import plotting, text, theme
from .metric_store import MetricStore
from .progress import Progress
from .series import DEFAULT_SMOOTHING
from .telemetry_series import DeviceKind, TelemetrySeries

WIDTH_IN, ROW_HEIGHT_IN, DPI = 10.0, 2.6, 90


def final_png(store: MetricStore, telemetry: TelemetrySeries, title: str, smoothing: float = DEFAULT_SMOOTHING,
              earlier=()) -> bytes:
    return plotting.png_bytes(final_figure(store, telemetry, title, smoothing, earlier))


def earlier_series(earlier) -> list[tuple[str, dict]]:
    """The kernel's earlier runs the live chart drew beside this one (:class:`~nbtrain.launch.observers.runlog.EarlierRun`),
    as :func:`~.plotting.draw_series` draws them: ``("3: what differed", {name: (steps, values)})``, rank 0's."""
    drawn = []
    for run in earlier:
        history = run.history
        series = {name: (s.steps, s.values) for name in history.names if len(s := history.series(name))}
        drawn.append((f"{run.number}: {run.label}", series))
    return drawn


def final_figure(store: MetricStore, telemetry: TelemetrySeries, title: str, smoothing: float = DEFAULT_SMOOTHING,
                 earlier=()):
    """The matplotlib figure behind :func:`final_png`; ``earlier``: the runs the live chart drew beside this one."""
    series = store.snapshot_series()
    timelines = telemetry.timelines()
    panels = min(len(plotting.group_names(series)), plotting.MAX_PANELS)
    rows = plotting._layout(panels)[0] if panels else 0
    height = ROW_HEIGHT_IN * (rows + (1 if timelines else 0)) + 0.5
    fig = plotting.new_figure(WIDTH_IN, max(height, 2.0), DPI)
    fig.suptitle(text.plot_literal(title), fontsize=theme.SUPTITLE_SIZE)
    if panels and timelines:
        top, bottom = fig.subfigures(2, 1, height_ratios=[rows, 1])
    else:
        top, bottom = (fig, None) if panels else (None, fig)
    if top is not None:
        plotting.draw_series(top, series, smoothing, earlier_series(earlier))
    if bottom is not None and timelines:
        ax_busy, ax_memory = bottom.subplots(1, 2)
        styles = {key: theme.device_style(key) for key in timelines}
        plotting.draw_timelines(ax_busy, ax_memory, timelines, styles, telemetry.titles())
    return fig


def _series_sentence(store: MetricStore, name: str) -> str | None:
    series = store.series(name)
    if series is None or not series.means:
        return None
    first, last = series.means[0], series.last_value
    low_at = series.steps[series.means.index(min(series.means))]
    sentence = f"{name} {text.number(first)} → {text.number(last)}"
    if series.count > 2 and len(series.means) > 2:
        sentence += f" (lowest {text.number(series.finite_min)} near step {low_at:.0f})"
    return sentence


def summary_paragraph(store: MetricStore, telemetry: TelemetrySeries, status: RunState, detail: str,
                      nprocs: int, where: str, p: Progress, cold_start: str = "") -> str:
    """The run in one paragraph of plain sentences (``cold_start``: new ranks' time to the first step, split)."""
    ended = f"{plural('was', nprocs)} interrupted" if status == RunState.INTERRUPTED else status
    parts = [f"{count('rank', nprocs)} on {where} {ended} after {text.duration(p.elapsed)}"
             + (f" ({detail})" if status != RunState.FINISHED and detail else "") + "."]
    if cold_start:
        parts.append(cold_start[:1].upper() + cold_start[1:] + ".")
    if p.step is not None:
        speed = f" at {p.steps_per_second:.1f} steps/s" if p.steps_per_second else ""
        parts.append(f"Rank 0 reached step {p.step}" + (f" of {p.total}" if p.total else "") + f"{speed}.")
    sentences = [s for s in (_series_sentence(store, n) for n in store.names) if s]
    if sentences:
        parts.append("Logged: " + "; ".join(sentences) + ".")
    for name, step in store.nonfinite().items():
        parts.append(f"{name} became NaN or infinite at step {step}.")
    loads = []
    for key, (busy, memory) in telemetry.peaks().items():
        if key.kind is not DeviceKind.GPU:  # CPU path: CPU in % of one core, memory a share of the RAM
            cpu = "" if busy is None else f"{text.percent(busy)} of a core on average, "  # None: too short to measure
            loads.append(f"{key.label} used {cpu}at most {text.percent(memory)} of the RAM")
        else:
            loads.append(f"{key.label} {text.percent(busy)} busy on average, memory peak {text.percent(memory)}")
    if loads:
        parts.append("Devices: " + "; ".join(loads) + ".")
    snap = telemetry.latest
    if snap is not None and snap.nvml_error:
        parts.append(f"No GPU telemetry: {snap.nvml_error}.")
    return " ".join(parts)
