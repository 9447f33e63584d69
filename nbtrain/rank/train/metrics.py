"""``nbtrain.log(**values, step=None)`` inside a rank: metrics to the kernel without a sync per call.

A call only appends ``(step, time, {name: value})`` to a buffer; tensors are kept as (detached) tensors,
so logging ``loss`` on a GPU does not wait for the GPU. A background thread sends the buffer to the
kernel a few times a second (:data:`FLUSH_INTERVAL_S`), turning the tensors of a whole batch into numbers
with one stacked copy. The job's end flushes whatever is left, so no metric is lost.

``step`` defaults to a per-name counter (0, 1, 2, ... for each name) so ``log(loss=...)`` every
iteration and ``log(val_loss=...)`` every epoch both make sensible series. The counters are saved in
checkpoints (:func:`step_counters`), so a resumed run continues its curves.

``log(loss=loss, reduce="mean")`` logs the mean over all ranks (also ``"sum"``, ``"max"``, ``"min"``):
every rank must make the same call, as with any collective. The values of one call travel in one
asynchronous all-reduce (:mod:`nbtrain.rank.train.reduce`) that the sending thread waits for, so the training
loop does not wait for the GPU or the network.

Flushes are serialised, so records reach the kernel in the order they were logged, the last ones included.
A rank the kernel stops in the middle of a cell (another rank failed, a preemption's checkpoint is written, the
stop button escalated) sends what it buffered before it goes (:func:`flush_before_exit`, from its SIGTERM
handler), so the kernel's ``history`` ends where the rank's logging ended.

Each rank also keeps, compactly (:class:`LoggedSeries`), every value it has sent in this cell:
``nbtrain.save_checkpoint()`` stores what was logged since the last save (:func:`logged_since`, appended to the
checkpoint's history file: :mod:`.history_saves`), and a run resumed from that checkpoint sends it to the kernel
first (:func:`restore_history`), so the notebook's ``history`` — and the dashboard of a freshly started cell —
holds the curves of every earlier attempt, continued.
"""

from __future__ import annotations

import contextlib
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator

from ...wire.protocol import Metrics, Setup
from .reduce import reduce_values

FLUSH_INTERVAL_S = 0.25
RESTORED_BATCH = 65536  # points of a checkpoint's series a message carries: the kernel takes them a batch at a time
LAST_FLUSH_WAIT_S = 0.5  # a rank being stopped waits at most this long for its last flush

_sink: MetricsBuffer | None = None


class MetricsBuffer:
    def __init__(self, rank: int, send: Callable[[object], None]) -> None:
        self.rank = rank
        self._send = send
        self._lock = threading.Lock()  # the step counters
        self._flush_lock = threading.Lock()  # one flush at a time: batches arrive in order
        # appended and drained without a lock (deque's ends are thread-safe): the SIGTERM handler may interrupt
        # log() on the training thread, and its last flush must not wait for a lock that thread holds
        self._records: deque[tuple[int, float, dict]] = deque()
        self._counters: dict[str, int] = {}
        self._logged = LoggedSeries()  # everything sent in this cell (with what was restored)
        self._restored: deque[LoggedSeries] = deque()  # a checkpoint's series, sent before anything logged after it
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="nbtrain-metrics", daemon=True)
        self._thread.start()

    def log(self, values: dict, step: int | None) -> None:
        """Buffer one call's values (``values`` is the call's own dict: detached in place). Runs every step,
        on the rank's training thread: a few dict operations, no tensor operation but ``detach``."""
        now = time.time()
        for name, value in values.items():
            if hasattr(value, "detach"):
                values[name] = value.detach()  # do not keep graphs alive
        with self._lock:
            counters = self._counters
            step = max((counters.get(name, 0) for name in values), default=0) if step is None else int(step)
            following = step + 1
            for name in values:
                if counters.get(name, 0) < following:
                    counters[name] = following
        self._records.append((step, now, values))

    def flush(self) -> None:
        with self._flush_lock:
            self._send_buffered()

    def flush_within(self, wait: float) -> None:
        """A flush that gives up after ``wait`` seconds if another one holds the turn (the handler's last words)."""
        if self._flush_lock.acquire(timeout=wait):
            try:
                self._send_buffered()
            finally:
                self._flush_lock.release()

    def _send_buffered(self) -> None:
        while self._restored:
            for batch in self._restored.popleft().batches(RESTORED_BATCH):
                self._send(Metrics(self.rank, batch, restored=True))
        buffered = self._records
        records = [buffered.popleft() for _ in range(len(buffered))]  # what is there now; later ones wait
        if records:
            numbers = _to_numbers(records)
            self._logged.add(numbers)
            self._send(Metrics(self.rank, numbers))

    def logged_since(self, starts: dict[str, int]) -> tuple[dict[str, int], dict]:
        """After sending what is buffered: how many points each series holds (restored ones first), and each series'
        points from ``starts[name]`` on (0 for a name not in it) — ``{name: (start, steps, times, values)}``,
        copies of only those points, leaving out a series with none."""
        self.flush()
        with self._flush_lock:
            return self._logged.lengths(), self._logged.since(starts)

    def logged_names(self) -> set[str]:
        self.flush()
        with self._flush_lock:
            return set(self._logged.lengths())

    def restore_history(self, saved: dict) -> dict[str, int]:
        """A resumed run: send the checkpoint's series to the kernel (before anything logged after it). Only a
        series this cell has no point of yet is restored: a checkpoint loaded after the cell logged (the best one,
        at the end of training), or loaded twice, would otherwise put its points into ``history`` a second time.
        Returns how many points of each series were restored."""
        self.flush()
        with self._flush_lock:
            restored = LoggedSeries.from_plain(saved).without(self._logged.lengths())
            self._logged.take(restored)
            if restored.lengths():
                self._restored.append(restored)  # sent by the next flush: the resume does not wait for it
            return restored.lengths()

    def step_counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def restore_step_counters(self, counters: dict[str, int]) -> None:
        with self._lock:
            self._counters.update(counters)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(2.0)
        self.flush()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(FLUSH_INTERVAL_S)
            if not self._stop:
                try:
                    self.flush()
                except Exception:
                    return  # the kernel's connection is gone; the job's end reports why


class LoggedSeries:
    """Per name, every (step, time, value) logged: three flat arrays, 24 bytes a point."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[array, array, array]] = {}

    def add(self, records) -> None:
        for step, when, values in records:
            for name, value in values.items():
                steps, times, numbers = self._data.setdefault(name, (array("q"), array("d"), array("d")))
                steps.append(step)
                times.append(when)
                numbers.append(value)

    def batches(self, size: int | None) -> Iterator[list[tuple[int, float, dict[str, float]]]]:
        """The points as records, ``size`` at a time (None: a series at a time), made as they are asked for."""
        for name, (steps, times, values) in self._data.items():
            step = size or len(steps) or 1
            for start in range(0, len(steps), step):
                yield [(s, t, {name: v}) for s, t, v in zip(steps[start:start + step], times[start:start + step],
                                                            values[start:start + step], strict=True)]

    def without(self, names) -> LoggedSeries:
        """These series less the names in ``names``, and less empty ones."""
        kept = LoggedSeries()
        kept._data = {name: columns for name, columns in self._data.items() if name not in names and columns[0]}
        return kept

    def take(self, other: LoggedSeries) -> None:
        """Add ``other``'s series, none of which this one has (:meth:`without`)."""
        self._data.update(other._data)

    def lengths(self) -> dict[str, int]:
        return {name: len(steps) for name, (steps, _, _) in self._data.items()}

    def since(self, starts: dict[str, int]) -> dict[str, tuple[int, array, array, array]]:
        chosen = {name: (min(starts.get(name, 0), len(steps)), steps, times, values)
                  for name, (steps, times, values) in self._data.items()}
        return {name: (start, steps[start:], times[start:], values[start:])
                for name, (start, steps, times, values) in chosen.items() if start < len(steps)}

    @classmethod
    def from_plain(cls, saved: dict) -> LoggedSeries:
        logged = cls()
        for name, columns in (saved or {}).items():
            logged._data[name] = (_column("q", columns["steps"]), _column("d", columns["times"]),
                                  _column("d", columns["values"]))
        return logged


def _column(typecode: str, saved) -> array:
    """A saved column back as an array: one read from a history file, a tensor (checkpoints that held their series
    themselves), or a list (those written before tensors)."""
    if isinstance(saved, array) and saved.typecode == typecode:
        return saved
    if hasattr(saved, "numpy"):
        column = array(typecode)
        column.frombytes(saved.cpu().contiguous().numpy().tobytes())  # loaded onto the rank's GPU with the rest
        return column
    return array(typecode, saved)


def _to_numbers(records: list[tuple[int, float, dict]]) -> list[tuple[int, float, dict[str, float]]]:
    """Convert every tensor of the batch to a float: on the CPU one by one (there is nothing to wait for, and
    a tensor's ``item()`` is cheaper than stacking it), on a GPU with one device-to-host copy per device."""
    if any(hasattr(v, "wait_value") for _, _, values in records for v in values.values()):
        records = [(step, when, {k: v.wait_value() if hasattr(v, "wait_value") else v for k, v in values.items()})
                   for step, when, values in records]  # all-reduced values: wait for their collectives here
    tensors = [v for _, _, values in records for v in values.values() if hasattr(v, "detach")]
    converted: dict[int, float] = {}
    if tensors:
        by_device: dict = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t)
        for device, group in by_device.items():
            converted.update(zip(map(id, group), _device_values(device, group), strict=True))
    out = []
    for step, when, values in records:
        out.append((step, when, {k: converted[id(v)] if id(v) in converted else float(v) for k, v in values.items()}))
    return out


def _device_values(device, group: list) -> list[float]:
    """One number per tensor of ``group`` (all on ``device``): the value of a one-element tensor, else the mean."""
    if device.type == "cpu":
        return [float(t.item()) if t.numel() == 1 else t.float().mean().item() for t in group]
    import torch

    if all(t.dim() == 0 and t.dtype == group[0].dtype for t in group):  # the usual case: a loss per step
        return torch.stack(group).float().cpu().tolist()
    return torch.stack([t.reshape(-1)[0].float() if t.numel() == 1 else t.float().mean() for t in group]).cpu().tolist()


@contextlib.contextmanager
def scope(rank: int, send: Callable[[object], None], counters: dict[str, int]) -> Iterator[MetricsBuffer]:
    """A cell's logging (the worker enters it around each cell): its step counters go on from ``counters``; what
    it logged is sent before the scope ends."""
    global _sink
    _sink = MetricsBuffer(rank, send)
    _sink.restore_step_counters(counters)
    try:
        yield _sink
    finally:
        sink, _sink = _sink, None
        sink.close()


def flush_before_exit(wait: float = LAST_FLUSH_WAIT_S) -> None:
    """The kernel stops this rank now: send what is buffered, within ``wait``. Called from the SIGTERM handler,
    which may have interrupted ``log()`` or a send holding a lock: the flush runs in a thread the handler waits
    for at most ``wait``, so the rank still goes if it cannot."""
    sink = _sink
    if sink is None:
        return
    sending = threading.Thread(target=_flush_quietly, args=(sink, wait), name="nbtrain-last-metrics", daemon=True)
    sending.start()
    sending.join(wait)


def _flush_quietly(sink: MetricsBuffer, wait: float) -> None:
    try:
        sink.flush_within(wait)
    except Exception:
        pass  # the kernel's connection is gone: nobody to tell


def send_setup(facts: dict) -> None:
    """Tell the kernel what prepare() set up (a :class:`~nbtrain.wire.protocol.Setup`); nothing outside a cell."""
    if _sink is not None:
        _sink._send(Setup(_sink.rank, dict(facts)))


def log_own(step: int | None, values: dict[str, float]) -> None:
    """Series nbtrain measures or hears on the rank (``tflops``, ``mfu``; what a Trainer logs,
    :mod:`nbtrain.rank.integrations`): logged inside a cell, dropped outside. ``step`` None: each name's next."""
    if _sink is not None:
        _sink.log(values, step)


def step_counters() -> dict[str, int]:
    """The next default step of each metric name (saved in checkpoints)."""
    return _sink.step_counters() if _sink is not None else {}


def restore_step_counters(counters: dict[str, int]) -> None:
    if _sink is not None:
        _sink.restore_step_counters(counters)


def logged_since(starts: dict[str, int]) -> tuple[dict[str, int], dict]:
    """How many points each series this rank logged holds, and the points from ``starts`` on (saved in checkpoints:
    :meth:`MetricsBuffer.logged_since`)."""
    return _sink.logged_since(starts) if _sink is not None else ({}, {})


def logged_names() -> set[str]:
    """The series this rank has points of in this cell (logged or restored)."""
    return _sink.logged_names() if _sink is not None else set()


def restore_history(saved: dict | None) -> dict[str, int]:
    """The checkpoint's series this cell has no point of yet, to the kernel; how many points of each it restored."""
    return _sink.restore_history(saved) if _sink is not None and saved else {}


def log(step: int | None = None, reduce: str | None = None, **values) -> None:
    """Record metrics for the dashboard and the notebook's ``history`` (inside a ``%%distributed`` cell).

    ``reduce="mean"`` (or ``"sum"``, ``"max"``, ``"min"``) logs the value over all ranks; every rank must call it.
    """
    if _sink is None:
        raise RuntimeError("nbtrain.log() records metrics of a %%distributed cell; call it inside one.")
    if not values:
        raise TypeError("nbtrain.log() needs at least one name=value, such as nbtrain.log(loss=loss)")
    for name, value in values.items():
        if not (isinstance(value, (int, float)) or hasattr(value, "detach") or hasattr(value, "__float__")):
            raise TypeError(f"nbtrain.log({name}=...) takes a number or a tensor, not {type(value).__name__}")
    if reduce is not None:
        values = reduce_values(values, reduce)
    _sink.log(values, step)
