"""DashboardObserver: follows one run (a :class:`~nbtrain.kernel.observers.events.RunObserver`) and drives a front end.

The run calls it on the kernel's main thread; every callback only records and returns:

* ``earlier_runs`` — the kernel's earlier runs, which the chart draws beside this one, go to the model;
* ``run_started`` / ``ranks_ready`` — the ranks' pids and devices go to the model and the telemetry;
  on the first one the front end is shown (the widget's: from the run's second tick, see
  :class:`~nbtrain.kernel.dashboard.widget.DeferredDashboard`) and the two background threads start: the telemetry
  :class:`~nbtrain.kernel.dashboard.threads.Sampler` (every ``interval`` seconds) and the
  :class:`~nbtrain.kernel.dashboard.threads.Ticker` that lets the front end redraw (four times a second);
* ``sampled`` — a detached run's load as its agent recorded it, in place of the sampler's;
* ``nodes_heard`` — a ``--nodes`` run's machines (state, CPU, RAM, GPUs from their heartbeats) go to the model;
* ``replica_groups`` — a ``--ft`` run's groups and their states go to the model (the device panel's badges);
* ``metrics`` — the records are appended to the bounded store (O(1) per value);
* ``setup`` — what ``prepare()`` set up (precision, memory format, compile time) goes to the model;
* ``run_finished`` — both threads are stopped and joined, and the front end
  writes its final output (the widget: a PNG and a paragraph; the terminal: a summary line).

The front end is anything with ``show()``, ``tick()`` and ``finish()`` taking a
:class:`~nbtrain.kernel.dashboard.model.RunModel`: :class:`~nbtrain.kernel.dashboard.widget.RunDashboard` or
:class:`~nbtrain.kernel.dashboard.text_status.TextStatus`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..observers.coldstart import latency
from ..observers.events import RunInfo, RunObserver, RunState
from .model import RunModel
from .threads import DEFAULT_INTERVAL_S, Sampler, Ticker, check_interval

TICK_S = 0.25  # the front end may change something at most four times a second


class Front(Protocol):
    """A front end, made from the run's model (see the module docstring)."""

    def show(self) -> object: ...

    def tick(self) -> None: ...

    def finish(self) -> None: ...


class DashboardObserver(RunObserver):
    _shown_as = "the live dashboard"

    def __init__(self, make_front: Callable[[RunModel], Front], interval: float = DEFAULT_INTERVAL_S,
                 model: RunModel | None = None) -> None:
        self.interval = check_interval(interval)
        self.model = model or RunModel()
        self._make_front = make_front
        self.front: Front | None = None
        self.sampler: Sampler | None = None
        self.ticker: Ticker | None = None

    def earlier_runs(self, runs: tuple) -> None:
        self.model.set_earlier(runs)

    def run_started(self, info: RunInfo) -> None:
        self.model.set_info(info)
        if self.front is None:
            self.front = self._make_front(self.model)
            self.front.show()
            if not info.telemetry_recorded:  # a detached run's record brings its own samples (sampled)
                self.sampler = Sampler(self.model.telemetry_source, self.model.add_sample, self.interval).start()
            self.ticker = Ticker(self.front.tick, TICK_S, "nbtrain-dashboard").start()

    def ranks_ready(self, info: RunInfo) -> None:
        self.model.set_info(info)

    def metrics(self, rank: int, records: list) -> None:
        self.model.add_metrics(rank, records)

    def setup(self, rank: int, facts: dict) -> None:
        self.model.add_setup(rank, facts)

    def hints(self) -> list:
        """The bottleneck advisor's hints from everything this dashboard measured (the summary shows them)."""
        return self.model.hints()

    def nodes_heard(self, nodes) -> None:
        self.model.set_nodes(nodes)

    def replica_groups(self, groups) -> None:
        self.model.set_replica_groups(groups)

    def sampled(self, snapshot) -> None:
        self.model.add_sample(snapshot)

    def cold_start(self, split) -> None:
        self.model.set_cold_start(f"cold start {latency(split.total_s)}")  # its split: the cell's closing line

    def run_finished(self, status: RunState, summary: str) -> None:
        self.stop()
        self.model.finish(status, summary)
        if self.front is None:
            return  # the run ended before it started (a failure while spawning): nothing was shown
        # No last sample here: the ranks may be gone already, and the sampler's last one is at most
        # one interval old.
        self.front.finish()

    def stop(self) -> None:
        for thread in (self.sampler, self.ticker):
            if thread is not None:
                thread.stop()
        self.model.telemetry_source.close()  # the Xid watcher's thread
