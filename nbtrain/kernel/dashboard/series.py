"""Series with bounded memory: a million logged steps cost what a thousand do.

:class:`BoundedSeries` keeps at most ``capacity`` buckets. While fewer points than that have arrived,
each bucket is one point. When the buckets are full, neighbours are merged pairwise (the bucket width
doubles), so the series always covers the whole run with between ``capacity/2`` and ``capacity``
buckets. Each bucket keeps the mean step, the mean wall time, the mean, the minimum and the maximum of
its values, so a downsampled curve still shows the spread (drawn as a band) and a spike is never
averaged away entirely. Adding a point is O(1) amortised.

Buckets before the last one never change until the next merge, which :attr:`BoundedSeries.merges`
counts: a reader that copied them once (the browser chart, :mod:`~nbtrain.kernel.dashboard.chart_feed`) then
needs only the buckets from the last one on, until ``merges`` moves.

Values that are not finite (NaN, inf) are not put into buckets — they would poison the means — but
the first step where one appeared is remembered (:attr:`BoundedSeries.first_nonfinite_step`); the run
summary reports it, as a diverged loss is worth a sentence.

The notebook's ``history`` keeps every point; these series exist only to draw.
"""

from __future__ import annotations

import math

DEFAULT_CAPACITY = 1000
DEFAULT_SMOOTHING = 0.6  # the weight of the moving average drawn over each curve, live and in the final figure
# Smooth dense series only: a curve logged every epoch would lag far behind its own points. The live chart is
# sent these two numbers (theme.chart_style), so it smooths exactly the series the final figure smooths.
SMOOTH_MIN_POINTS = 10  # more buckets than this
SMOOTH_DENSE_SHARE = 0.25  # and at least this share of the buckets of the longest series drawn


def worth_smoothing(points: int, most_points: int) -> bool:
    """Whether a series of ``points`` buckets is smoothed, beside a longest one of ``most_points``."""
    return points > SMOOTH_MIN_POINTS and points >= most_points * SMOOTH_DENSE_SHARE


class BoundedSeries:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 4:
            raise ValueError(f"a series needs a capacity of at least 4 buckets (got {capacity})")
        self.capacity = capacity - capacity % 2
        self.width = 1  # points per full bucket
        self.merges = 0  # times the buckets were merged pairwise (every bucket changed)
        self.steps: list[float] = []  # mean step of each bucket
        self.times: list[float] = []  # mean wall time (unix seconds) of each bucket
        self.means: list[float] = []
        self.mins: list[float] = []
        self.maxs: list[float] = []
        self.counts: list[int] = []
        self.count = 0  # finite points seen in all
        self.last_step: float | None = None
        self.last_value: float | None = None
        self.first_nonfinite_step: float | None = None

    def __len__(self) -> int:
        return len(self.means)

    def add(self, step: float, value: float, when: float = 0.0) -> None:
        value = float(value)
        self.last_step, self.last_value = step, value
        if not math.isfinite(value):
            if self.first_nonfinite_step is None:
                self.first_nonfinite_step = step
            return
        self.count += 1
        if self.counts and self.counts[-1] < self.width:
            n = self.counts[-1]
            self.steps[-1] += (step - self.steps[-1]) / (n + 1)
            self.times[-1] += (when - self.times[-1]) / (n + 1)
            self.means[-1] += (value - self.means[-1]) / (n + 1)
            self.mins[-1] = min(self.mins[-1], value)
            self.maxs[-1] = max(self.maxs[-1], value)
            self.counts[-1] = n + 1
            return
        self.steps.append(float(step))
        self.times.append(float(when))
        self.means.append(value)
        self.mins.append(value)
        self.maxs.append(value)
        self.counts.append(1)
        if len(self.counts) >= self.capacity:
            self._halve()

    def _halve(self) -> None:
        """Merge neighbouring buckets pairwise; the last bucket may be partly filled and stays last."""
        steps, times, means, mins, maxs, counts = [], [], [], [], [], []
        for i in range(0, len(self.counts) - 1, 2):
            a, b = self.counts[i], self.counts[i + 1]
            total = a + b
            steps.append((self.steps[i] * a + self.steps[i + 1] * b) / total)
            times.append((self.times[i] * a + self.times[i + 1] * b) / total)
            means.append((self.means[i] * a + self.means[i + 1] * b) / total)
            mins.append(min(self.mins[i], self.mins[i + 1]))
            maxs.append(max(self.maxs[i], self.maxs[i + 1]))
            counts.append(total)
        self.steps, self.means, self.mins, self.maxs, self.counts = steps, means, mins, maxs, counts
        self.times = times
        self.width *= 2
        self.merges += 1

    @property
    def finite_min(self) -> float | None:
        return min(self.mins) if self.mins else None

    @property
    def finite_max(self) -> float | None:
        return max(self.maxs) if self.maxs else None

    def arrays(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """Copies of (steps, means, mins, maxs), safe to draw while points keep arriving."""
        return list(self.steps), list(self.means), list(self.mins), list(self.maxs)

    def columns(self, start: int = 0) -> tuple[list[float], ...]:
        """Copies of the buckets from ``start`` on: (steps, times, means, mins, maxs)."""
        return (self.steps[start:], self.times[start:], self.means[start:], self.mins[start:], self.maxs[start:])


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average with the start-up bias removed (as TensorBoard smooths).

    ``weight`` 0 returns the values; 0.9 averages over roughly the last ten points.
    """
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1) (got {weight})")
    if weight == 0 or not values:
        return list(values)
    out, last, debias = [], 0.0, 1.0
    for value in values:
        last = last * weight + (1 - weight) * value
        debias *= weight
        out.append(last / (1 - debias))
    return out
