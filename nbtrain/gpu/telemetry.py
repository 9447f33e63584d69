"""GPU telemetry, per GPU and per rank: the data behind the dashboard, usable without any UI.

::

    from nbtrain.gpu.telemetry import Telemetry, snapshot

    snap = snapshot()                      # the machine now
    for gpu in snap.gpus:                  # empty without an NVIDIA driver
        print(gpu.index, gpu.name, gpu.utilization, gpu.memory_used, gpu.memory_total,
              gpu.temperature, gpu.power, gpu.power_limit, gpu.processes)
    snap.host.cpu_percent, snap.host.memory_used   # always there (psutil)
    snap.nvml_error                        # None, or why there is no GPU telemetry

    telemetry = Telemetry(ranks)           # ranks: RankInfo (rank, pid, device, gpu_index) of a run
    snap = telemetry.snapshot()            # call it repeatedly: CPU % is measured between calls
    for r in snap.ranks:
        r.rank, r.pid, r.device, r.gpu_memory, r.cpu_percent, r.rss

What is measured, and from where:

* **GPUs** (:class:`~nbtrain.gpu.devices.GpuStatus`) come from NVML (:mod:`nbtrain.gpu.nvml`, the one
  wrapper of the driver), initialised on the first snapshot — never at import, never through CUDA. Any
  field the driver cannot give is ``None`` (shown as N/A); nothing here raises because of the driver.
* **A rank's GPU memory** is the memory NVML lists for the rank's process *and its children*
  (DataLoader workers that touch CUDA). NVML reports PIDs as the host sees them; inside a container
  with its own PID namespace they do not match the ranks' PIDs. Then ``gpu_memory`` is ``None`` and
  :attr:`Snapshot.notes` says why — the GPU's total is still right. In VMs and some containers the
  driver lists *no* process at all, even while a rank holds gigabytes: a rank on that GPU (which has a
  CUDA context, so would be listed) then reads ``None`` too, never 0, and the GPU's ``memory_used`` is
  what is in use (:func:`hidden_processes_note`). Under MIG, utilisation and
  per-process memory are not reported by the driver; the notes say that too.
* **CPU and RAM** per rank (process tree) and for the machine come from psutil, with or without GPUs —
  this is what the dashboard shows when :attr:`Snapshot.nvml_error` is set (no NVIDIA driver).

:class:`Telemetry` is thread-safe: the dashboard samples from a background thread while the run's
observer updates the ranks from the kernel's main thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import nvml
from .devices import DeviceReader, GpuProcess, GpuStatus
from .processes import HostCpu, HostStatus, ProcessTrees, host_status

NO_DRIVER = "no NVIDIA driver was found"


@dataclass(frozen=True)
class RankUsage:
    """One rank's process tree: its GPU memory (when known), CPU and resident memory."""

    rank: int
    pid: int
    device: str | None  # as the rank sees it: "cuda:0", "cpu", or None before it is ready
    gpu_index: int | None  # NVML index of its GPU
    gpu_memory: int | None  # bytes over the rank's process and children; None: not known (see notes)
    cpu_percent: float | None  # 100 = one core, at most cores × 100; None on the first sample (no baseline)
    rss: int | None  # bytes
    alive: bool = True
    mig_uuid: str | None = None  # the MIG instance its processes run on (NVML lists them there), by its UUID


@dataclass(frozen=True)
class Snapshot:
    time: float  # unix time of the sample
    gpus: tuple[GpuStatus, ...]
    ranks: tuple[RankUsage, ...]
    host: HostStatus
    nvml_error: str | None  # None when NVML works; else one line on why there are no GPU numbers
    notes: tuple[str, ...] = field(default_factory=tuple)  # what is not known, and why

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)


@dataclass(frozen=True)
class _Rank:
    rank: int
    pid: int
    device: str | None
    gpu_index: int | None


def _as_rank(item) -> _Rank:
    if isinstance(item, tuple):
        return _Rank(*item) if len(item) == 4 else _Rank(item[0], item[1], None, None)
    return _Rank(item.rank, item.pid, getattr(item, "device", None), getattr(item, "gpu_index", None))


class Telemetry:
    """Samples GPUs, the machine and (optionally) a run's ranks; one instance per thing being watched."""

    def __init__(self, ranks: Iterable = (), reader: DeviceReader | None = None) -> None:
        self._lock = threading.Lock()
        self._ranks: tuple[_Rank, ...] = ()
        self._reader = reader or DeviceReader()
        self._trees = ProcessTrees()
        self._host_cpu = HostCpu()
        self.set_ranks(ranks)

    def first_sample_in(self) -> float:
        """Seconds until a first :meth:`snapshot` would not wait (the machine's first CPU reading needs
        :data:`~nbtrain.gpu.processes.MIN_HOST_S` of history): a sampler that waits this long itself can be
        stopped meanwhile."""
        return self._host_cpu.first_reading_in()

    def close(self) -> None:
        """Stop what the reader watches in the background (a run's Xid events)."""
        self._reader.close()

    def set_ranks(self, ranks: Iterable) -> None:
        """Follow these ranks: RankInfo objects, or ``(rank, pid[, device, gpu_index])`` tuples."""
        with self._lock:
            self._ranks = tuple(sorted((_as_rank(r) for r in ranks), key=lambda r: r.rank))

    def snapshot(self) -> Snapshot:
        with self._lock:
            ranks = self._ranks
        gpus = tuple(self._reader.read())
        reason = None if gpus or self._reader.available() else _no_driver_reason()
        notes: list[str] = []
        if self._reader.available() and not gpus:
            notes.append("the NVIDIA driver is loaded but lists no GPU")
        trees = {r.rank: self._trees.usage(r.pid) for r in ranks}
        usages = tuple(self._rank_usage(r, trees[r.rank], gpus, notes) for r in ranks)
        notes += gpu_notes(gpus)
        self._trees.forget_except({r.pid for r in ranks}, {p for t in trees.values() for p in t.pids})
        return Snapshot(time.time(), gpus, usages, host_status(self._host_cpu), reason, tuple(dict.fromkeys(notes)))

    def _rank_usage(self, rank: _Rank, tree, gpus, notes: list[str]) -> RankUsage:
        gpu_memory = None
        gpu = next((g for g in gpus if g.index == rank.gpu_index), None)
        if gpu is not None and tree.alive:
            gpu_memory = _tree_gpu_memory(gpu, tree.pids, notes)
        instance = next((d.uuid for d in gpu.mig_devices if tree.pids & set(d.pids)), None) if gpu else None
        return RankUsage(rank.rank, rank.pid, rank.device, rank.gpu_index, gpu_memory, tree.cpu_percent,
                         tree.rss, tree.alive, instance)


def _tree_gpu_memory(gpu: GpuStatus, pids: frozenset[int], notes: list[str]) -> int | None:
    """Memory NVML lists on ``gpu`` for ``pids``; None (with a note) when it cannot be known."""
    if gpu.processes is None:
        notes.append(f"GPU {gpu.index}: the driver does not list its processes, so per-rank memory is unknown")
        return None
    mine = [p for p in gpu.processes if p.pid in pids]
    if not mine:  # a rank on a GPU has a CUDA context there, so a driver that lists processes lists it
        if not gpu.processes:  # it lists none at all: a VM or container that hides them
            notes.append(hidden_processes_note(gpu))
        else:  # processes run there, none of them ours by PID: another PID namespace
            notes.append(f"GPU {gpu.index}: NVML lists processes this kernel cannot match to the ranks (a "
                         "container with its own PID namespace?); per-rank memory is unknown, the GPU total is right")
        return None
    if any(p.used_memory is None for p in mine):
        notes.append(f"GPU {gpu.index}: the driver does not report per-process memory (MIG or a WDDM driver)")
        return None
    return sum(p.used_memory or 0 for p in mine)  # each is known (above)


def hidden_processes_note(gpu: GpuStatus) -> str:
    """The one note for a GPU whose driver lists no process (same text wherever it is found, so shown once)."""
    used = "N/A" if gpu.memory_used is None else f"{gpu.memory_used / 2**30:.1f} GiB"
    return (f"GPU {gpu.index}: the driver lists no processes (as in VMs and some containers), so per-process "
            f"and per-rank memory is unknown (N/A); memory.used ({used}) shows what is in use")


def gpu_notes(gpus) -> list[str]:
    """What the panel says under these GPUs: why fields read N/A (once per reason), hidden processes, MIG mode."""
    notes = []
    unread: dict[str, list[int]] = {}  # why a health field reads N/A -> the GPUs it holds for: one note each
    for gpu in gpus:
        for reason in gpu.health.unread if gpu.health else ():
            unread.setdefault(reason, []).append(gpu.index)
        if gpu.processes_hidden:
            notes.append(hidden_processes_note(gpu))
        if gpu.mig:
            notes.append(f"GPU {gpu.index} is in MIG mode: the driver reports no utilisation or per-process "
                         "memory for MIG instances; each instance is shown with its own memory")
        elif gpu.utilization is None:
            notes.append(f"GPU {gpu.index}: utilisation not reported by the driver")
    for reason, indices in unread.items():
        field_name, _, why = reason.partition(": ")
        notes.append(f"{'GPU' if len(indices) == 1 else 'GPUs'} {', '.join(map(str, indices))}: {field_name} N/A — {why}")
    return notes


def _no_driver_reason() -> str:
    detail = nvml.unavailable_reason()
    return f"{NO_DRIVER} ({detail})" if detail else NO_DRIVER


_default_lock = threading.Lock()
_default: Telemetry | None = None


def snapshot(ranks: Iterable | None = None) -> Snapshot:
    """The machine now, and ``ranks``' usage when given.

    Without ``ranks`` a shared :class:`Telemetry` is used, so CPU percentages are measured since the
    previous call. With ``ranks``, a new one: their CPU reads ``None`` the first time (no baseline yet) — keep a
    :class:`Telemetry` and call its :meth:`~Telemetry.snapshot` to follow ranks over time.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Telemetry()
    if ranks is not None:
        return Telemetry(ranks).snapshot()
    return _default.snapshot()


__all__ = ["Telemetry", "Snapshot", "RankUsage", "GpuStatus", "GpuProcess", "HostStatus", "snapshot", "NO_DRIVER",
           "hidden_processes_note", "gpu_notes"]
