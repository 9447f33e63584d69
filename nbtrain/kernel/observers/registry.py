"""The run registry: one small JSON file per kernel saying what its ``%%distributed`` run is doing.

Jupyter's server (nbtrain's server extension) reads these files to show which notebook runs what on which
GPU, and to stop a run — by interrupting the kernel that owns it, exactly as the notebook's stop button
does. The files are the whole contract between a kernel and the server; no socket is opened for it.

Where: ``<jupyter runtime dir>/nbtrain/runs/kernel-<pid>.json`` (``jupyter --runtime-dir``; the directory is
created with mode 0700, files 0600, so only this user reads them). Written atomically (temp file + rename).
Removed when the kernel exits; a record whose kernel pid is dead is stale and is ignored by readers.

Record (JSON)::

    {"version": 1, "kernel_pid": 123, "kernel_id": "4f1c…" | null, "connection_file": "…/kernel-4f1c….json",
     "background": 0 | 2 (the kernel's background run of that number: kernel-<pid>-background-2.json),
     "state": "starting" | "running" | "finished" | "failed" | "interrupted",
     "run_id": "nbtrain-123-1/4", "started": 1760000000.0, "updated": 1760000003.2, "ended": null,
     "backend": "nccl", "device_type": "cuda", "gpu_ids": [0, 1], "nprocs": 2,
     "ranks": [{"rank": 0, "pid": 456, "device": "cuda:0", "gpu_index": 0}, …],
     "step": 1200, "metrics": {"loss": 0.31}, "total_steps": 5000 (when the cell logged it),
     "summary": "2 ranks finished in 41.0 s" | null,
     "nodes": [{"name": "a", "host": "gpu1", "address": "10.0.0.7", "ranks": [0, 1], "state": "running",
                "last_heard": 1760000003.0, "cpu_percent": 12.0, "ram_percent": 40.0,
                "gpus": [{"index": 0, "utilization": 97, "memory_used": 1234, "memory_total": 81559,
                          "health": "SM 1980/1980 MHz · PCIe 5 x16/16 · … · slowed by power cap"}]}, …]}

``started`` is when the cell began (its ranks' start-up included; a ``--max-restarts`` run's first attempt), as
the summary's time counts. ``step`` is the steps rank 0 has done (its last logged step + 1: 423 at the end of a
423-step run), the count the dashboard, the summary and the JupyterLab panel all show. ``metrics`` are the series' last values; ``nbtrain.log(total_steps=N)`` is not one of
them but ``total_steps``. ``nodes`` is empty on one machine; on a ``--nodes`` run it follows the nodes' heartbeats (throttled like metrics).

Metric updates are throttled to one write per :data:`WRITE_INTERVAL_S`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import tempfile
import time
from dataclasses import asdict

from ...common.pids import pid_alive
from .events import RunInfo, RunObserver, RunState
from .history import TOTAL_STEPS

WRITE_INTERVAL_S = 1.0
VERSION = 1


def runs_dir() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), "nbtrain", "runs")


def sweep_records(directory: str | None = None) -> int:
    """Remove the records of kernels that are no longer running (killed: their atexit never ran)."""
    from ...common.leftovers import sweep_dead

    return sweep_dead(directory or runs_dir(), re.compile(r"kernel-(\d+)(?:-background-\d+)?\.json$"))


def read_runs(directory: str | None = None) -> list[dict]:
    """Every live record (its kernel still running), newest first; unreadable or stale files are skipped."""
    directory = directory or runs_dir()
    records = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        if record.get("version") == VERSION and pid_alive(record.get("kernel_pid")):
            records.append(record)
    return sorted(records, key=lambda r: r.get("updated", 0), reverse=True)


def kernel_identity() -> tuple[str | None, str | None]:
    """This kernel's id and connection file, when running inside ipykernel."""
    try:
        from ipykernel.connect import get_connection_file

        path = get_connection_file()
    except Exception:
        return None, None
    match = re.search(r"kernel-([0-9a-fA-F-]+)\.json$", os.path.basename(path))
    return (match.group(1) if match else None), path


class RunRegistry(RunObserver):
    """A RunObserver that keeps this kernel's record up to date."""

    _shown_as = "the run list of JupyterLab's nbtrain panel"

    def __init__(self, directory: str | None = None, background: int = 0) -> None:
        self.directory = directory or runs_dir()
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        suffix = f"-background-{background}" if background else ""  # a background run: a record of its own
        self.path = os.path.join(self.directory, f"kernel-{os.getpid()}{suffix}.json")
        kernel_id, connection_file = kernel_identity()
        self.record: dict = {"version": VERSION, "kernel_pid": os.getpid(), "kernel_id": kernel_id,
                             "connection_file": connection_file, "background": background}
        self._last_write = 0.0
        atexit.register(self.remove)

    def run_started(self, info: RunInfo) -> None:
        self.record.pop("total_steps", None)
        self.record.update(state=RunState.STARTING.value, run_id=info.run_id, started=info.started or time.time(), ended=None,
                           step=None, metrics={}, summary=None, **self._layout(info))
        self._write()

    def ranks_ready(self, info: RunInfo) -> None:
        self.record.update(state=RunState.RUNNING.value, **self._layout(info))
        self._write()

    def metrics(self, rank: int, records: list) -> None:
        if rank != 0 or not records:
            return
        for step, _, values in records:
            if TOTAL_STEPS in values:  # the run's length, not a series
                self.record["total_steps"] = values[TOTAL_STEPS]
                values = {name: value for name, value in values.items() if name != TOTAL_STEPS}
            if values:
                self.record["step"] = step + 1  # steps done, as the dashboard and the summary count them
                self.record.setdefault("metrics", {}).update(values)
        if time.monotonic() - self._last_write >= WRITE_INTERVAL_S:
            self._write()

    def nodes_heard(self, nodes) -> None:
        self.record["nodes"] = [n.record() for n in nodes]
        if time.monotonic() - self._last_write >= WRITE_INTERVAL_S:
            self._write()

    def replica_groups(self, groups) -> None:
        self.record["replica_groups"] = [group.record() for group in groups]
        self._write()  # a change of state: rare, and what the panel is asked about

    def run_finished(self, status: str, summary: str) -> None:
        self.record.update(state=RunState(status).value, ended=time.time(), summary=summary)
        self._write()

    @staticmethod
    def _layout(info: RunInfo) -> dict:
        return {"backend": info.backend, "device_type": info.device_type, "gpu_ids": list(info.gpu_ids),
                "nprocs": info.nprocs, "ranks": [asdict(r) for r in info.ranks],
                "nodes": [n.record() for n in info.nodes]}

    def _write(self) -> None:
        self.record["updated"] = time.time()
        self._last_write = time.monotonic()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".run-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.record, fh)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
