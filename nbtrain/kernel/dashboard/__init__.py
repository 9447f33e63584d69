"""The live dashboard under a ``%%distributed`` cell, and ``%gpus``.

While a cell runs, the dashboard shows under it, updated in place (never cleared and redrawn):

* a progress line — elapsed time, rank 0's step, steps per second and, when the cell logged
  ``nbtrain.log(total_steps=N)`` once, ``step / N`` and the time left (ETA);
* a table of the ranks — pid, device, memory (GPU memory of the rank's process and its children, or
  RAM without GPUs), CPU %, step, steps per second;
* a row per GPU — utilisation with a one-minute sparkline, memory split by rank, temperature, power.
  Without an NVIDIA driver (CI, laptops) the same panel shows the machine's CPU and RAM and each rank's
  CPU, with one line saying why there are no GPU numbers;
* a chart of every series logged with ``nbtrain.log`` — ``loss`` and ``val_loss`` (or ``train_acc`` and
  ``val_acc``…) share a panel — drawn in the browser (uPlot, bundled into the wheel) from the new points
  the kernel streams: raw with min–max bands and smoothed (a slider), linear or log, by step or wall
  time, hover to read values, drag to zoom; every control works while the cell runs.

When the run ends the widget is replaced by a static PNG of the curves and the devices' load over the
run, followed by a one-paragraph summary: ordinary outputs that stay in the saved notebook.

Where it appears:

* JupyterLab 4, Notebook 7, VS Code: the widget (ipywidgets);
* a plain IPython terminal: a status line every 10 s and the summary at the end;
* ``%%distributed ... --no-dashboard``: nothing. ``NBTRAIN_DASHBOARD=widget|text|off`` forces a
  choice for every cell (``text`` suits front ends without widget support).

Cost: telemetry is sampled on a background thread once a second (:func:`configure`), the tables
change at most four times a second, the chart gets at most two messages a second with only the points
logged since the last one (the kernel draws nothing while the run lasts; the final PNG is drawn once),
and the series kept for drawing are bounded (at most 1000 min–max buckets each), whatever the number of
steps. The full-resolution values are in the
notebook's ``history``.

``%gpus`` shows the GPU (or CPU/RAM) panel for the machine, live, at any time; ``%gpus --once``
prints a table. The data behind all of it is :mod:`nbtrain.gpu.telemetry`, usable without any UI.

Importing this package imports neither ipywidgets nor matplotlib and starts nothing.
"""

from __future__ import annotations

import os

from ...common import words
from .series import DEFAULT_SMOOTHING
from .threads import DEFAULT_INTERVAL_S, check_interval

MODES = ("auto", "widget", "text", "off")
_settings = {"interval": DEFAULT_INTERVAL_S, "text_every": 10.0, "smoothing": DEFAULT_SMOOTHING, "compare": 3}
MAX_COMPARE = 10  # the runs the kernel keeps series of (nbtrain.kernel.observers.runlog.KEEP_SERIES)


def configure(interval: float | None = None, text_every: float | None = None, smoothing: float | None = None,
              compare: int | None = None) -> dict:
    """Change the dashboard of the next cells: ``interval`` between telemetry samples in seconds (0.25–5,
    default 1); ``text_every``, how often the terminal status line is printed (seconds, default 10);
    ``smoothing``, the weight of the moving average drawn over each curve (0 = none, up to 0.99;
    default 0.6): where the live chart's slider starts, and what the final figure uses; ``compare``, how many
    of the kernel's last runs the live chart draws beside each run (0–10, default 3). Returns the settings now in force."""
    if compare is not None:
        if not isinstance(compare, int) or isinstance(compare, bool) or not 0 <= compare <= MAX_COMPARE:
            raise ValueError(f"compare is a number of earlier runs from 0 to {MAX_COMPARE} (got {compare!r})")
        _settings["compare"] = compare
    if interval is not None:
        _settings["interval"] = check_interval(interval)
    if smoothing is not None:
        if not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise ValueError(f"smoothing is a weight from 0 (none) to 0.99 (got {smoothing!r})")
        _settings["smoothing"] = float(smoothing)
    if text_every is not None:
        if not text_every > 0:
            raise ValueError(f"text_every is a positive number of seconds (got {text_every!r})")
        _settings["text_every"] = float(text_every)
    return dict(_settings)


def dashboard_mode(shell, environ=os.environ) -> str:
    """``"widget"``, ``"text"`` or ``"off"`` for ``shell``, honouring ``NBTRAIN_DASHBOARD``."""
    mode = environ.get("NBTRAIN_DASHBOARD", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"NBTRAIN_DASHBOARD is {mode!r}; use one of {', '.join(MODES)} (or unset it).")
    if mode != "auto":
        return mode
    # A kernel (ipykernel's shell has .kernel) talks to a front end that can show widgets; a terminal cannot.
    return "widget" if getattr(shell, "kernel", None) is not None else "text"


def observer_for(shell, enabled: bool = True):
    """The observer that shows the dashboard for one run in ``shell``, or ``None`` when it is off.

    Pass it to :func:`nbtrain.kernel.lifecycle.entry.run_source` as ``observers=[...]``; create one per run.
    """
    if not enabled:
        return None
    mode = dashboard_mode(shell)
    if mode == "off":
        return None
    from .observer import DashboardObserver

    if mode == "widget":
        from .widget import DeferredDashboard

        return DashboardObserver(lambda model: DeferredDashboard(model, _settings["smoothing"], int(_settings["compare"])),
                                 interval=_settings["interval"])
    from .text_status import TextStatus

    return DashboardObserver(lambda model: TextStatus(model, every=_settings["text_every"]),
                             interval=_settings["interval"])


def show_gpus(shell=None, *, once: bool = False, interval: float | None = None, duration: float | None = None,
              stop: bool = False):
    """What ``%gpus`` does: the live monitor (widget front ends) or the one-shot table (else, or ``once``).

    Returns the :class:`~nbtrain.kernel.dashboard.monitor.GpuMonitor` when one was started, else ``None``.
    """
    from . import monitor

    if stop:
        stopped = monitor.stop_all()
        print(f"nbtrain: stopped {words.count('live GPU monitor', stopped)}.")
        return None
    interval = check_interval(interval if interval is not None else _settings["interval"])
    if once or dashboard_mode(shell) != "widget":
        print(monitor.once())
        return None
    live = monitor.GpuMonitor(interval, monitor.DEFAULT_DURATION_S if duration is None else duration)
    return live.show()


__all__ = ["observer_for", "configure", "show_gpus", "dashboard_mode"]
