"""The dashboard without a widget front end: a status line every few seconds, and the summary at the end.

Used in a plain IPython terminal (and wherever ``NBTRAIN_DASHBOARD=text``). The line is printed as a
whole line — never redrawn with carriage returns — because the ranks' own output is printed to the
same terminal at the same time::

    nbtrain ▸ elapsed 1 min 5 s · step 640 / 1000 (64%) · 9.8 steps/s · ETA 37 s · loss 0.412 · GPU 0 97% 31.2 GiB/80.0 GiB
"""

from __future__ import annotations

import sys
import time

from ..observers.events import RunState
from . import text
from .final import summary_paragraph
from .model import RunModel
from .replica_badges import groups_words
from .run_view import progress_text
from .telemetry_series import MACHINE, panel_loads

DEFAULT_EVERY_S = 10.0


def status_line(model: RunModel) -> str:
    parts = [progress_text(model.progress(), model.status_text(), model.info.metering if model.info else None),
             *model.setup_words()]
    for name in model.store.names[:3]:
        series = model.store.series(name)
        if series is not None and series.last_value is not None:
            parts.append(f"{name} {text.number(series.last_value)}")
    if model.replica_groups:
        parts.append(groups_words(model.replica_groups))
    snap = model.telemetry.latest
    if snap is not None and snap.gpus:
        parts += [f"GPU {g.index} {text.percent(g.utilization)} {text.size(g.memory_used)}/{text.size(g.memory_total)}"
                  for g in snap.gpus]
    elif snap is not None:
        host = snap.host
        parts.append(f"CPU {text.percent(panel_loads(snap)[MACHINE][0])} of a core"
                     f" RAM {text.size(host.memory_used)}/{text.size(host.memory_total)}")
    return "nbtrain ▸ " + " · ".join(parts)


class TextStatus:
    """Prints :func:`status_line` every ``every`` seconds (from the ticker thread) and a summary at the end."""

    def __init__(self, model: RunModel, every: float = DEFAULT_EVERY_S, stream=None) -> None:
        self.model = model
        self.every = every
        self.stream = stream
        self._next_at = time.monotonic() + every
        self.lines = 0

    def _write(self, line: str) -> None:
        stream = self.stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()
        self.lines += 1

    def show(self) -> None:
        pass  # the first line comes after ``every`` seconds: short cells print nothing but the summary

    def tick(self) -> None:
        if time.monotonic() >= self._next_at:
            self._next_at = time.monotonic() + self.every
            self._write(status_line(self.model))

    def finish(self) -> None:
        model = self.model
        self._write("nbtrain ▸ " + summary_paragraph(model.store, model.telemetry, model.status or RunState.FINISHED, model.detail,
                                                     len(model.ranks), model.where, model.progress(), model.cold_start))
