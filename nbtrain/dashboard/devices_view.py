"""The device panel: one row per GPU (or, without GPUs, the machine's CPU/RAM and each rank's CPU).

Each row is a utilisation bar with a sparkline of the last minute, and a memory bar. On a GPU the memory
bar is split by owner — each rank's share (its process and children, from NVML) in the rank's colour,
other processes in grey — so "which rank uses how much" is visible at a glance.

:func:`devices_html` is a pure function of a snapshot (tested without a browser); :class:`DevicePanel`
is the widget, a single ``ipywidgets.HTML`` so one refresh is one message.
"""

from __future__ import annotations

import html

from ..gpu.telemetry import Snapshot
from . import text
from ..words import count

RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
OTHER_COLOR = "#b0b0b0"
STYLE = ("<style>.nbt-row{font:12px monospace;margin:2px 0;white-space:nowrap}"
         ".nbt-bar{display:inline-block;width:160px;height:10px;background:#eee;vertical-align:middle;"
         "margin:0 6px;position:relative;overflow:hidden}.nbt-seg{height:100%;float:left}"
         ".nbt-note{font:11px sans-serif;color:#777}</style>")


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def _bar(segments: list[tuple[float, str]], title: str = "") -> str:
    parts = "".join(f'<div class="nbt-seg" style="width:{min(max(f, 0.0), 1.0) * 100:.1f}%;background:{c}"></div>'
                    for f, c in segments if f and f > 0)
    return f'<span class="nbt-bar" title="{html.escape(title)}">{parts}</span>'


def _busy_color(value: float | None) -> str:
    if value is None:
        return OTHER_COLOR
    return "#2ca02c" if value < 70 else "#ff9f0e" if value < 95 else "#d62728"


def _gpu_rows(snap: Snapshot, sparks) -> list[str]:
    rows = []
    for gpu in snap.gpus:
        label = f"GPU {gpu.index}"
        busy_spark = text.sparkline(sparks.get(label, ([], []))[0])
        head = (f"<b>{label}</b> {html.escape(gpu.name)} · {text.NA if gpu.temperature is None else f'{gpu.temperature}°C'}"
                f" · {text.NA if gpu.power is None else f'{gpu.power:.0f}'}/"
                f"{text.NA if gpu.power_limit is None else f'{gpu.power_limit:.0f}'} W" + (" · MIG" if gpu.mig else ""))
        busy = (gpu.utilization or 0) / 100
        util = f"util {_bar([(busy, _busy_color(gpu.utilization))])}{text.percent(gpu.utilization):>4} {busy_spark}"
        segments, legend, owned = [], [], 0
        total = gpu.memory_total or 0
        for r in snap.ranks:
            if r.gpu_index == gpu.index and r.gpu_memory is None:  # unknown (see the notes): counted in the total
                legend.append(f'<span style="color:{rank_color(r.rank)}">■</span> rank {r.rank} {text.NA}')
            elif r.gpu_index == gpu.index and total:
                segments.append((r.gpu_memory / total, rank_color(r.rank)))
                legend.append(f'<span style="color:{rank_color(r.rank)}">■</span> rank {r.rank} {text.size(r.gpu_memory)}')
                owned += r.gpu_memory
        if gpu.memory_used is not None and total:
            segments.append(((gpu.memory_used - owned) / total, OTHER_COLOR))
        memory = (f"mem {_bar(segments)}{text.size(gpu.memory_used)} / {text.size(gpu.memory_total)}"
                  + (" · " + " ".join(legend) if legend else ""))
        rows.append(f'<div class="nbt-row">{head}</div><div class="nbt-row">&nbsp;&nbsp;{util}</div>'
                    f'<div class="nbt-row">&nbsp;&nbsp;{memory}</div>')
    return rows


def _cpu_rows(snap: Snapshot, sparks) -> list[str]:
    host = snap.host
    mem_fraction = host.memory_used / host.memory_total if host.memory_used is not None and host.memory_total else 0
    rows = [f'<div class="nbt-row"><b>machine</b> CPU {_bar([((host.cpu_percent or 0) / 100, _busy_color(host.cpu_percent))])}'
            f'{text.percent(host.cpu_percent):>4} {text.sparkline(sparks.get("CPU (machine)", ([], []))[0])}'
            f' · RAM {_bar([(mem_fraction, "#1f77b4")])}{text.size(host.memory_used)} / {text.size(host.memory_total)}'
            f' · {count("core", host.cpu_count)}</div>']
    for r in snap.ranks:
        share = (r.cpu_percent or 0) / (100 * host.cpu_count)  # the bar is the machine: every core = full
        rows.append(
            f'<div class="nbt-row"><span style="color:{rank_color(r.rank)}">■</span> rank {r.rank} CPU '
            f'{_bar([(share, rank_color(r.rank))], "scaled to all cores")}{text.percent(r.cpu_percent):>5} of a core '
            f'{text.sparkline(sparks.get(f"rank {r.rank}", ([], []))[0], top=100 * host.cpu_count)}'
            f' · RAM {text.size(r.rss)}' + ("" if r.alive else " · exited") + "</div>")
    return rows


def devices_html(snap: Snapshot | None, sparks: dict | None = None) -> str:
    if snap is None:
        return STYLE + '<div class="nbt-note">waiting for the first sample…</div>'
    sparks = sparks or {}
    rows = _gpu_rows(snap, sparks) if snap.gpus else _cpu_rows(snap, sparks)
    notes = list(snap.notes)
    if snap.nvml_error:
        notes.insert(0, f"No GPU telemetry: {snap.nvml_error}. Showing CPU and RAM per rank and for the machine.")
    notes_html = "".join(f'<div class="nbt-note">{html.escape(n)}</div>' for n in notes)
    return STYLE + "".join(rows) + notes_html


class DevicePanel:
    """An ``ipywidgets.HTML`` showing :func:`devices_html`; :meth:`update` sends only when it changed."""

    def __init__(self) -> None:
        import ipywidgets as W

        self.widget = W.HTML(devices_html(None))

    def update(self, snap: Snapshot | None, sparks: dict) -> None:
        self.widget.value = devices_html(snap, sparks)  # traitlets sends nothing when the text is equal
