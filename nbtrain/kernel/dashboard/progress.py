"""How far a run is: rank 0's step, its speed, and the time left — numbers only, for every view.

Computed from the :class:`~nbtrain.kernel.dashboard.metric_store.MetricStore` and the elapsed time; the run
panel, the terminal status line and the summary paragraph all show the same :class:`Progress`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .metric_store import MetricStore


@dataclass(frozen=True)
class Progress:
    elapsed: float
    step: int | None  # steps done by the leading rank (its latest logged step + 1)
    total: int | None
    steps_per_second: float | None
    eta: float | None  # seconds left at the current speed

    @property
    def fraction(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return min(self.step / self.total, 1.0)


def progress(store: MetricStore, elapsed: float) -> Progress:
    ranks = store.ranks
    lead = 0 if 0 in ranks else (ranks[0] if ranks else None)
    last = store.rank_step(lead) if lead is not None else None
    step = None if last is None else last + 1
    speed = store.steps_per_second(lead) if lead is not None else None
    total = store.total_steps
    eta = None
    if total and step is not None and speed and speed > 0:
        eta = max(total - step, 0) / speed
    return Progress(elapsed, step, total, speed, eta)
