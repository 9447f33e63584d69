"""What stays in the notebook after a run: one static PNG and one paragraph of text.

Both are ordinary cell outputs (``image/png``, ``text/markdown`` and ``text/plain``), so they survive
saving and reopening the notebook, ``nbconvert``, GitHub's viewer and VS Code — none of which keep a
live widget. The figure shows every logged series (as the live chart draws them: the same colours, widths and
smoothing rule, :func:`~nbtrain.kernel.dashboard.theme.chart_style`; the kernel's earlier runs it drew beside them, faded and
dashed) above the devices' load over the run (as the
live load panels: the same units, titles, colours and dashes, a legend in both panels); the summary says in a few
short lines how the run ended, how long it took and how fast it went, where each series started and ended, and
how busy the devices were.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..observers.events import RunState
from ...common.words import count, plural
from . import plotting, text, theme
from .metric_store import MetricStore
from .progress import Progress
from .series import DEFAULT_SMOOTHING
from .step_split import draw_step_split
from .telemetry_series import MACHINE, DeviceKind, TelemetrySeries

WIDTH_IN, ROW_HEIGHT_IN, DPI = 7.0, 2.6, 90  # 630 px wide: the picture is shown scaled down less in a narrow notebook
NO_LINE = "the run ended after one sample of it"


SPLIT_ROW_IN, SPLIT_RANK_IN = 0.9, 0.3  # the step split's row: its axis and title, and each rank's bar


@dataclass(frozen=True)
class Beside:
    """What the final picture draws beside the run's own series and load: the kernel's earlier runs the live chart
    drew (:class:`~nbtrain.kernel.observers.runlog.EarlierRun`), and each rank's step split (:mod:`.step_split`)."""

    earlier: tuple = ()
    splits: dict = field(default_factory=dict)


def final_png(store: MetricStore, telemetry: TelemetrySeries, title: str, smoothing: float = DEFAULT_SMOOTHING,
              beside: Beside = Beside()) -> bytes | None:
    """The picture left under the cell; None for a run that has nothing to draw — no series logged, no load over
    time (a run shorter than two samples), no step split — whose summary says all there is (and drawing an empty
    picture was most of a short cell's cost)."""
    if not store.snapshot_series() and not telemetry.has_line() and not beside.splits:
        return None
    return plotting.png_bytes(final_figure(store, telemetry, title, smoothing, beside))


def earlier_series(earlier) -> list[tuple[str, dict]]:
    """The kernel's earlier runs the live chart drew beside this one (:class:`~nbtrain.kernel.observers.runlog.EarlierRun`),
    as :func:`~.plotting.draw_series` draws them: ``("3: what differed", {name: (steps, values)})``, rank 0's."""
    drawn = []
    for run in earlier:
        history = run.history
        series = {name: (s.steps, s.values) for name in history.names if len(s := history.series(name))}
        drawn.append((f"{run.number}: {run.label}", series))
    return drawn


def final_figure(store: MetricStore, telemetry: TelemetrySeries, title: str, smoothing: float = DEFAULT_SMOOTHING,
                 beside: Beside = Beside()):
    """The matplotlib figure behind :func:`final_png`: the series, the load, and the step split where ranks sent one."""
    series = store.snapshot_series()
    timelines = telemetry.timelines() if telemetry.has_line() else {}  # one sample: no line, an axis of nothing
    panels = min(len(plotting.group_names(series)), plotting.MAX_PANELS)
    rows = plotting.grid_shape(panels)[0] if panels else 0
    heights = [ROW_HEIGHT_IN * rows if panels else 0.0, ROW_HEIGHT_IN if timelines else 0.0,
               SPLIT_ROW_IN + SPLIT_RANK_IN * len(beside.splits) if beside.splits else 0.0]
    fig = plotting.new_figure(WIDTH_IN, max(sum(heights) + 0.5, 2.0), DPI)
    fig.suptitle(text.plot_literal(title), fontsize=theme.SUPTITLE_SIZE)
    drawn = [height for height in heights if height]
    parts = list(fig.subfigures(len(drawn), 1, height_ratios=drawn)) if len(drawn) > 1 else [fig] * len(drawn)
    places = iter(parts)
    top = next(places) if panels else None
    bottom = next(places) if timelines else None
    if top is not None:
        plotting.draw_series(top, series, smoothing, earlier_series(beside.earlier))
    if bottom is not None:
        ax_busy, ax_memory = bottom.subplots(1, 2)
        styles = {key: theme.device_style(key) for key in timelines}
        plotting.draw_timelines(ax_busy, ax_memory, timelines, styles, telemetry.titles())
    elif telemetry.latest is not None:
        fig.text(0.01, 0.005, f"load over the run not drawn: {NO_LINE}", fontsize=theme.FOOTNOTE_SIZE, color=theme.MUTED)
    if beside.splits:
        draw_step_split(next(places).subplots(1, 1), beside.splits)
    return fig


def _series_sentence(store: MetricStore, name: str) -> str | None:
    series = store.series(name)
    if series is None or not series.means:
        return None
    first, last = series.means[0], series.last_value
    low_at = series.steps[series.means.index(min(series.means))]
    sentence = f"{name} {text.number(first)} → {text.number(last)}"
    said = {text.number(first), text.number(last)}  # a lowest value that is one of these is not news
    if series.count > 2 and len(series.means) > 2 and text.number(series.finite_min) not in said:
        sentence += f" (lowest {text.number(series.finite_min)} near step {low_at:.0f})"
    return sentence


def summary_paragraph(store: MetricStore, telemetry: TelemetrySeries, status: RunState, detail: str,
                      nprocs: int, where: str, p: Progress, cold_start: str = "") -> str:
    """The run in a few short lines, each on one topic: what ran and how fast, what it logged, the load.

    Each number is said once, in the dashboard's units (CPU in % of one core); ``cold_start`` is the new ranks'
    time to the first step (its split is the cell's own closing line, not repeated here)."""
    return "\n".join(line for line in (_run_line(status, detail, nprocs, where, p, cold_start),
                                        _logged_line(store), _load_line(telemetry)) if line)


def _run_line(status: RunState, detail: str, nprocs: int, where: str, p: Progress, cold_start: str) -> str:
    ended = f"{plural('was', nprocs)} interrupted" if status == RunState.INTERRUPTED else status
    line = f"{count('rank', nprocs)} on {where} {ended} after {text.duration(p.elapsed)}"
    if status != RunState.FINISHED and detail:
        line += f" ({detail})"
    if p.step is not None:
        line += f", step {p.step}" + (f" of {p.total}" if p.total else "")
        line += f" at {p.steps_per_second:.1f} steps/s" if p.steps_per_second else ""
    return line + (f", {cold_start}" if cold_start else "") + "."


def _logged_line(store: MetricStore) -> str:
    sentences = [s for s in (_series_sentence(store, n) for n in store.names) if s]
    sentences += [f"{name} became NaN or infinite at step {step}" for name, step in store.nonfinite().items()]
    return "Logged: " + "; ".join(sentences) + "." if sentences else ""


def _load_line(telemetry: TelemetrySeries) -> str:
    """GPUs: each one's mean load and memory peak. Without: the machine's CPU (in % of one core) and RAM, the ranks'
    as a range beside it — one number per device and quantity."""
    peaks = telemetry.peaks()
    gpus = [f"{key.label} {text.percent(busy)} busy on average, memory peak {text.percent(memory)}"
            for key, (busy, memory) in peaks.items() if key.kind is DeviceKind.GPU]
    snap = telemetry.latest
    no_gpu = text.no_gpu(snap.nvml_error) if snap is not None and snap.nvml_error else ""
    if gpus:
        return "Load: " + "; ".join(gpus) + "."
    machine = peaks.get(MACHINE)
    ranks = [loads for key, loads in peaks.items() if key.kind is DeviceKind.RANK]
    if machine is None:
        return no_gpu + "." if no_gpu else ""
    cpu = _with_ranks(machine[0], [busy for busy, _ in ranks], "of a core on average")
    ram = _with_ranks(machine[1], [memory for _, memory in ranks], "of the RAM at most")
    lead = f"{no_gpu}: the machine" if no_gpu else "The machine"
    return f"{lead} used {cpu}, {ram}."


def _with_ranks(machine: float | None, ranks: list, unit: str) -> str:
    """``185% of a core on average (ranks 95–97%)``; ``None`` values (a run too short to measure) left out."""
    said = f"{text.percent(machine)} {unit}" if machine is not None else text.NA
    known = sorted(value for value in ranks if value is not None)
    if not known:
        return said
    low, high = text.percent(known[0]), text.percent(known[-1])
    if len(known) == 1:
        return f"{said} (the rank {low})"
    return f"{said} (each rank {low})" if low == high else f"{said} (ranks {low[:-1]}–{high})"
