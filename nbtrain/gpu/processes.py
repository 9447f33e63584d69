"""CPU and memory of process trees and of the machine, through psutil: the path without a GPU.

A rank is more than one process: DataLoader workers and anything the cell starts are its children. So
:class:`ProcessTrees` measures a rank as its process *plus all its descendants*: CPU percent summed over
the tree (100 = one core busy), resident memory summed likewise, and the set of PIDs, which the GPU
telemetry matches against the PIDs NVML reports.

``psutil``'s CPU percent is a difference between two calls, so the :class:`psutil.Process` objects are
kept between samples (a new process reads 0 % on its first sample and its real value after that).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class TreeUsage:
    pids: frozenset[int]  # the process and its live descendants
    cpu_percent: float | None  # summed over the tree; 100 = one core
    rss: int | None  # bytes, summed over the tree
    alive: bool


@dataclass(frozen=True)
class HostStatus:
    """The machine: CPU over all cores (0–100) and memory."""

    cpu_percent: float | None
    cpu_count: int
    memory_used: int | None
    memory_total: int | None


class ProcessTrees:
    """Samples process trees by root PID; keeps psutil handles between samples for CPU deltas."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # the first machine-wide reading starts the clock

    def _handle(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = psutil.Process(pid)
            proc.cpu_percent(interval=None)
            self._procs[pid] = proc
        return proc

    def usage(self, root_pid: int) -> TreeUsage:
        with self._lock:
            try:
                root = self._handle(root_pid)
                if root.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped by its parent
                    raise psutil.ZombieProcess(root_pid)
                members = [root] + root.children(recursive=True)
            except psutil.Error:
                self._procs.pop(root_pid, None)
                return TreeUsage(frozenset(), None, None, alive=False)
            pids, cpu, rss = set(), 0.0, 0
            for proc in members:
                try:
                    handle = self._handle(proc.pid)
                    with handle.oneshot():
                        cpu += handle.cpu_percent(interval=None)
                        rss += handle.memory_info().rss
                    pids.add(proc.pid)
                except psutil.Error:  # exited between the listing and the reading
                    self._procs.pop(proc.pid, None)
            return TreeUsage(frozenset(pids), cpu, rss, alive=True)

    def forget_except(self, live_roots: set[int], keep: set[int]) -> None:
        """Drop handles of processes no longer followed, so a long session does not accumulate them."""
        with self._lock:
            for pid in list(self._procs):
                if pid not in live_roots and pid not in keep:
                    del self._procs[pid]


def host_status() -> HostStatus:
    try:
        memory = psutil.virtual_memory()
        used, total = memory.total - memory.available, memory.total
    except Exception:
        used = total = None
    try:
        cpu = psutil.cpu_percent(interval=None)
    except Exception:
        cpu = None
    return HostStatus(cpu, psutil.cpu_count() or 1, used, total)
