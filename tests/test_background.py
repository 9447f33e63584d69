"""``%%distributed --background`` in a real kernel (jupyter_client; 2 CPU ranks on gloo): the cell returns at once
while its ranks train, later cells run meanwhile with their own output, the run's output stays in its cell, its
names arrive between cells, ``run.stop()`` from another cell stops it, and a cell reading its names early is warned."""

from __future__ import annotations

import contextlib
import time

import pytest
from helpers.kernelhelp import Kernel
from helpers.outputs import output_text
from helpers.workers import assert_no_workers

from nbtrain.kernel.background.arrivals import _read_before_waiting
from nbtrain.kernel.request.cell import analyse_cell

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRAINING = """%%distributed 2 --cpu --background --no-dashboard
import time, torch, nbtrain
w = torch.zeros(3)
for step in range(STEPS):
    w += 1
    nbtrain.log(loss=1.0 / (step + 1))
    if rank == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.05)
total = float(w.sum())
"""


class Recorder:
    """A kernel whose iopub messages are all kept, by the request they answer (``parent_header.msg_id``)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.by_request: dict[str, list[str]] = {}

    def drain(self, seconds: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                msg = self.kernel.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except Exception:
                return
            parent = msg["parent_header"].get("msg_id", "")
            self.by_request.setdefault(parent, []).append(output_text(msg["msg_type"], msg["content"]))
            if time.monotonic() > deadline:
                return

    def run(self, code: str, timeout: float = 60) -> tuple[str, dict, float]:
        """Execute ``code`` until its reply; (request id, reply content, seconds it took)."""
        began = time.monotonic()
        msg_id = self.kernel.kc.execute(code)
        while True:
            self.drain(0.1)
            try:
                reply = self.kernel.kc.get_shell_msg(timeout=0.05)
            except Exception:
                if time.monotonic() - began > timeout:
                    raise TimeoutError(f"no reply to {code[:40]!r}") from None
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                self.drain(0.3)
                return msg_id, reply["content"], time.monotonic() - began

    def text(self, msg_id: str) -> str:
        return "".join(self.by_request.get(msg_id, []))

    def cells_saying(self, words: str) -> list[str]:
        """The requests whose output holds ``words``."""
        return [msg_id for msg_id in self.by_request if words in self.text(msg_id)]


@contextlib.contextmanager
def recorded_kernel():
    kernel = Kernel()
    try:
        recorder = Recorder(kernel)
        _, reply, _ = recorder.run("%load_ext nbtrain")
        assert reply["status"] == "ok"
        yield recorder
        recorder.run("%distributed_shutdown")
    finally:
        kernel.shutdown()


def _wait_for(recorder: Recorder, code: str, timeout: float = 60) -> str:
    """Run ``code`` (an expression printing True once done) until it prints True; its last request id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg_id, reply, _ = recorder.run(code)
        if "True" in recorder.text(msg_id):
            return msg_id
        time.sleep(0.3)
    raise TimeoutError(code)


def test_a_background_cell_returns_at_once_and_its_names_arrive_between_later_cells():
    with recorded_kernel() as k:
        k.run("STEPS = 60")
        started, reply, seconds = k.run(TRAINING)
        assert reply["status"] == "ok" and seconds < 1.0, (reply, seconds)
        assert "<nbtrain background run 1: starting" in k.text(started) or "running" in k.text(started)
        others = [k.run(f"print('other cell {i}', {i} * 7)") for i in range(3)]  # while the ranks train
        for i, (msg_id, reply, took) in enumerate(others):
            assert reply["status"] == "ok" and took < 2.0
            assert f"other cell {i} {i * 7}" in k.text(msg_id)
        # the run imports nbtrain too: the notebook's is the same module, so only total is worth a warning
        early, _, _ = k.run("print(total if 'total' in dir() else 'not yet', nbtrain if 'nbtrain' in dir() else '')")
        assert "nbtrain: warning: background run 1 is still" in k.text(early) and "total here is the value" in k.text(early)
        # read after run.wait(), as the warning advises: the names have arrived by then, no warning
        waited, _, _ = k.run("import nbtrain; nbtrain.last_run.wait(120); print('waited for', total)")
        assert "warning" not in k.text(waited) and "waited for 180.0" in k.text(waited), k.text(waited)
        after, _, _ = k.run("print('total =', total, '| logged', len(history['loss']))")
        arrived = k.cells_saying("nbtrain: background run 1 finished: time, torch, nbtrain, w, step, total, history arrived")
        assert len(arrived) == 1 and arrived[0] != started  # once, between two later cells
        assert "total = 180.0 | logged 60" in k.text(after)
        listed, _, _ = k.run("print([(str(r['state']), r['steps']) for r in nbtrain.runs().to_dicts()])")
        assert "[('finished', 59)]" in k.text(listed)  # the kernel's runs list the background run (last step 59)
        run_output = k.text(started)
        assert "step 50" in run_output and "2 ranks" in run_output  # the run's lines and summary: in its own cell
        for msg_id, _, _ in others:
            assert "step " not in k.text(msg_id), "the run's output leaked into a later cell"
    assert_no_workers()


def test_run_stop_from_another_cell_stops_a_background_run_within_three_seconds():
    with recorded_kernel() as k:
        k.run("STEPS = 100000")
        k.run(TRAINING)
        _wait_for(k, "import nbtrain; print(nbtrain.last_run.state.value == 'running')")
        stopping, _, took = k.run("r = nbtrain.last_run.stop(); print(r.state.value, r.done)")
        assert "interrupted True" in k.text(stopping) and took < 3.0, (k.text(stopping), took)
        arrived, _, _ = k.run("print('total' in dir(), len(history['loss']) > 0)")
        assert len(k.cells_saying("background run 1 interrupted: history arrived")) == 1
        assert "False True" in k.text(arrived)  # stopped: the names never came, what was logged did
    assert_no_workers()


def test_two_background_runs_at_once_and_a_session_is_refused_before_anything_starts():
    with recorded_kernel() as k:
        k.run("STEPS = 20")
        first, _, _ = k.run(TRAINING)
        second, _, _ = k.run(TRAINING.replace("total = float", "other_total = float"))
        refused, reply, _ = k.run(TRAINING.replace("--background", "--background --session s1"))
        assert reply["status"] == "error" and "--session keeps the cell's variables" in k.text(refused)
        _wait_for(k, "import nbtrain; print(nbtrain.last_run.done)")
        done, _, _ = k.run("import nbtrain; print(nbtrain.last_run.wait(30).state.value)")
        both, _, _ = k.run("print(total, other_total)")
        assert "60.0 60.0" in k.text(both), k.text(both)
    assert_no_workers()


def test_a_cell_reads_a_name_early_only_before_its_first_wait():
    def early(source: str) -> set[str]:
        return _read_before_waiting(analyse_cell(source).code)
    assert early("print(total)") == {"print", "total"}
    assert early("run.wait(60); print(total)") == set()
    assert early("print(total, run.wait())") == {"print", "total"}
    assert early("x = total\nnbtrain.last_run.wait()\ny = loss") == {"total"}
