"""Recorded runs for the bottleneck advisor: a run's telemetry, logged steps and setup facts, as JSON.

``Recorder`` is a run observer that samples :class:`~nbtrain.gpu.telemetry.Telemetry` while the run goes
and keeps what the ranks logged and reported; :func:`save` writes it under ``tests/data/telemetry/`` and
:func:`replay` feeds a saved one, in time order, into a fresh :class:`~nbtrain.kernel.diagnostics.advisor.Evidence` —
as the dashboard feeds it live, through real :class:`~nbtrain.gpu.telemetry.Snapshot` objects.
"""

from __future__ import annotations

import json
import os
import threading

from nbtrain.gpu.devices import GpuStatus
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.telemetry import RankUsage, Snapshot, Telemetry
from nbtrain.kernel.diagnostics.advisor import Evidence
from nbtrain.kernel.observers.events import RunObserver

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "telemetry")


class Recorder(RunObserver):
    def __init__(self, interval: float = 0.25) -> None:
        self.telemetry = Telemetry()
        self.interval = interval
        self.samples: list[dict] = []
        self.steps: dict[int, list] = {}
        self.setups: dict[int, list] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_started(self, info) -> None:
        self.telemetry.set_ranks(info.ranks)
        if self._thread is None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def ranks_ready(self, info) -> None:
        self.telemetry.set_ranks(info.ranks)

    def metrics(self, rank: int, records) -> None:
        self.steps.setdefault(rank, []).extend([step, when] for step, when, _ in records)

    def setup(self, rank: int, facts: dict) -> None:
        self.setups.setdefault(rank, []).append(facts)

    def run_finished(self, status: str, summary: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            snap = self.telemetry.snapshot()
            self.samples.append({
                "time": snap.time,
                "gpus": [{"index": g.index, "utilization": g.utilization, "memory_used": g.memory_used,
                          "memory_total": g.memory_total} for g in snap.gpus],
                "ranks": [{"rank": r.rank, "gpu_index": r.gpu_index, "cpu_percent": r.cpu_percent, "alive": r.alive}
                          for r in snap.ranks]})


def save(recorder: Recorder, name: str, description: str) -> str:
    path = os.path.join(DATA, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"description": description, "samples": recorder.samples,
                   "metrics": {str(r): v for r, v in recorder.steps.items()},
                   "setup": {str(r): v for r, v in recorder.setups.items()}}, f, indent=None)
        f.write("\n")
    return path


def load(name: str) -> dict:
    with open(os.path.join(DATA, f"{name}.json")) as f:
        return json.load(f)


def snapshot(sample: dict) -> Snapshot:
    gpus = tuple(GpuStatus(g["index"], "GPU", "", g["utilization"], g["memory_used"], g["memory_total"], None, None,
                           None, ()) for g in sample["gpus"])
    ranks = tuple(RankUsage(r["rank"], 0, None, r["gpu_index"], None, r["cpu_percent"], None, r["alive"])
                  for r in sample["ranks"])
    return Snapshot(sample["time"], gpus, ranks, HostStatus(None, 1, None, None), None)


def replay(record: dict) -> Evidence:
    """The record's samples and logged steps, merged in time order, into a new Evidence."""
    events = [(s["time"], 1, s) for s in record["samples"]]
    for rank, steps in record["metrics"].items():
        events += [(when, 0, (int(rank), step)) for step, when in steps]
    evidence = Evidence()
    for rank, facts in record.get("setup", {}).items():
        for f in facts:
            evidence.add_setup(int(rank), f)
    for when, kind, item in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 1:
            evidence.add_snapshot(snapshot(item))
        else:
            evidence.add_metrics(item[0], [(item[1], when, {"loss": 0.0})])
    return evidence
