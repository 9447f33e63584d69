"""A rank stopped by its kernel sends what it logged last, whatever its training thread was doing."""

from __future__ import annotations

import threading
import time

from nbtrain.rank.train import metrics


class SlowSend:
    """The kernel's channel: records every batch; the first send can be held until released."""

    def __init__(self, hold_first: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.sending = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, message) -> None:
        self.sending.set()
        self.release.wait(5)
        self.batches.append([values["i"] for _, _, values in message.records])


def test_the_last_flush_does_not_wait_for_a_log_call_it_interrupted():
    send = SlowSend()
    with metrics.scope(0, send, {}) as sink:
        for i in range(5):
            sink.log({"i": i}, None)
        with sink._lock:  # the SIGTERM handler runs on the training thread, inside log()'s counter update
            started = time.monotonic()
            metrics.flush_before_exit(wait=2.0)
            took = time.monotonic() - started
        assert [i for batch in send.batches for i in batch] == [0, 1, 2, 3, 4]
        assert took < 1.0


def test_the_last_flush_comes_after_a_flush_under_way():
    send = SlowSend(hold_first=True)
    with metrics.scope(0, send, {}) as sink:
        sink.log({"i": 0}, None)
        periodic = threading.Thread(target=sink.flush)
        periodic.start()
        assert send.sending.wait(5)
        sink.log({"i": 1}, None)
        threading.Timer(0.2, send.release.set).start()
        metrics.flush_before_exit(wait=2.0)
        periodic.join(5)
        assert send.batches == [[0], [1]]


def test_the_last_flush_gives_up_within_its_wait():
    send = SlowSend(hold_first=True)
    with metrics.scope(0, send, {}) as sink:
        sink.log({"i": 0}, None)
        threading.Thread(target=sink.flush, daemon=True).start()
        assert send.sending.wait(5)
        started = time.monotonic()
        metrics.flush_before_exit(wait=0.3)
        assert time.monotonic() - started < 1.0
        send.release.set()
