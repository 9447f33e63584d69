"""A detached run's load, recorded by its agent: its ranks' CPU and memory and its GPUs, as the dashboard samples them.

From the moment the ranks start until the run ends, a thread of the agent takes a
:class:`~nbtrain.gpu.telemetry.Snapshot` of the run's ranks (their process trees) and of the machine's GPUs and
appends it to the run's folder (:meth:`~nbtrain.wire.runfolder.RunFolder.telemetry`), so a kernel that follows
the run — live, or long after it ended — draws the run's load from its start (:mod:`nbtrain.kernel.cluster.recorded`).
A sample a second for the first :data:`SPREAD` seconds, then one every :data:`SPREAD`-th of the run's age: a day's
run keeps about 3,600 samples, not 86,400 (the dashboard's timeline keeps fewer still).
"""

from __future__ import annotations

import threading
import time

from ..gpu.snapshot_json import snapshot_to_json
from ..gpu.telemetry import Telemetry
from ..wire.runfolder import RunFolder

SAMPLE_S = 1.0  # the dashboard's own interval
SPREAD = 600


class RecordedTelemetry:
    """Samples one detached run into its folder (see the module docstring); the owner calls :meth:`close` before it
    finishes the folder."""

    def __init__(self, folder: RunFolder, gpus: tuple[int, ...], more=None) -> None:
        self._folder = folder
        self._gpus = gpus  # the run's GPUs (NVML indices), local rank i on the i-th; () on the CPU
        self._more = more  # what each sample adds (a relay's nodes: node.relay), or None
        self._telemetry: Telemetry | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ranks_started(self, pids: dict[int, int]) -> None:
        """The ranks (rank → pid; local ranks in rank order) run: follow them, from the first attempt on."""
        ranks = [(rank, pid, *self._device(local)) for local, (rank, pid) in enumerate(sorted(pids.items()))]
        if self._telemetry is None:
            self._telemetry = Telemetry(ranks)
            self._thread = threading.Thread(target=self._sample, name="nbtrain-detached-telemetry", daemon=True)
            self._thread.start()
        else:  # a restart's ranks
            self._telemetry.set_ranks(ranks)

    def _device(self, local: int) -> tuple[str, int | None]:
        if not self._gpus:
            return "cpu", None
        return f"cuda:{local}", self._gpus[local % len(self._gpus)]

    def _sample(self) -> None:
        assert self._telemetry is not None
        began = time.monotonic()
        while not self._stop.is_set():
            try:
                more = self._more() if self._more is not None else {}
                self._folder.telemetry({**snapshot_to_json(self._telemetry.snapshot()), **more})
            except (OSError, ValueError):
                return  # the folder cannot be written any more: the recorder says so for the run's own record
            self._stop.wait(max(SAMPLE_S, (time.monotonic() - began) / SPREAD))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._telemetry is not None:
            self._telemetry.close()
