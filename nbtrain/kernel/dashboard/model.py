"""RunModel: everything the dashboard knows about one run, gathered apart from any drawing.

Fed from two sides — the run's observer callbacks on the kernel's main thread (ranks, logged values,
the end) and the telemetry sampler's thread (snapshots) — and read by whichever front end draws it
(the widget, the terminal status line, the final figure, the ``%gpus`` monitor). Each part carries
its own lock; the methods called from the run loop only append. Data only: nothing here imports a view.
The same measurements feed the run's bottleneck :class:`~nbtrain.kernel.diagnostics.advisor.Evidence`, so the views
can show the advisor's hints live (:meth:`RunModel.hints`) and the summary can say them at the end.
"""

from __future__ import annotations

import threading
import time

from ...gpu.devices import DeviceReader
from ...gpu.telemetry import Snapshot, Telemetry
from ..diagnostics.advisor import Evidence, Hint, advise
from ..diagnostics.setup_facts import setup_words, splits_of
from ..observers.events import NodeInfo, RankInfo, ReplicaGroupInfo, RunInfo, RunState
from .metric_store import MetricStore
from .progress import Progress, progress
from .series import DEFAULT_CAPACITY
from .telemetry_series import TelemetrySeries


class RunModel:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, telemetry_source: Telemetry | None = None) -> None:
        self.store = MetricStore(capacity)  # what the ranks logged (the notebook's ``history`` has it all)
        self.telemetry = TelemetrySeries()  # the devices' samples over time
        # what the sampler thread reads them from; a run's watches Xid errors from its first sample to its end
        self.telemetry_source = telemetry_source or Telemetry(reader=DeviceReader(xid_events=True))
        self.info: RunInfo | None = None
        self.ranks: tuple[RankInfo, ...] = ()
        self.nodes: tuple[NodeInfo, ...] = ()  # a --nodes run's machines, as their last heartbeats said
        self.placement_version = 0  # bumped with each report of the nodes or the replica groups: a view redraws only then
        self.replica_groups: tuple[ReplicaGroupInfo, ...] = ()  # a --ft run's groups and their states
        self.started = time.monotonic()
        self.ended: float | None = None
        self.status: RunState | None = None  # once finished
        self.detail = ""
        self.earlier: tuple = ()  # the kernel's earlier runs, to draw beside this one (launch.observers.runlog.EarlierRun)
        self.cold_start = ""  # new ranks: "cold start 0.2 s" (its split is the cell's closing line)
        self.evidence = Evidence()  # what the advisor reads; fed from both threads, so under a lock
        self._evidence_lock = threading.Lock()

    def set_info(self, info: RunInfo) -> None:
        self.info = info
        self.ranks = tuple(info.ranks)
        self.telemetry_source.set_ranks(info.ranks)
        if info.nodes:
            self.set_nodes(info.nodes)

    def set_earlier(self, runs) -> None:
        """The kernel's earlier runs, drawn faded beside this one."""
        self.earlier = tuple(runs)

    def set_nodes(self, nodes: tuple[NodeInfo, ...]) -> None:
        """A --nodes run's machines (about once a second): for the panels, and their GPUs' health for the advisor."""
        self.nodes = tuple(nodes)
        self.placement_version += 1
        with self._evidence_lock:
            self.evidence.add_nodes(self.nodes)

    def set_replica_groups(self, groups: tuple[ReplicaGroupInfo, ...]) -> None:
        """A --ft run's replica groups, at each change of state (the device panel's badges)."""
        self.replica_groups = tuple(groups)
        self.placement_version += 1

    def add_metrics(self, rank: int, records) -> None:
        self.store.add(rank, records)
        with self._evidence_lock:
            self.evidence.add_metrics(rank, records)

    def add_sample(self, snap: Snapshot) -> None:
        self.telemetry.add(snap)
        with self._evidence_lock:
            self.evidence.add_snapshot(snap)

    def add_setup(self, rank: int, facts: dict) -> None:
        with self._evidence_lock:
            self.evidence.add_setup(rank, facts)

    def hints(self) -> list[Hint]:
        """What limited the run so far, from what was measured so far (:func:`~nbtrain.kernel.diagnostics.advisor.advise`)."""
        with self._evidence_lock:
            return advise(self.evidence)

    def step_splits(self) -> dict[int, dict[str, float]]:
        """Each rank's step split, as it sent it when the cell ended (drawn by :mod:`.step_split`)."""
        with self._evidence_lock:
            return splits_of(self.evidence.setup)

    def setup_words(self) -> list[str]:
        """Precision, memory format and compile time, as the ranks reported them."""
        with self._evidence_lock:
            return setup_words(self.evidence.setup)

    def set_cold_start(self, line: str) -> None:
        """Where the time to the first step went, for the summary (new ranks only)."""
        self.cold_start = line

    def finish(self, status: RunState, detail: str) -> None:
        self.ended = time.monotonic()
        self.status, self.detail = RunState(status), detail

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def progress(self) -> Progress:
        return progress(self.store, self.elapsed())

    @property
    def where(self) -> str:
        """``"gloo on cpu"``, ``"nccl on GPU 0,1"``: for titles and the summary."""
        if self.info is None:
            return "?"
        if self.info.gpu_ids:
            return f"{self.info.backend} on GPU {','.join(map(str, self.info.gpu_ids))}"
        return f"{self.info.backend} on {self.info.device_type}"

    def status_text(self) -> str | None:
        if self.status is None:
            return None
        return self.status
