"""The device panel: one row per GPU (or, without GPUs, the machine's CPU/RAM and each rank's CPU).

Each row is a utilisation bar with a sparkline of the last minute, and a memory bar. On a GPU the memory
bar is split by owner — each rank's share (its process and children, from NVML) in the rank's colour,
other processes in grey — so "which rank uses how much" is visible at a glance.

A ``--nodes`` run shows its machines instead, grouped by node, from their last heartbeats
(:class:`~nbtrain.kernel.observers.events.NodeInfo`): each node's state, CPU and RAM, then each of its GPUs drawn
as this machine's are (one renderer, :func:`_gpu_row`): name, temperature and power, load, memory, the health line
(written here from the structured health the heartbeat carried) and its MIG instances. Who holds a node GPU's
memory is not sent (PIDs mean nothing off their machine), so its memory bar is all grey (not a rank's).

:func:`devices_html` is a pure function of a snapshot (tested without a browser); :class:`DevicePanel`
is the widget, a single ``ipywidgets.HTML`` so one refresh is one message.
"""

from __future__ import annotations

import html

from ...gpu.health import describe as describe_health
from ...gpu.telemetry import Snapshot, gpu_notes
from ...common.words import count
from . import text, theme
from .replica_badges import badges_html
from .telemetry_series import MACHINE, DeviceKey, panel_loads

_NO_SPARK: tuple[list, list] = ([], [])
# NVML's utilization, said for what it is; what the SMs did is GPM's (the health line: "SM active 62 %, …")
UTIL_MEANS = "share of the time a kernel was running (NVML), however few SMs it used"


def _bar(segments: list[tuple[float, str]], title: str = "") -> str:
    parts = "".join(f'<div class="nbt-seg" style="width:{min(max(f, 0.0), 1.0) * 100:.1f}%;background:{c}"></div>'
                    for f, c in segments if f and f > 0)
    return f'<span class="nbt-bar" title="{html.escape(title)}">{parts}</span>'


def _gpu_rows(snap: Snapshot, sparks) -> list[str]:
    return [_gpu_row(gpu, snap.ranks, text.sparkline(sparks.get(DeviceKey.gpu(gpu.index), _NO_SPARK)[0]),
                     describe_health(gpu.health)) for gpu in snap.gpus]


def _gpu_row(gpu, ranks, busy_spark: str, health: str, pad: str = "") -> str:
    """One GPU (a :class:`~nbtrain.gpu.devices.GpuStatus`, of this machine or as a node's heartbeat carried it):
    name, temperature, power; load; memory split by the ``ranks`` on it (the rest in grey); its health line; its MIG
    instances. ``pad`` indents every row."""
    head = (f"<b>{DeviceKey.gpu(gpu.index).label}</b> {html.escape(gpu.name)} · "
            f"{text.NA if gpu.temperature is None else f'{gpu.temperature}°C'}"
            f" · {text.NA if gpu.power is None else f'{gpu.power:.0f}'}/"
            f"{text.NA if gpu.power_limit is None else f'{gpu.power_limit:.0f}'} W" + (" · MIG" if gpu.mig else ""))
    busy = (gpu.utilization or 0) / 100
    util = (f"util {_bar([(busy, theme.busy_color(gpu.utilization))], UTIL_MEANS)}{text.percent(gpu.utilization):>4} "
            f"{busy_spark}")
    segments, legend, owned = [], [], 0
    total = gpu.memory_total or 0
    for r in ranks:
        if r.gpu_index != gpu.index:
            continue
        if r.gpu_memory is None:  # unknown (see the notes): counted in the total
            legend.append(f'{theme.swatch(r.rank)} rank {r.rank} {text.NA}')
        elif total:
            segments.append((r.gpu_memory / total, theme.rank_color(r.rank)))
            legend.append(f'{theme.swatch(r.rank)} rank {r.rank} {text.size(r.gpu_memory)}')
            owned += r.gpu_memory
    if gpu.memory_used is not None and total:
        segments.append(((gpu.memory_used - owned) / total, theme.OTHER_COLOR))
    memory = (f"mem {_bar(segments)}{text.size(gpu.memory_used)} / {text.size(gpu.memory_total)}"
              + (" · " + " ".join(legend) if legend else ""))
    rows = [head, f"&nbsp;&nbsp;{util}", f"&nbsp;&nbsp;{memory}"]
    if health:
        rows.append(f"&nbsp;&nbsp;{html.escape(health)}")
    return ("".join(f'<div class="nbt-row">{pad}{row}</div>' for row in rows)
            + "".join(_mig_row(device, ranks, pad) for device in gpu.mig_devices))


def _mig_row(device, ranks, pad: str = "") -> str:
    """A MIG instance as a device of its own: its UUID, its memory, the ranks whose processes run on it."""
    share = device.memory_used / device.memory_total if device.memory_used is not None and device.memory_total else 0
    on_it = " ".join(f"{theme.swatch(r.rank)} rank {r.rank}" for r in ranks if r.mig_uuid == device.uuid)
    return (f'<div class="nbt-row">{pad}&nbsp;&nbsp;MIG {device.index} {html.escape(device.uuid)} · mem '
            f'{_bar([(share, theme.ACCENT)])}{text.size(device.memory_used)} / {text.size(device.memory_total)}'
            + (f" · {on_it}" if on_it else "") + "</div>")


def _cpu_rows(snap: Snapshot, sparks) -> list[str]:
    """The machine's and each rank's CPU in % of one core (the load panels' and the summary's unit: 2 cores fully
    busy read 200%), each bar scaled to all of the machine's cores."""
    host = snap.host
    cores = 100 * host.cpu_count
    mem_fraction = host.memory_used / host.memory_total if host.memory_used is not None and host.memory_total else 0
    machine_cpu = panel_loads(snap)[MACHINE][0]
    rows = [_parts(f'<b>machine</b> CPU '
                   f'{_bar([((host.cpu_percent or 0) / 100, theme.busy_color(host.cpu_percent))], "scaled to all cores")}'
                   f'{text.percent(machine_cpu):>5} of a core {_spark(sparks.get(MACHINE, _NO_SPARK)[0], cores)}',
                   f'RAM {_bar([(mem_fraction, theme.ACCENT)])}{text.size(host.memory_used)} / {text.size(host.memory_total)}',
                   count("core", host.cpu_count))]
    for r in snap.ranks:
        share = (r.cpu_percent or 0) / cores  # the bar is the machine: every core = full
        rows.append(_parts(
            f'{theme.swatch(r.rank)} rank {r.rank} CPU '
            f'{_bar([(share, theme.rank_color(r.rank))], "scaled to all cores")}{text.percent(r.cpu_percent):>5} of a core '
            f'{_spark(sparks.get(DeviceKey.rank(r.rank), _NO_SPARK)[0], cores)}',
            f'RAM {text.size(r.rss)}', *(() if r.alive else ("exited",))))
    return rows


def _parts(*parts: str) -> str:
    """One row of `` · ``-separated parts that wraps between parts, never inside one (a narrow notebook)."""
    return '<div class="nbt-row nbt-wrap">' + " · ".join(f'<span class="nbt-part">{part}</span>' for part in parts) + "</div>"


def _spark(values, top: float) -> str:
    """A device's last minute as a sparkline, with its scale on hover."""
    return f'<span style="color:{theme.MUTED}" title="the last minute, 0 to {top:.0f}%">{text.sparkline(values, top)}</span>'


def _node_rows(nodes) -> list[str]:
    """A --nodes run's GPUs grouped by node, from the heartbeats."""
    rows = []
    for node in nodes:
        rows.append(f'<div class="nbt-row"><b>node {html.escape(node.name)}</b> {html.escape(node.host)} · '
                    f'{html.escape(node.state)} · CPU {text.percent(node.cpu_percent)} · RAM {text.percent(node.ram_percent)}'
                    + ("" if node.gpus else " · no GPU") + "</div>")
        rows.extend(_gpu_row(gpu.status, (), "", gpu.health_text, pad="&nbsp;&nbsp;") for gpu in node.gpus)
        rows.extend(f'<div class="nbt-note">node {html.escape(node.name)}, {html.escape(note)}</div>'
                    for note in gpu_notes([gpu.status for gpu in node.gpus]))
    return rows


def devices_html(snap: Snapshot | None, sparks: dict[DeviceKey, tuple[list, list]] | None = None, nodes=()) -> str:
    """The panel from a snapshot of this machine, or, for a --nodes run, from its ``nodes``' heartbeats."""
    if nodes:
        return theme.STYLE + "".join(_node_rows(nodes))
    if snap is None:
        return theme.STYLE + '<div class="nbt-note">waiting for the first sample…</div>'
    sparks = sparks or {}
    rows = _gpu_rows(snap, sparks) if snap.gpus else _cpu_rows(snap, sparks)
    notes = list(snap.notes)
    if snap.nvml_error:
        notes.insert(0, f"{text.no_gpu(snap.nvml_error)}: showing CPU and RAM per rank and for the machine.")
    notes_html = "".join(f'<div class="nbt-note">{html.escape(n)}</div>' for n in notes)
    return theme.STYLE + "".join(rows) + notes_html


class DevicePanel:
    """An ``ipywidgets.HTML`` showing :func:`devices_html`; :meth:`update` redraws when a sample arrived."""

    def __init__(self) -> None:
        import ipywidgets as W

        self.widget = W.HTML(devices_html(None))
        self._shown_version: tuple = ()

    def update(self, model) -> None:
        """``model``: a :class:`~nbtrain.kernel.dashboard.model.RunModel` (the run's, or the ``%gpus`` monitor's)."""
        telemetry = model.telemetry
        version = (telemetry.version, model.placement_version)
        if version != self._shown_version:
            self._shown_version = version
            self.widget.value = (badges_html(model.replica_groups, model.store)  # --ft: each replica group's state
                                 + devices_html(telemetry.latest, telemetry.sparks(), model.nodes))  # equal: nothing sent
