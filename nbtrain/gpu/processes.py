"""CPU and memory of process trees and of the machine, through psutil: the path without a GPU.

A rank is more than one process: DataLoader workers and anything the cell starts are its children. So
:class:`ProcessTrees` measures a rank as its process *plus all its descendants*: CPU percent summed over
the tree (100 = one core busy), resident memory summed likewise, and the set of PIDs, which the GPU
telemetry matches against the PIDs NVML reports.

``psutil``'s CPU percent is a difference between two calls, so the :class:`psutil.Process` objects are
kept between samples. A process seen for the first time has no earlier reading: its CPU is not
measured until :data:`MIN_BASELINE_S` later (a tree whose root is new reads ``None``, shown as N/A; a new child adds 0),
because a difference over the microseconds since its handle was made is noise that can read as
hundreds of percent. A tree's sum is also capped at the machine's cores × 100, which is all it can use.

A tree's members are found from its root down (:func:`descendants`): on Linux through each thread's
``/proc/PID/task/TID/children``, which costs a few reads per rank, not psutil's ``children()``, which reads
the status of every process on the machine (about 8 ms a rank on a container with a hundred processes,
taken once a second from the CPU the ranks train with when they use every core). Where that file does not
exist (another OS, a kernel built without it), psutil's way.

The machine's CPU (:class:`HostCpu`) is the busy share of all cores between two readings of
``psutil.cpu_times()`` that the sampler itself keeps. ``psutil.cpu_percent()`` keeps its earlier reading
per *thread*, so the first sample taken on a sampler thread (or any thread other than the one that
called it before) would measure the microseconds since that call and read 0 %. Here the first reading
covers at least :data:`MIN_HOST_S` since the sampler was made (waiting for the rest if asked sooner).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

MIN_BASELINE_S = 0.05  # a process's CPU is measured only over at least this long since its first reading
MIN_HOST_S = 0.1  # the machine's first CPU reading covers at least this long (a shorter one reads 0 % or 100 %)


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
        self._procs: dict[int, tuple[psutil.Process, float]] = {}  # pid -> (handle, time of its baseline)

    def _handle(self, pid: int) -> tuple[psutil.Process, bool]:
        """The kept handle of ``pid``, and whether its CPU baseline is old enough to measure from."""
        kept = self._procs.get(pid)
        if kept is None:
            proc = psutil.Process(pid)
            proc.cpu_percent(interval=None)  # the baseline; a later sample measures from here
            kept = self._procs[pid] = (proc, time.monotonic())
        proc, since = kept
        return proc, time.monotonic() - since >= MIN_BASELINE_S

    def usage(self, root_pid: int) -> TreeUsage:
        with self._lock:
            try:
                root, measured = self._handle(root_pid)
                if root.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped by its parent
                    raise psutil.ZombieProcess(root_pid)
                members = [root_pid, *descendants(root)]
            except psutil.Error:
                self._procs.pop(root_pid, None)
                return TreeUsage(frozenset(), None, None, alive=False)
            pids, cpu, rss = set(), 0.0, 0
            for pid in members:
                try:
                    handle, baseline = self._handle(pid)
                    with handle.oneshot():
                        if baseline:
                            cpu += handle.cpu_percent(interval=None)
                        rss += handle.memory_info().rss
                    pids.add(pid)
                except psutil.Error:  # exited between the listing and the reading
                    self._procs.pop(pid, None)
            cpu_percent = min(cpu, 100.0 * (psutil.cpu_count() or 1)) if measured else None  # all cores busy at most
            return TreeUsage(frozenset(pids), cpu_percent, rss, alive=True)

    def forget_except(self, live_roots: set[int], keep: set[int]) -> None:
        """Drop handles of processes no longer followed, so a long session does not accumulate them."""
        with self._lock:
            for pid in list(self._procs):
                if pid not in live_roots and pid not in keep:
                    del self._procs[pid]


def descendants(proc: psutil.Process) -> list[int]:
    """The PIDs of ``proc``'s children, their children and so on (see the module docstring)."""
    found: list[int] = []
    todo = [proc.pid]
    while todo:
        pid = todo.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            if pid == proc.pid and not os.path.isdir("/proc/self/task"):  # no procfs: psutil knows other ways
                return [child.pid for child in proc.children(recursive=True)]
            continue  # exited while we looked
        for tid in threads:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as listing:
                    children = [int(child) for child in listing.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                    continue  # the thread ended
                return [child.pid for child in proc.children(recursive=True)]  # a kernel without the file
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


class HostCpu:
    """The machine's CPU between this object's own readings, whichever thread takes them (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = _cpu_times()  # the baseline: the first percent() measures from here
        self._made = time.monotonic()
        self._value: float | None = None

    def first_reading_in(self) -> float:
        """Seconds until a first :meth:`percent` would return at once (0 once it has been read)."""
        return 0.0 if self._value is not None else max(0.0, self._made + MIN_HOST_S - time.monotonic())

    def percent(self) -> float | None:
        """All cores' busy share (0–100) since the last call; the first call measures from this object's making,
        over :data:`MIN_HOST_S` at least (waiting for the rest: a first request made at once still gets a number)."""
        if self._value is None:
            time.sleep(max(0.0, self._made + MIN_HOST_S - time.monotonic()))
        now = _cpu_times()
        with self._lock:
            last, self._last = self._last, now
            if last is not None and now is not None and now[0] > last[0]:  # else no tick since: the last value
                self._value = round(max(0.0, min(100.0, 100.0 * (1 - (now[1] - last[1]) / (now[0] - last[0])))), 1)
            return self._value


def _cpu_times() -> tuple[float, float] | None:
    """(total, idle) CPU seconds of the machine: idle includes waiting for I/O; guest time is already in user."""
    try:
        times = psutil.cpu_times()
    except Exception:
        return None
    fields = times._asdict()
    total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
    return total, fields.get("idle", 0.0) + fields.get("iowait", 0.0)


def host_status(cpu: HostCpu) -> HostStatus:
    try:
        memory = psutil.virtual_memory()
        used, total = memory.total - memory.available, memory.total
    except Exception:
        used = total = None
    return HostStatus(cpu.percent(), psutil.cpu_count() or 1, used, total)
