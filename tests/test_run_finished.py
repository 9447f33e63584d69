"""``run_finished`` is announced once per run, however it ends: real ranks on gloo, an observer that counts."""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.observers.events import RunObserver, RunState


class Endings(RunObserver):
    def __init__(self) -> None:
        self.endings: list[RunState] = []

    def run_finished(self, status: RunState, summary: str) -> None:
        self.endings.append(status)


class StopOn(Captured):
    """The cell's output, with the stop button pressed (KeyboardInterrupt in the kernel) once ``marker`` shows."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.pressed = marker, False

    def __call__(self, stream: str, text: str) -> None:
        super().__call__(stream, text)
        if self.marker in text and not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt


def test_a_successful_cell_announces_its_end_once(fresh_pools):
    endings = Endings()
    run_cell(fresh_pools, "x = 1", observers=[endings])
    assert endings.endings == [RunState.FINISHED]


def test_a_failing_cell_announces_its_end_once(fresh_pools):
    endings = Endings()
    with pytest.raises(RankFailedError):
        run_cell(fresh_pools, "raise ValueError('bad batch')", observers=[endings])
    assert endings.endings == [RunState.FAILED]


def test_a_stopped_cell_announces_its_end_once(fresh_pools):
    endings = Endings()
    with pytest.raises(KeyboardInterrupt):
        run_cell(fresh_pools, "import time\nprint('working', flush=True)\ntime.sleep(60)", observers=[endings],
                 write=StopOn("working"))
    assert endings.endings == [RunState.INTERRUPTED]


def test_a_stop_while_a_failure_is_being_reported_still_announces_the_end_once(fresh_pools):
    """Stop pressed while the failed run's last output is shown (after its loop ended: rank 0's unfinished line
    is shown as its ranks are torn down): the run still ends once."""
    endings = Endings()
    cell = """
        import sys, time
        import torch.distributed as dist
        if dist.get_rank() == 1:
            time.sleep(0.2)
            raise ValueError('bad batch')
        print('still here', end='', flush=True)
        time.sleep(60)
    """
    with pytest.raises(KeyboardInterrupt):
        run_cell(fresh_pools, cell, observers=[endings], write=StopOn("still here"))
    assert endings.endings == [RunState.INTERRUPTED]


class PressedAgainWhileDrawing(Endings):
    """The final picture takes a moment to draw, and the user presses stop again meanwhile (a real SIGINT)."""

    drawn = False

    def run_finished(self, status: RunState, summary: str) -> None:
        super().run_finished(status, summary)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)  # the handler runs here, in the middle of the drawing
        self.drawn = True


def test_a_second_press_while_the_stopped_runs_picture_is_drawn_does_not_interrupt_it(fresh_pools):
    drawing = PressedAgainWhileDrawing()
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_cell(fresh_pools, "import time\nprint('working', flush=True)\ntime.sleep(60)", observers=[drawing],
                 write=StopOn("working"))
    assert drawing.drawn and drawing.endings == [RunState.INTERRUPTED]
    assert "stopped by the user" in stopped.value._render_traceback_()[0]  # the stop's own words, no traceback


def test_a_press_as_a_finished_runs_picture_is_drawn_leaves_the_result(fresh_pools):
    drawing = PressedAgainWhileDrawing()
    ns, _ = run_cell(fresh_pools, "x = 41 + 1", observers=[drawing])
    assert drawing.drawn and drawing.endings == [RunState.FINISHED] and ns["x"] == 42
