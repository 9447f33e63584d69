"""The run panel: a progress line (elapsed, step, speed, ETA) over a table of the ranks.

Progress line: time since the cell started; the step of rank 0 (``step / total`` and a bar when the
cell logged ``total_steps``); steps per second (rank 0's, measured over the last seconds); the time
left at that speed; with ``--price-per-gpu-hour``, the GPU-hours (core-hours on the CPU) held so far and their
cost (:mod:`nbtrain.kernel.observers.cost`); and the run's state once it ended.

Rank table: per rank its pid, device, memory (GPU memory of its process tree when NVML can tell,
otherwise resident RAM), CPU % (100 = one core), its step and steps per second.

Under the table: what ``prepare()`` set up (precision, channels_last, the compile time) and the bottleneck
advisor's hints so far (:mod:`nbtrain.kernel.diagnostics.advisor`; computed there, only shown here).

Node table (a ``--nodes`` run only): per machine its name, host and address, ranks, state, and the CPU, RAM
and each GPU's load and memory that its last heartbeat reported (:func:`nodes_html`).

:func:`~nbtrain.kernel.dashboard.progress.progress` computes the numbers (tested directly); :func:`run_html`
draws them; :class:`RunPanel` is one ``ipywidgets.HTML``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from ...gpu.telemetry import Snapshot
from . import text, theme
from .metric_store import MetricStore
from .model import RunModel
from .progress import Progress, progress

STALL_S = 1.5  # no sample for this long (a slow sampler, a long --interval): the elapsed time moves anyway


def progress_text(p: Progress, status: str | None = None, metering=None) -> str:
    parts = [f"elapsed {text.duration(p.elapsed)}"]
    if metering is not None and metering.price is not None:
        parts.append(metering.words(p.elapsed))
    if p.step is not None:
        parts.append(f"step {p.step}" + (f" / {p.total} ({100 * p.fraction:.0f}%)" if p.fraction is not None else ""))
    if p.steps_per_second is not None:
        parts.append(f"{text.rate(p.steps_per_second)[:-2]} steps/s")
    if p.eta is not None and status is None:
        parts.append(f"ETA {text.duration(p.eta)}")
    if status:
        parts.append(status)
    return " · ".join(parts)


def _memory(usage) -> str:
    if usage is None:
        return text.NA
    if not usage.alive:
        return "exited"
    if usage.gpu_index is not None:  # None: the driver does not say (the devices panel's notes say why)
        return f"{text.size(usage.gpu_memory)} GPU"
    return f"{text.size(usage.rss)} RAM"


def node_gpus_text(gpus) -> str:
    """``GPU 0 97% 1.2 GiB/80.0 GiB, GPU 1 …`` from a heartbeat's GPUs; ``–`` for a node without one."""
    return ", ".join(f"GPU {g.index} {text.percent(g.utilization)} {text.size(g.memory_used)}/{text.size(g.memory_total)}"
                     for g in (gpu.status for gpu in gpus)) or "–"


def nodes_html(nodes) -> str:
    """The table of a --nodes run's machines; "" on one machine."""
    if not nodes:
        return ""
    rows = []
    for node in nodes:
        ranks = f"{node.ranks[0]}–{node.ranks[-1]}" if len(node.ranks) > 1 else "".join(map(str, node.ranks))
        cells = [node.name, f"{node.host} ({node.address})", ranks, node.state, text.percent(node.cpu_percent),
                 text.percent(node.ram_percent), node_gpus_text(node.gpus)]
        rows.append("<tr>" + "".join(f'<td style="{theme.CELL_STYLE}">{html.escape(c)}</td>' for c in cells) + "</tr>")
    head = "".join(f'<th style="{theme.HEAD_STYLE}">{h}</th>'
                   for h in ("node", "host", "ranks", "state", "CPU", "RAM", "GPUs"))
    return f'<table style="{theme.TABLE_STYLE}"><tr>{head}</tr>{"".join(rows)}</table>'


def run_html(store: MetricStore, snap: Snapshot | None, rank_infos, elapsed: float, status: str | None = None,
             setup: Sequence[str] = (), hints: Sequence = (), nodes=(), metering=None) -> str:
    p = progress(store, elapsed)
    bar = ""
    if p.fraction is not None:
        bar = (f'<span class="nbt-bar"><div class="nbt-seg" style="width:{100 * p.fraction:.1f}%;'
               f'background:{theme.ACCENT}"></div></span>')
    usages = {u.rank: u for u in (snap.ranks if snap else ())}
    rows = []
    for info in rank_infos:
        u = usages.get(info.rank)
        step = store.rank_step(info.rank)
        device = info.device or "starting"
        if info.gpu_index is not None:
            device += f" (GPU {info.gpu_index})"
        cells = [f'{theme.swatch(info.rank)} {info.rank}', str(info.pid), html.escape(device),
                 _memory(u), text.percent(u.cpu_percent if u else None),
                 text.NA if step is None else str(step + 1),
                 text.rate(store.steps_per_second(info.rank))]
        rows.append("<tr>" + "".join(f'<td style="{theme.CELL_STYLE}">{c}</td>' for c in cells) + "</tr>")
    head = "".join(f'<th style="{theme.HEAD_STYLE}">{h}</th>'
                   for h in ("rank", "pid", "device", "memory", "CPU, % of a core", "step", "steps/s"))
    table = f'<table style="{theme.TABLE_STYLE}"><tr>{head}</tr>{"".join(rows)}</table>'
    extra = ""
    if setup:
        extra += f'<div class="nbt-row">prepared: {html.escape(" · ".join(setup))}</div>'
    extra += "".join(f'<div class="nbt-row">💡 {html.escape(h.text)}</div>' for h in hints)
    return (f'{theme.STYLE}<div class="nbt-row"><b>nbtrain</b> · {html.escape(progress_text(p, status, metering))}{bar}</div>'
            f'{table}{nodes_html(nodes)}{extra}')


class RunPanel:
    """The run panel as an ``ipywidgets.HTML``; :meth:`update` redraws when a telemetry sample arrived (once
    a second), the run's status or nodes changed, or, while samples stall, when the shown second moved.
    Logged values alone wait for the next sample: the chart shows them as they come, and the panel's
    redraws coincide with the device panel's, so the tables cost the front end two messages a second."""

    def __init__(self) -> None:
        import ipywidgets as W

        self.widget = W.HTML(f'{theme.STYLE}<div class="nbt-row"><b>nbtrain</b> · starting the ranks…</div>')
        self._shown: tuple | None = None
        self._drawn_at = float("-inf")  # the model's elapsed time at the last redraw

    def update(self, model: RunModel) -> None:
        elapsed, status = model.elapsed(), model.status_text()
        shown = (model.telemetry.version, model.placement_version, status)
        stalled = elapsed - self._drawn_at >= STALL_S
        if shown != self._shown or stalled:
            self._shown, self._drawn_at = shown, elapsed
            self.widget.value = run_html(model.store, model.telemetry.latest, model.ranks, elapsed, status,
                                         model.setup_words(), model.hints(), model.nodes,
                                         model.info.metering if model.info else None)
