"""``%gpus``: the machine's GPUs (or CPU and RAM) anywhere, live or as a one-shot table.

* :func:`gpus_table` — the table ``%gpus --once`` prints: per GPU utilisation, memory, temperature,
  power and the processes holding memory on it; without an NVIDIA driver, the machine's CPU and RAM
  and one line saying why there are no GPU numbers.
* :class:`GpuMonitor` — the live widget ``%gpus`` shows: the device panel of the run dashboard, fed by
  a telemetry sampler, updated in place, the chart's load panels below it (each GPU's utilisation and
  memory since the monitor started, drawn in the browser), and a Stop button. It stops by itself after ``duration``
  seconds (10 minutes unless told otherwise; 0 means until stopped) so a forgotten monitor does not
  sample for the rest of the session; ``%gpus --stop`` stops every live monitor, and a new ``%gpus``
  stops the previous one. When it stops, its output is replaced in place (``update_display``) by
  :class:`StaticDevices` — the last sample as HTML, and :func:`gpus_table` as text — so a saved
  notebook holds a table, not a widget that needs a live kernel.
"""

from __future__ import annotations

import threading
import time

import psutil

from ...gpu.devices import DeviceReader
from ...gpu.health import describe as describe_health
from ...gpu.telemetry import Snapshot, Telemetry
from ...common.words import count
from . import text, theme
from .chart import ChartPanel
from .devices_view import DevicePanel, devices_html
from .model import RunModel
from .threads import DEFAULT_INTERVAL_S, Sampler, Ticker, check_interval

DEFAULT_DURATION_S = 600.0
_live: list[GpuMonitor] = []
_live_lock = threading.Lock()


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"  # another PID namespace (container), or already gone


def gpus_table(snap: Snapshot) -> str:
    """A plain-text table of one snapshot (what ``%gpus --once`` prints)."""
    lines = []
    if snap.gpus:
        lines.append(f"{'GPU':<4}{'name':<28}{'util':>6}{'memory':>24}{'temp':>7}{'power':>16}")
        for g in snap.gpus:
            memory = f"{text.size(g.memory_used)} / {text.size(g.memory_total)}"
            temp = text.NA if g.temperature is None else f"{g.temperature}°C"
            power = (f"{text.NA if g.power is None else f'{g.power:.0f}'} / "
                     f"{text.NA if g.power_limit is None else f'{g.power_limit:.0f}'} W")
            lines.append(f"{g.index:<4}{g.name[:27]:<28}{text.percent(g.utilization):>6}{memory:>24}{temp:>7}{power:>16}")
            if g.health is not None:
                lines.append(f"      {describe_health(g.health)}")
            if g.processes is None:
                lines.append("      processes: N/A (not reported by the driver)")
            elif g.processes_hidden:
                lines.append("      processes: N/A (the driver lists none; memory above is what is in use)")
            for p in g.processes or ():
                lines.append(f"      pid {p.pid:<8} {_process_name(p.pid):<20} {text.size(p.used_memory)}")
    else:
        host = snap.host
        lines.append(f"machine: CPU {text.percent(host.cpu_percent)} of {count('core', host.cpu_count)} · "
                     f"RAM {text.size(host.memory_used)} / {text.size(host.memory_total)}")
    if snap.nvml_error:
        lines.append(f"{text.no_gpu(snap.nvml_error)}.")
    lines += list(snap.notes)
    return "\n".join(lines)


def once(interval: float = 0.2) -> str:
    """Sample twice ``interval`` apart (CPU % needs two readings) and return :func:`gpus_table`."""
    telemetry = Telemetry(reader=DeviceReader(pcie_throughput=True))  # one table: the slow PCIe counter is affordable
    telemetry.snapshot()
    time.sleep(interval)
    return gpus_table(telemetry.snapshot())


class StaticDevices:
    """What a stopped monitor leaves in the notebook: its last sample, as HTML and as a text table."""

    def __init__(self, snap: Snapshot | None, sparks: dict) -> None:
        self.snap, self.sparks = snap, sparks

    def _repr_mimebundle_(self, include=None, exclude=None):
        when = "" if self.snap is None else time.strftime(" at %H:%M:%S", time.localtime(self.snap.time))
        head = f"%gpus: stopped{when}; the last sample:"
        plain = gpus_table(self.snap) if self.snap is not None else "no sample was taken"
        note = f"<div class='nbt-note'>{head}</div>"
        return {"text/html": note + devices_html(self.snap, self.sparks), "text/plain": f"{head}\n{plain}"}


class GpuMonitor:
    def __init__(self, interval: float = DEFAULT_INTERVAL_S, duration: float = DEFAULT_DURATION_S) -> None:
        import ipywidgets as W

        if duration < 0:
            raise ValueError(f"the monitor's duration is 0 (until stopped) or a number of seconds (got {duration:g})")
        self.interval = check_interval(interval)
        self.duration = duration
        self.model = RunModel(telemetry_source=Telemetry())  # the machine's samples; no run, no ranks
        self.panel = DevicePanel()
        self.chart = ChartPanel(None, telemetry=self.model.telemetry)  # the load panels alone: no curves
        self.status = W.HTML()
        self.stop_button = W.Button(description="Stop", layout=W.Layout(width="70px"))
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = W.VBox([W.HBox([self.stop_button, self.status]), self.panel.widget, self.chart.widget])
        self.sampler = Sampler(self.model.telemetry_source, self.model.add_sample, self.interval)
        self.ticker = Ticker(self._tick, 0.25, "nbtrain-gpus")
        self.started = time.monotonic()
        self.stopped = False
        self.handle = None  # the display handle, when shown with a display_id (see show())

    def show(self) -> GpuMonitor:
        """Display the live widget under the cell and start sampling."""
        from IPython.display import display

        self.handle = display(self.widget, display_id=True)
        return self.start()

    def start(self) -> GpuMonitor:
        with _live_lock:
            previous = list(_live)
            _live.append(self)
        for monitor in previous:
            monitor.stop()
        self._set_status()
        self.sampler.start()
        self.ticker.start()
        return self

    def _set_status(self) -> None:
        if self.stopped:
            self.status.value = f"<span style='{theme.STATUS_STYLE}'>stopped</span>"
            return
        until = "until stopped" if not self.duration else f"for {text.duration(self.duration)}"
        self.status.value = (f"<span style='{theme.STATUS_STYLE}'>live · a sample every "
                             f"{self.interval:g} s · {until}</span>")

    def _tick(self) -> None:
        if self.duration and time.monotonic() - self.started > self.duration:
            self.stop(join=False)
            return
        self.panel.update(self.model)
        self.chart.update()

    def stop(self, join: bool = True) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.sampler.stop(join=join)
        self.ticker.stop(join=join)
        self.stop_button.disabled = True
        self._set_status()
        with _live_lock:
            if self in _live:
                _live.remove(self)
        if self.handle is not None:  # leave a table in the saved notebook, then free the widgets' comms
            from .widget import close_tree

            telemetry = self.model.telemetry
            self.handle.update(StaticDevices(telemetry.latest, telemetry.sparks()))
            close_tree(self.widget)


def stop_all() -> int:
    """Stop every live ``%gpus`` monitor; returns how many were running."""
    with _live_lock:
        running = list(_live)
    for monitor in running:
        monitor.stop()
    return len(running)
