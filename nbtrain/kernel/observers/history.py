"""History: every series a run logged with ``nbtrain.log``, kept in the kernel and handed to the notebook.

``history["loss"]`` is rank 0's series; ``history.series("loss", rank=1)`` another rank's;
``history.mean("loss")`` the mean over ranks at each step — all three are a :class:`Series`: ``.steps``,
``.values``, ``.times``, and itself a sequence of its values (``len``, indexing, iteration, NumPy's
``__array__``), so ``plt.plot(history["loss"])`` and ``max(history["loss"])`` work as on a list.
Nothing is dropped here: the dashboard downsamples for drawing, the history keeps every point.

The notebook gets it on every ending: ``history`` is set after a run that finished, failed or was
stopped (when anything was logged), and the exception of a failed or stopped run carries it as
``.history``. A run resumed from a checkpoint starts with the series saved in it (see
:mod:`nbtrain.rank.train.checkpoint`), so its ``history`` holds the whole curve of every attempt.

``nbtrain.log(total_steps=N)`` is not a series: it tells the dashboard how long the run is (its ETA), and
the history keeps it as :attr:`History.total_steps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...wire.protocol import ProfileSummary
from .coldstart import ColdStart
from .cost import Metering


@dataclass
class Series:
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index):
        """``series[i]``: the i-th value; ``series[a:b]``: a Series of those points."""
        if isinstance(index, slice):
            return Series(self.steps[index], self.values[index], self.times[index])
        return self.values[index]

    def __iter__(self):
        return iter(self.values)

    def __array__(self, dtype=None, copy=None):
        import numpy

        return numpy.asarray(self.values, dtype=dtype)

    @property
    def last(self) -> float | None:
        return self.values[-1] if self.values else None


TOTAL_STEPS = "total_steps"  # the name nbtrain.log() reserves for the run's length


class History:
    def __init__(self) -> None:
        self._data: dict[str, dict[int, Series]] = {}
        self.total_steps: int | None = None  # the last nbtrain.log(total_steps=N)

    def add(self, rank: int, records) -> None:
        for step, when, values in records:
            for name, value in values.items():
                if name == TOTAL_STEPS:
                    self.total_steps = int(value) if value and value > 0 else None
                    continue
                series = self._data.setdefault(name, {}).setdefault(rank, Series())
                series.steps.append(step)
                series.values.append(value)
                series.times.append(when)

    def copy(self) -> History:
        """A history that goes on from this one's points without changing it (a session's next cell)."""
        other = History()
        other._data = {name: {rank: s[:] for rank, s in by_rank.items()} for name, by_rank in self._data.items()}
        other.total_steps = self.total_steps
        return other

    @property
    def names(self) -> list[str]:
        return list(self._data)

    def ranks(self, name: str) -> list[int]:
        return sorted(self._data.get(name, {}))

    def series(self, name: str, rank: int | None = None) -> Series:
        by_rank = self._data[name]
        return by_rank[rank if rank is not None else min(by_rank)]

    def __getitem__(self, name: str) -> Series:
        return self.series(name)

    def __contains__(self, name: str) -> bool:
        return name in self._data

    def __len__(self) -> int:
        return len(self._data)

    def mean(self, name: str) -> Series:
        """Mean over the ranks that logged ``name`` at each step: a :class:`Series` (without times)."""
        sums: dict[int, list[float]] = {}
        for series in self._data[name].values():
            for step, value in zip(series.steps, series.values, strict=True):
                sums.setdefault(step, []).append(value)
        out = Series()
        for step in sorted(sums):
            out.steps.append(step)
            out.values.append(sum(sums[step]) / len(sums[step]))
        return out

    def to_dict(self) -> dict[str, dict[int, dict[str, list]]]:
        return {name: {rank: {"steps": s.steps, "values": s.values, "times": s.times} for rank, s in by_rank.items()}
                for name, by_rank in self._data.items()}

    def __repr__(self) -> str:
        parts = [f"{name}: {len(self.series(name))} points, last {self.series(name).last:.4g}" for name in self._data]
        return "History(" + "; ".join(parts) + ")" if parts else "History(empty)"


@dataclass
class RunOutcome:
    """What a run leaves its caller whatever way it ends — a result, a failure or the stop button: the series
    the ranks logged until then, and what it held. The caller passes one in (``run_source(..., outcome=...)``)
    and reads it after."""

    history: History = field(default_factory=History)
    metering: Metering | None = None  # what the run held: GPUs or cores, and their price (None: no rank was asked for)

    def record(self, history: History, metering: Metering) -> None:
        """What the run logged until it ended, and what it held (the run calls it once, however it ends)."""
        self.history, self.metering = history, metering


@dataclass
class RunResult:
    """What a successful run brought back, and how it went."""

    returned: tuple[str, ...]
    skipped: dict[str, str]
    moved_to_cpu: tuple[str, ...]
    seconds: float
    rank_seconds: dict[int, float]
    devices: dict[int, str]
    warm: bool
    backend: str
    history: History = field(default_factory=History)
    notes: list[str] = field(default_factory=list)
    profiles: dict[int, ProfileSummary] = field(default_factory=dict)  # --profile, by rank
    setup: dict[int, list[dict]] = field(default_factory=dict)  # per rank: what prepare() set up, model by model
    metering: Metering | None = None  # what the run held: GPUs or cores, and their price
    cold_start: ColdStart | None = None  # new ranks on this machine: where the time to the first step went
    shared_bytes: int = 0  # the inputs written to shared memory before the ranks got the job
    pack_seconds: float = 0.0  # how long the inputs took to pack (those writes included), before the run's seconds

    def finished_after(self, seconds: float, note: str) -> RunResult:
        """This result, timed from the first attempt, with a note on how it got there (restarts)."""
        return replace(self, seconds=seconds, notes=[*self.notes, note])
