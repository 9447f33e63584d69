"""What the live chart's load panels are sent: the machine's load over the run, only the samples it lacks.

The chart (:mod:`~nbtrain.kernel.dashboard.chart`) draws two panels beside the logged curves, x = seconds since
the run's first telemetry sample:

* with GPUs: **GPU utilisation %** and **GPU memory %** (of each board's memory), a line per GPU;
* without: **CPU, % of one core** (a line per rank's process tree, and the machine's total: 2 cores
  fully busy read 200) and **RAM, % of the machine** (per rank, and the machine's used memory).

Units, titles and the order of the lines are :mod:`~nbtrain.kernel.dashboard.telemetry_series`'s, and each
device's colour and dash :func:`~nbtrain.kernel.dashboard.theme.device_style`: the final figure draws with the
same, so the picture left in the notebook reads as the live chart did.

The device panel's HTML rows (bars and one-minute sparklines) stay as they are; these panels add the
whole run's history, zoomable and readable by hovering. :meth:`LoadFeed.poll` returns the samples that
arrived since its last poll, as float64 columns (``NaN`` where a value is not known, e.g. a GPU whose
driver does not report utilisation); the browser appends them and thins its copy past a bound, so neither
side's memory grows with the run's length. A view drawn while the run is under way (the notebook reopened,
a second view of the output) starts its load panels from the next samples, at their true x: the kernel
keeps only the last minute of samples (its main thread runs the cell, so it cannot answer a view's request
for the rest); the logged curves are whole in every view. This module knows nothing of widgets.
"""

from __future__ import annotations

from .chart_feed import pack
from .telemetry_series import (
    CPU_TITLES, GPU_TITLES, TIME_AXIS, TelemetrySeries, panel_loads, panel_order, panel_titles
)
from .theme import device_style

__all__ = ["CPU_TITLES", "GPU_TITLES", "LoadFeed"]


class LoadFeed:
    def __init__(self, telemetry: TelemetrySeries) -> None:
        self.telemetry = telemetry
        self._seen = 0  # the telemetry version of the last sample sent

    def poll(self) -> dict | None:
        """``{"titles", "axis", "devices", "styles", "t", "busy", "memory"}`` for the samples since the last poll,
        or ``None`` (``axis``: the x axis' label).

        ``devices`` are labels (``GPU 0``, ``rank 1``, ``CPU (machine)``), ``memory_labels`` the memory panel's
        where it names a device otherwise (``RAM (machine)``); ``styles`` maps each to its line's
        :func:`~nbtrain.kernel.dashboard.theme.device_style`; ``busy`` and ``memory`` map each to a column as long as
        ``t``. A device missing from a sample (a rank not started yet) reads NaN there.
        """
        samples = self.telemetry.samples_since(self._seen)
        if not samples:
            return None
        self._seen = samples[-1][0]
        loads = [panel_loads(snap) for _, _, snap in samples]
        keys = sorted({key for sample in loads for key in sample}, key=panel_order)
        nan = float("nan")
        busy, memory = {}, {}
        for key in keys:
            values = [sample.get(key, (None, None)) for sample in loads]
            busy[key.label] = pack(nan if b is None else b for b, _ in values)
            memory[key.label] = pack(nan if m is None else m for _, m in values)
        return {"titles": panel_titles(samples[-1][2]), "axis": TIME_AXIS, "devices": [key.label for key in keys],
                "memory_labels": {key.label: key.memory_label for key in keys if key.memory_label != key.label},
                "styles": {key.label: device_style(key) for key in keys},
                "t": pack(elapsed for _, elapsed, _ in samples), "busy": busy, "memory": memory}
