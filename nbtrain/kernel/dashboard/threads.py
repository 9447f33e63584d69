"""The dashboard's two background threads: the sampler (data) and the ticker (drawing).

Both are daemon threads that wake on a fixed period and stop within one period of :meth:`stop`. They
run in a copy of the starting thread's :mod:`contextvars` context, so ipykernel (which keeps the
current cell's message header in a context variable) attributes their widget messages to the cell that
started them.

* :class:`Sampler` takes a :class:`~nbtrain.gpu.telemetry.Telemetry` snapshot every ``interval``
  seconds (:data:`DEFAULT_INTERVAL_S`, settable between :data:`MIN_INTERVAL_S` and
  :data:`MAX_INTERVAL_S`) and hands it to a callback — its first :data:`QUICK_SAMPLES` every
  :data:`MIN_INTERVAL_S`, so that a run of a few seconds (the quickstart trains for about one) still draws
  its load as a line, not a lone point. A failing snapshot is remembered, not raised: telemetry must never
  take the kernel down.
* :class:`Ticker` calls a function every period (the dashboard uses 0.25 s: at most four updates a
  second); the function decides whether anything changed.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T", bound="Ticker")
DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.25
MAX_INTERVAL_S = 5.0
QUICK_SAMPLES = 8  # a run's first samples, MIN_INTERVAL_S apart: two seconds of load drawn at four points a second


def check_interval(seconds: float) -> float:
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"the sampling interval is a number of seconds, such as 1 or 0.5 (got {seconds!r})") from None
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise ValueError(f"the sampling interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} seconds "
                         f"(got {seconds:g}); 1 s is the default")
    return seconds


class Ticker:
    """Calls ``fn()`` every ``period`` seconds on a daemon thread until :meth:`stop`."""

    def __init__(self, fn: Callable[[], None], period: float, name: str) -> None:
        self.fn, self.period, self.name = fn, period, name
        self.errors = 0
        self.last_error: BaseException | None = None
        self.cpu_seconds = 0.0  # CPU time this thread has used so far (for the cost benchmark)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self: _T) -> _T:
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._loop,), name=self.name, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        if self._stop.wait(self.first_delay()):
            return
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.fn()
            except Exception as exc:  # keep ticking: one bad sample or frame must not end the dashboard
                self.errors += 1
                self.last_error = exc
            self.cpu_seconds = time.thread_time()
            next_at += self.next_period()
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow frame): skip, do not burst
                next_at, delay = time.monotonic(), 0
            self._stop.wait(delay)

    def first_delay(self) -> float:
        """Seconds before the first call of ``fn`` (a wait :meth:`stop` ends)."""
        return 0.0

    def next_period(self) -> float:
        """Seconds from this call of ``fn`` to the next."""
        return self.period

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(2.0, 2 * self.period))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


class Sampler(Ticker):
    """Telemetry every ``interval`` seconds (the first :data:`QUICK_SAMPLES` quicker), delivered to
    ``on_sample(snapshot)``."""

    def __init__(self, telemetry, on_sample: Callable[[Any], None], interval: float = DEFAULT_INTERVAL_S) -> None:
        self.telemetry = telemetry
        self.on_sample = on_sample
        self.taken = 0
        super().__init__(self._sample, check_interval(interval), "nbtrain-telemetry")

    def first_delay(self) -> float:
        # the first snapshot would sleep until the machine's CPU has a reading: waited here, a run that ends
        # meanwhile stops the sampler at once (its end joins this thread; the sleep cost each short cell 0.1 s)
        return self.telemetry.first_sample_in()

    def _sample(self) -> None:
        self.taken += 1
        self.on_sample(self.telemetry.snapshot())

    def next_period(self) -> float:
        return min(self.period, MIN_INTERVAL_S) if self.taken < QUICK_SAMPLES else self.period
