"""What the ranks logged, as the dashboard keeps it: bounded series, speed, and progress.

:class:`MetricStore` receives the records of ``nbtrain.log`` (``(step, unix_time, {name: value})`` per
rank, as :meth:`RunObserver.metrics` delivers them) and keeps, per name and rank, a
:class:`~nbtrain.kernel.dashboard.series.BoundedSeries`. Adding is cheap (it runs on the kernel's main thread
while the run loop waits for events); drawing reads copies under the same lock.

Speed and progress:

* A rank's **progress series** is the name it logged most often (the training loss, typically); its
  latest step is the rank's step, and steps per second are measured over the last
  :data:`RATE_WINDOW_S` seconds of the ranks' own clocks (the records' times), so a slow kernel does not
  distort them.
* **Total steps** (for the ETA): log it once, from any rank — ``nbtrain.log(total_steps=len(loader) *
  epochs)``. The name ``total_steps`` is reserved for this: it is not drawn, and the dashboard shows
  ``step / total``, the fraction done and the time left. It also appears in ``history`` like any
  logged value.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from .series import DEFAULT_CAPACITY, BoundedSeries

TOTAL_STEPS = "total_steps"
RATE_WINDOW_S = 20.0


@dataclass
class _RankProgress:
    counts: dict[str, int] = field(default_factory=dict)
    # per name: recent (time, step) marks, one per delivered batch, for steps per second
    marks: dict[str, deque] = field(default_factory=dict)

    def main_name(self) -> str | None:
        return max(self.counts, key=lambda name: self.counts[name]) if self.counts else None


class MetricStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._series: dict[str, dict[int, BoundedSeries]] = {}
        self._progress: dict[int, _RankProgress] = {}
        self.total_steps: int | None = None
        self.version = 0  # bumped on every change: the views redraw only when it moved

    def add(self, rank: int, records) -> None:
        with self._lock:
            progress = self._progress.setdefault(rank, _RankProgress())
            latest: dict[str, tuple[float, int]] = {}
            for step, when, values in records:
                for name, value in values.items():
                    if name == TOTAL_STEPS:
                        self.total_steps = int(value) if value and value > 0 else None
                        continue
                    by_rank = self._series.setdefault(name, {})
                    series = by_rank.get(rank)
                    if series is None:
                        series = by_rank[rank] = BoundedSeries(self.capacity)
                    series.add(step, value, when)
                    progress.counts[name] = progress.counts.get(name, 0) + 1
                    latest[name] = (when, step)
            for name, mark in latest.items():
                marks = progress.marks.setdefault(name, deque(maxlen=256))
                marks.append(mark)
                while marks and mark[0] - marks[0][0] > RATE_WINDOW_S:
                    marks.popleft()
            self.version += 1

    @property
    def names(self) -> list[str]:
        with self._lock:
            return list(self._series)

    def series(self, name: str, rank: int | None = None) -> BoundedSeries | None:
        """``rank``'s series of ``name`` (rank 0's, or the lowest rank's, by default)."""
        with self._lock:
            by_rank = self._series.get(name)
            if not by_rank:
                return None
            return by_rank.get(rank if rank is not None else min(by_rank))

    def snapshot_series(self) -> dict[str, tuple[list, list, list, list, int]]:
        """Per name, the default rank's ``(steps, means, mins, maxs, bucket width)``: copies to draw from."""
        with self._lock:
            out = {}
            for name, by_rank in self._series.items():
                series = by_rank[min(by_rank)]
                out[name] = (*series.arrays(), series.width)
            return out

    def chart_columns(self, since: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int, int, tuple]]:
        """What a reader that holds some buckets still lacks, per name (default rank).

        ``since``: name → ``(merges, start)`` as the reader last saw them. Returns name → ``(merges,
        start, length, columns from start)``; ``start`` is 0 when the buckets were merged since (or
        the name is new), so the reader replaces what it holds.
        """
        with self._lock:
            out = {}
            for name, by_rank in self._series.items():
                series = by_rank[min(by_rank)]
                merges, start = since.get(name, (-1, 0))
                start = start if merges == series.merges else 0
                out[name] = (series.merges, start, len(series), series.columns(start))
            return out

    def _progress_marks(self, rank: int) -> deque | None:
        """The (time, step) marks of ``rank``'s progress series; the caller holds the lock."""
        progress = self._progress.get(rank)
        name = progress.main_name() if progress else None
        return progress.marks.get(name) if progress and name else None

    def rank_step(self, rank: int) -> int | None:
        with self._lock:
            marks = self._progress_marks(rank)
            return marks[-1][1] if marks else None

    def steps_per_second(self, rank: int) -> float | None:
        with self._lock:
            marks = self._progress_marks(rank)
            if not marks or len(marks) < 2:
                return None
            (t0, s0), (t1, s1) = marks[0], marks[-1]
            return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    @property
    def ranks(self) -> list[int]:
        with self._lock:
            return sorted(self._progress)

    def nonfinite(self) -> dict[str, float]:
        """Names whose (default rank's) values became NaN or infinite, with the first such step."""
        with self._lock:
            found = {}
            for name, by_rank in self._series.items():
                step = by_rank[min(by_rank)].first_nonfinite_step
                if step is not None:
                    found[name] = step
            return found
