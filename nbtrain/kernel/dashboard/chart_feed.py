"""What the browser chart is sent: the logged series as a *base* and a *tail*, so each update carries only news.

The kernel keeps each series downsampled (:class:`~nbtrain.kernel.dashboard.series.BoundedSeries`: at most
``capacity`` min–max buckets per series, whatever the number of steps). The chart in the browser needs
the same buckets, but sending them all two or four times a second would cost the kernel a copy and an
encoding of every bucket each time. Instead:

* the **base** holds, per series, the buckets that will not change any more (all but the last, which
  may still be filling), tagged with an ``epoch``;
* the **tail** holds, per series, every bucket after the base's: the new ones and the one still filling.

The browser draws ``base + tail``. An update is one message with the new tail, whose size is bounded by
:data:`REBASE_AFTER` buckets per series: past that, or when a series' buckets were merged (which changes
every bucket: the run doubled in length), or when a new name was logged, the base is sent again with the
next epoch. For a run of 10^6 steps that is a few dozen bases in all; everything else is small tails.

Earlier runs of the kernel (:meth:`~nbtrain.kernel.observers.runlog.RunLog.earlier`), which the chart draws faded beside
this one, travel once, with the first update (:attr:`Update.overlays`): rank 0's series of each, reduced to
at most :data:`OVERLAY_POINTS` means per series (their steps and times too), and the words that say what
differed from this run.

Columns travel as little-endian float64 bytes (ipywidgets sends ``bytes`` as binary buffers: no JSON
number formatting in the kernel, a ``Float64Array`` view in the browser). This module knows nothing of
widgets: :meth:`ChartFeed.poll` returns plain dicts, so it is tested without a kernel.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from .metric_store import MetricStore
from .plotting import group_names, panel_title

REBASE_AFTER = 256  # buckets in one series' tail before its base is sent again
COLUMNS = ("step", "time", "mean", "min", "max")
OVERLAY_POINTS = 500  # means per series of an earlier run: its shape, at a fixed cost


def pack(values) -> bytes:
    """float64 little-endian bytes of ``values`` (what the browser reads as a ``Float64Array``)."""
    packed = array("d", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack(data: bytes) -> list[float]:
    values = array("d")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


@dataclass
class Update:
    """One change for the chart: a new tail, and a new base when one is due (``None`` otherwise)."""

    tail: dict
    base: dict | None = None
    overlays: dict | None = None  # with the first update only: the earlier runs to draw beside this one


def reduced(steps: Sequence[float], values: Sequence[float], times: Sequence[float],
            points: int = OVERLAY_POINTS) -> dict:
    """A series as at most ``points`` means of consecutive finite values (with their mean step and time), packed."""
    finite = [(s, v, t) for s, v, t in zip(steps, values, times, strict=True) if math.isfinite(v)]
    width = max(1, math.ceil(len(finite) / points))
    columns: dict[str, list[float]] = {"step": [], "time": [], "mean": []}
    for start in range(0, len(finite), width):
        chunk = finite[start:start + width]
        for key, column in zip(("step", "mean", "time"), zip(*chunk, strict=True), strict=True):
            columns[key].append(sum(column) / len(chunk))
    return {key: pack(column) for key, column in columns.items()}


def overlays_of(earlier) -> dict:
    """What the chart needs of the earlier runs (:class:`~nbtrain.kernel.observers.runlog.EarlierRun`): rank 0's series."""
    runs = []
    for run in earlier:
        history = run.history
        series = {name: reduced(s.steps, s.values, s.times or [0.0] * len(s.steps))
                  for name in history.names if len(s := history.series(name))}
        runs.append({"number": run.number, "label": run.label, "series": series})
    return {"runs": runs}


class ChartFeed:
    def __init__(self, store: MetricStore, rebase_after: int = REBASE_AFTER, earlier: Sequence = ()) -> None:
        self.store = store
        self.earlier = tuple(earlier)  # earlier runs to draw beside this one; sent with the first update
        self.rebase_after = rebase_after
        self.epoch = 0
        self._based: dict[str, tuple[int, int]] = {}  # name -> (merges, buckets in the base)
        self._version = 0  # the store's version when nothing was logged yet
        self.bases = self.tails = 0  # how many of each were made (for tests and the benchmark)

    def poll(self) -> Update | None:
        """The update since the last poll, or ``None`` when nothing was logged since."""
        version = self.store.version
        if version == self._version:
            return None
        self._version = version
        columns = self.store.chart_columns(self._based)
        if not columns:
            return None  # only ``total_steps`` so far: nothing to draw
        base = None
        if self._rebase_due(columns):
            columns = self.store.chart_columns({})  # every bucket of every series, once
            base = self._base(columns)
        series = {}
        for name, (_, start, _, cols) in columns.items():
            skip = self._based[name][1] - start  # buckets the browser has in its base already
            series[name] = {key: pack(col[skip:]) for key, col in zip(COLUMNS, cols, strict=True)}
        groups = [(panel_title(key), names) for key, names in group_names(columns)]
        tail = {"epoch": self.epoch, "groups": groups, "series": series}
        overlays = overlays_of(self.earlier) if self.earlier and self.tails == 0 else None
        self.tails += 1
        return Update(tail, base, overlays)

    def _rebase_due(self, columns: dict) -> bool:
        """A new name, merged buckets, or a tail grown past :attr:`rebase_after`."""
        for name, (merges, start, length, _) in columns.items():
            based = self._based.get(name)
            if based is None or based[0] != merges or length - start > self.rebase_after:
                return True
        return False

    def _base(self, columns: dict) -> dict:
        """A new base from whole series (``columns`` fetched with nothing known)."""
        self.epoch += 1
        self.bases += 1
        series = {}
        for name, (merges, _, length, cols) in columns.items():
            closed = max(length - 1, 0)  # the last bucket may still be filling: it stays in the tail
            series[name] = {key: pack(col[:closed]) for key, col in zip(COLUMNS, cols, strict=True)}
            self._based[name] = (merges, closed)
        return {"epoch": self.epoch, "series": series}
