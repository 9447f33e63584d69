"""The telemetry samples of a run, kept short for the live bars and bounded for the final figure.

Each sample (:class:`~nbtrain.gpu.telemetry.Snapshot`) is reduced to a few numbers per *device*: per
GPU its utilisation % and memory %, or — without GPUs — per rank its CPU % (100 = one core) and the
machine's CPU % and memory %. For every device two histories are kept: the last
:data:`SPARK_POINTS` samples (the sparkline beside each bar) and a
:class:`~nbtrain.dashboard.series.BoundedSeries` over the whole run (the final figure's timeline).
"""

from __future__ import annotations

import threading
from collections import deque

from ..gpu.telemetry import Snapshot
from .series import BoundedSeries

SPARK_POINTS = 60
TIMELINE_CAPACITY = 600


def device_loads(snap: Snapshot) -> dict[str, tuple[float | None, float | None]]:
    """``{device label: (busy %, memory %)}`` for one snapshot; the labels are what the views show."""
    if snap.gpus:
        return {
            f"GPU {g.index}": (g.utilization, None if g.memory_fraction is None else 100 * g.memory_fraction)
            for g in snap.gpus
        }
    loads: dict[str, tuple[float | None, float | None]] = {}
    host = snap.host
    host_mem = 100 * host.memory_used / host.memory_total if host.memory_used is not None and host.memory_total else None
    loads["CPU (machine)"] = (host.cpu_percent, host_mem)
    for r in snap.ranks:
        rank_mem = 100 * r.rss / host.memory_total if r.rss is not None and host.memory_total else None
        loads[f"rank {r.rank}"] = (r.cpu_percent, rank_mem)
    return loads


class TelemetryHistory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latest: Snapshot | None = None
        self.started: float | None = None
        self.version = 0
        self._spark: dict[str, tuple[deque, deque]] = {}
        self._timeline: dict[str, tuple[BoundedSeries, BoundedSeries]] = {}

    def add(self, snap: Snapshot) -> None:
        with self._lock:
            self.latest = snap
            self.started = self.started if self.started is not None else snap.time
            elapsed = snap.time - self.started
            for label, (busy, memory) in device_loads(snap).items():
                spark = self._spark.setdefault(label, (deque(maxlen=SPARK_POINTS), deque(maxlen=SPARK_POINTS)))
                timeline = self._timeline.setdefault(
                    label, (BoundedSeries(TIMELINE_CAPACITY), BoundedSeries(TIMELINE_CAPACITY)))
                for values, series, value in ((spark[0], timeline[0], busy), (spark[1], timeline[1], memory)):
                    values.append(value)
                    if value is not None:
                        series.add(elapsed, value)
            self.version += 1

    def sparks(self) -> dict[str, tuple[list, list]]:
        with self._lock:
            return {label: (list(busy), list(memory)) for label, (busy, memory) in self._spark.items()}

    def timelines(self) -> dict[str, tuple[tuple[list, list], tuple[list, list]]]:
        """Per device: ((seconds, busy %), (seconds, memory %)) over the whole run, downsampled."""
        with self._lock:
            return {label: ((list(b.steps), list(b.means)), (list(m.steps), list(m.means)))
                    for label, (b, m) in self._timeline.items()}

    def peaks(self) -> dict[str, tuple[float | None, float | None]]:
        """Per device: (mean busy %, peak memory %) over the run, for the summary."""
        with self._lock:
            out = {}
            for label, (busy, memory) in self._timeline.items():
                mean_busy = sum(m * c for m, c in zip(busy.means, busy.counts)) / busy.count if busy.count else None
                out[label] = (mean_busy, memory.finite_max)
            return out
