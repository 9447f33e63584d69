"""The telemetry samples of a run over time, kept short for the live bars and bounded for the final figure.

Each sample (:class:`~nbtrain.gpu.telemetry.Snapshot`) is reduced to a few numbers per *device*: per
GPU its utilisation % and memory %, or — without GPUs — per rank its CPU % (100 = one core) and the
machine's CPU % and memory %. A device is named by a :class:`DeviceKey` (GPU *i*, the machine, rank
*r*), never by parsing its label. For every device two series are kept: the last
:data:`SPARK_POINTS` samples (the sparkline beside each bar) and a
:class:`~nbtrain.kernel.dashboard.series.BoundedSeries` over the whole run (the final figure's timeline).

The load panels — the live chart's (:mod:`~nbtrain.kernel.dashboard.load_feed`) and the final figure's — draw in
one set of units, defined here once (:func:`panel_loads`, :func:`panel_titles`): GPU utilisation and
memory %, or without GPUs the CPU in % of one core for the ranks and the machine alike (2 cores fully
busy read 200) and the RAM in % of the machine. The timeline and the sparklines are kept in these units, and
the device panel's rows say them too.

(``history`` is the logged metrics' word in nbtrain — the notebook's ``history`` — so this is not one.)
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from dataclasses import dataclass

from ...gpu.telemetry import Snapshot
from .series import BoundedSeries

SPARK_POINTS = 60
TIMELINE_CAPACITY = 600


class DeviceKind(enum.Enum):
    GPU = "gpu"
    MACHINE = "machine"  # the whole machine's CPU and RAM (without GPUs)
    RANK = "rank"  # one rank's process tree: CPU per core, RAM as a share of the machine's (without GPUs)


@dataclass(frozen=True)
class DeviceKey:
    kind: DeviceKind
    index: int | None = None  # the GPU's NVML index, or the rank; None for the machine

    @classmethod
    def gpu(cls, index: int) -> DeviceKey:
        return cls(DeviceKind.GPU, index)

    @classmethod
    def rank(cls, rank: int) -> DeviceKey:
        return cls(DeviceKind.RANK, rank)

    @property
    def label(self) -> str:
        """What the views call it: ``GPU 0``, ``CPU (machine)``, ``rank 1``."""
        if self.kind is DeviceKind.GPU:
            return f"GPU {self.index}"
        if self.kind is DeviceKind.RANK:
            return f"rank {self.index}"
        return "CPU (machine)"

    @property
    def memory_label(self) -> str:
        """Its name in the memory panel: the machine's line there is its RAM (``RAM (machine)``)."""
        return "RAM (machine)" if self.kind is DeviceKind.MACHINE else self.label

    def __str__(self) -> str:
        return self.label


MACHINE = DeviceKey(DeviceKind.MACHINE)
Loads = dict[DeviceKey, tuple[float | None, float | None]]


def device_loads(snap: Snapshot) -> Loads:
    """``{device: (busy %, memory %)}`` for one snapshot."""
    if snap.gpus:
        return {
            DeviceKey.gpu(g.index): (g.utilization, None if g.memory_fraction is None else 100 * g.memory_fraction)
            for g in snap.gpus
        }
    loads: Loads = {}
    host = snap.host
    host_mem = 100 * host.memory_used / host.memory_total if host.memory_used is not None and host.memory_total else None
    loads[MACHINE] = (host.cpu_percent, host_mem)
    for r in snap.ranks:
        rank_mem = 100 * r.rss / host.memory_total if r.rss is not None and host.memory_total else None
        loads[DeviceKey.rank(r.rank)] = (r.cpu_percent, rank_mem)
    return loads


GPU_TITLES = ("GPU utilisation %", "GPU memory %")
# The load panels' x axis, live and in the final picture: seconds since the run's (or %gpus') first sample. "The
# start", not "the first sample": a view opened mid-run starts at its own first one (12 s, say). Short enough for
# the narrowest panel (240 px).
TIME_AXIS = "seconds since the start"
CPU_TITLES = ("CPU, % of one core", "RAM, % of the machine")


def panel_loads(snap: Snapshot) -> Loads:
    """:func:`device_loads` in the load panels' units: the machine's CPU counted in cores, as the ranks'."""
    loads = device_loads(snap)
    if MACHINE in loads:
        busy, memory = loads[MACHINE]
        loads[MACHINE] = (None if busy is None else busy * snap.host.cpu_count, memory)
    return loads


def panel_titles(snap: Snapshot | None) -> tuple[str, str]:
    return GPU_TITLES if snap is not None and snap.gpus else CPU_TITLES


def panel_order(key: DeviceKey) -> tuple[int, int]:
    """Where a device's line is listed and drawn: GPUs or ranks by number, the machine last."""
    return (1 if key == MACHINE else 0, key.index or 0)


class TelemetrySeries:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latest: Snapshot | None = None
        self.started: float | None = None
        self.version = 0
        self._spark: dict[DeviceKey, tuple[deque, deque]] = {}
        self._timeline: dict[DeviceKey, tuple[BoundedSeries, BoundedSeries]] = {}
        self._recent: deque[tuple[int, float, Snapshot]] = deque(maxlen=SPARK_POINTS)  # (version, elapsed, sample)

    def add(self, snap: Snapshot) -> None:
        with self._lock:
            self.latest = snap
            self.started = self.started if self.started is not None else snap.time
            elapsed = snap.time - self.started
            for key, loads in panel_loads(snap).items():
                spark = self._spark.setdefault(key, (deque(maxlen=SPARK_POINTS), deque(maxlen=SPARK_POINTS)))
                spark[0].append(loads[0])
                spark[1].append(loads[1])
                timeline = self._timeline.setdefault(
                    key, (BoundedSeries(TIMELINE_CAPACITY), BoundedSeries(TIMELINE_CAPACITY)))
                for series, value in zip(timeline, loads, strict=True):
                    if value is not None:
                        series.add(elapsed, value)
            self.version += 1
            self._recent.append((self.version, elapsed, snap))

    def has_line(self) -> bool:
        """Whether the load over the run can be drawn as lines: two samples or more."""
        with self._lock:
            return self.version >= 2

    def titles(self) -> tuple[str, str]:
        """The load panels' titles for this run's devices (GPUs, or CPU and RAM)."""
        return panel_titles(self.latest)

    def samples_since(self, version: int) -> list[tuple[int, float, Snapshot]]:
        """The samples added after ``version`` (at most the last :data:`SPARK_POINTS`), each with its version
        and its seconds since the first sample."""
        with self._lock:
            return [sample for sample in self._recent if sample[0] > version]

    def sparks(self) -> dict[DeviceKey, tuple[list, list]]:
        """Per device: (busy %, memory %) of the last :data:`SPARK_POINTS` samples, ``None`` where not known."""
        with self._lock:
            return {key: (list(busy), list(memory)) for key, (busy, memory) in self._spark.items()}

    def timelines(self) -> dict[DeviceKey, tuple[tuple[list, list], tuple[list, list]]]:
        """Per device, in :func:`panel_order`: ((seconds, busy), (seconds, memory %)) over the whole run,
        downsampled, in the load panels' units."""
        with self._lock:
            return {key: ((list(b.steps), list(b.means)), (list(m.steps), list(m.means)))
                    for key, (b, m) in sorted(self._timeline.items(), key=lambda item: panel_order(item[0]))}

    def peaks(self) -> Loads:
        """Per device: (mean busy, peak memory %) over the run in the load panels' units, for the summary."""
        with self._lock:
            out = {}
            for key, (busy, memory) in self._timeline.items():
                mean_busy = sum(m * c for m, c in zip(busy.means, busy.counts, strict=True)) / busy.count if busy.count else None
                out[key] = (mean_busy, memory.finite_max)
            return out
