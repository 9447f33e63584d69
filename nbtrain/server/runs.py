"""nbtrain runs and GPU processes as this server presents them, and which run a stop request may touch.

Inputs are the run records kernels write (:mod:`nbtrain.kernel.observers.registry`), the server's kernels
(:mod:`nbtrain.server.kernels`) and the GPUs' state (:func:`nbtrain.server.gpus.gpu_states`). Everything here reads
``/proc`` and files, so the handlers call it in a thread pool.

A record counts only when its kernel is one this server manages: its ``kernel_id`` is in the kernel
manager and, where the server knows the kernel's pid, the record's ``kernel_pid`` is that pid (or a
descendant of it, for kernelspecs that start Python through a forking wrapper). That is
also the rule for stopping: :func:`resolve_stop` turns a kernel id or a pid into such a kernel, or refuses
with :class:`StopRefused`. The server then interrupts that kernel — it never signals a pid it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from ..kernel.observers.events import RunState
from .kernels import KernelView, by_pid, owning_kernel

ACTIVE_STATES = frozenset({RunState.STARTING, RunState.RUNNING})  # a record's state is its value: "running" is RUNNING


class StopRefused(Exception):
    """A stop request that names no active nbtrain run of this server; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class OwnedRun:
    kernel: KernelView
    record: dict


def owned_runs(kernels: dict[str, KernelView], records: list[dict]) -> list[OwnedRun]:
    runs = []
    for record in records:
        kernel = kernels.get(record.get("kernel_id") or "")
        if kernel is None:
            continue
        # The record's writer must be that kernel's process (or run under it, when the kernelspec starts
        # Python through a wrapper that forks).
        if kernel.pid is None or owning_kernel(record.get("kernel_pid"), {kernel.pid: kernel}) is kernel:
            runs.append(OwnedRun(kernel, record))
    return runs


def describe_runs(kernels: dict[str, KernelView], records: list[dict]) -> list[dict]:
    """The ``/nbtrain/runs`` list: one entry per kernel with a run record, newest first."""
    described = []
    for run in owned_runs(kernels, records):
        record = run.record
        metrics = record.get("metrics") or {}
        ranks = [dict(rank, alive=_alive(rank.get("pid"))) for rank in record.get("ranks") or []]
        described.append({
            **run.kernel.as_json(),
            "run_id": record.get("run_id"), "state": record.get("state"),
            "active": record.get("state") in ACTIVE_STATES,
            "nprocs": record.get("nprocs"), "backend": record.get("backend"),
            "device_type": record.get("device_type"), "gpu_ids": record.get("gpu_ids") or [],
            "ranks": ranks, "step": record.get("step"), "loss": metrics.get("loss"), "metrics": metrics,
            "started": record.get("started"), "updated": record.get("updated"), "ended": record.get("ended"),
            "summary": record.get("summary"), "nodes": record.get("nodes") or [],
            "replica_groups": record.get("replica_groups") or [],
            "background": int(record.get("background") or 0),
        })
    return described


def gpu_processes(kernels: dict[str, KernelView], records: list[dict], gpus: list[dict]) -> list[dict]:
    """Every process NVML reports on a GPU, with the kernel and notebook it belongs to (None if none)."""
    kernels_by_pid = by_pid(kernels)
    rank_of = {}
    for run in owned_runs(kernels, records):
        for rank in run.record.get("ranks") or []:
            rank_of[rank.get("pid")] = rank.get("rank")
    found = []
    for gpu in gpus:
        for proc in gpu.get("processes") or []:  # null: the driver does not list them (VMs, MIG)
            kernel = owning_kernel(proc["pid"], kernels_by_pid)
            found.append({
                "pid": proc["pid"], "gpu_index": gpu["index"], "memory_used": proc.get("memory_used"),
                **_process_facts(proc["pid"]),
                "kernel_id": kernel.kernel_id if kernel else None,
                "path": kernel.path if kernel else None,
                "rank": rank_of.get(proc["pid"]),
            })
    return found


def resolve_stop(kernels: dict[str, KernelView], records: list[dict], kernel_id: str | None = None,
                 pid: int | None = None) -> OwnedRun:
    """The active run a stop request names (by its kernel id, or by any pid of its process tree)."""
    runs = owned_runs(kernels, records)
    if kernel_id is not None:
        if kernel_id not in kernels:
            raise StopRefused(404, f"no kernel {kernel_id!r} on this server")
        mine = [r for r in runs if r.kernel.kernel_id == kernel_id]
        run = next((r for r in mine if not r.record.get("background")), None)
        if run is None and mine:
            number = mine[0].record.get("background")
            raise StopRefused(409, f"the run in {mine[0].kernel.path or kernel_id} is background run {number}: the "
                                   "kernel's stop button does not reach it; stop it in its notebook with "
                                   "nbtrain.last_run.stop() (or its own handle)")
        if run is None:
            raise StopRefused(404, f"kernel {kernel_id!r} has no nbtrain run (no distributed cell has run in it)")
    else:
        owner = owning_kernel(pid, by_pid(kernels))
        run = next((r for r in runs if owner is not None and r.kernel.kernel_id == owner.kernel_id), None)
        if run is None:
            raise StopRefused(404, f"process {pid} belongs to no nbtrain run of this server; only runs of "
                                   f"this server's kernels can be stopped here (by interrupting the kernel)")
    state = run.record.get("state")
    if state not in ACTIVE_STATES:
        where = run.kernel.path or run.kernel.kernel_id
        raise StopRefused(409, f"the run in {where} is not running (state: {state}); nothing to stop")
    return run


def _alive(pid) -> bool:
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, TypeError, ValueError):
        return False


def _process_facts(pid: int) -> dict:
    """Name and owner of a process, as far as this user may read them."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return {"process_name": proc.name(), "user": _username(proc)}
    except psutil.Error:
        return {"process_name": None, "user": None}


def _username(proc: psutil.Process) -> str | None:
    try:
        return proc.username()
    except (psutil.Error, KeyError):  # KeyError: uid without a passwd entry (containers)
        return None
