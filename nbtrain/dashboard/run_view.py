"""The run panel: a progress line (elapsed, step, speed, ETA) over a table of the ranks.

Progress line: time since the cell started; the step of rank 0 (``step / total`` and a bar when the
cell logged ``total_steps``); steps per second (rank 0's, measured over the last seconds); the time
left at that speed; and the run's state once it ended.

Rank table: per rank its pid, device, memory (GPU memory of its process tree when NVML can tell,
otherwise resident RAM), CPU % (100 = one core), its step and steps per second.

:func:`progress` computes the numbers (tested directly); :func:`run_html` draws them; :class:`RunPanel`
is one ``ipywidgets.HTML``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ..gpu.telemetry import Snapshot
from . import text
from .devices_view import STYLE, rank_color
from .metric_store import MetricStore


@dataclass(frozen=True)
class Progress:
    elapsed: float
    step: int | None  # steps done by the leading rank (its latest logged step + 1)
    total: int | None
    steps_per_second: float | None
    eta: float | None  # seconds left at the current speed

    @property
    def fraction(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return min(self.step / self.total, 1.0)


def progress(store: MetricStore, elapsed: float) -> Progress:
    ranks = store.ranks
    lead = 0 if 0 in ranks else (ranks[0] if ranks else None)
    last = store.rank_step(lead) if lead is not None else None
    step = None if last is None else last + 1
    speed = store.steps_per_second(lead) if lead is not None else None
    total = store.total_steps
    eta = None
    if total and step is not None and speed and speed > 0:
        eta = max(total - step, 0) / speed
    return Progress(elapsed, step, total, speed, eta)


def progress_text(p: Progress, status: str | None = None) -> str:
    parts = [f"elapsed {text.duration(p.elapsed)}"]
    if p.step is not None:
        parts.append(f"step {p.step}" + (f" / {p.total} ({100 * p.fraction:.0f}%)" if p.total else ""))
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


def run_html(store: MetricStore, snap: Snapshot | None, rank_infos, elapsed: float, status: str | None = None) -> str:
    p = progress(store, elapsed)
    bar = ""
    if p.fraction is not None:
        bar = (f'<span class="nbt-bar"><div class="nbt-seg" style="width:{100 * p.fraction:.1f}%;'
               f'background:#1f77b4"></div></span>')
    usages = {u.rank: u for u in (snap.ranks if snap else ())}
    rows = []
    for info in rank_infos:
        u = usages.get(info.rank)
        device = info.device or "starting"
        if info.gpu_index is not None:
            device += f" (GPU {info.gpu_index})"
        cells = [f'<span style="color:{rank_color(info.rank)}">■</span> {info.rank}', str(info.pid), html.escape(device),
                 _memory(u), text.percent(u.cpu_percent if u else None),
                 text.NA if store.rank_step(info.rank) is None else str(store.rank_step(info.rank) + 1),
                 text.rate(store.steps_per_second(info.rank))]
        rows.append("<tr>" + "".join(f'<td style="padding:0 8px">{c}</td>' for c in cells) + "</tr>")
    head = "".join(f'<th style="padding:0 8px;text-align:left">{h}</th>'
                   for h in ("rank", "pid", "device", "memory", "CPU", "step", "steps/s"))
    table = f'<table style="font:12px monospace;border-collapse:collapse"><tr>{head}</tr>{"".join(rows)}</table>'
    return f'{STYLE}<div class="nbt-row"><b>nbtrain</b> · {html.escape(progress_text(p, status))}{bar}</div>{table}'


class RunPanel:
    def __init__(self) -> None:
        import ipywidgets as W

        self.widget = W.HTML(f'{STYLE}<div class="nbt-row"><b>nbtrain</b> · starting the ranks…</div>')

    def update(self, store: MetricStore, snap: Snapshot | None, rank_infos, elapsed: float,
               status: str | None = None) -> None:
        self.widget.value = run_html(store, snap, rank_infos, elapsed, status)
