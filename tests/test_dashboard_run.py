"""The dashboard following real runs: 2 gloo ranks through run_source, and the magic in a terminal shell."""

from __future__ import annotations

import io
import os
import re
import signal
import threading

import psutil
import pytest

from nbtrain.kernel.dashboard.observer import DashboardObserver
from nbtrain.kernel.dashboard.text_status import TextStatus
from nbtrain.kernel.dashboard.widget import RunDashboard
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.observers.events import RunObserver
from nbtrain.kernel.request.config import LaunchRequest

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


CELL = """
import time
import nbtrain
nbtrain.log(total_steps=30)
end = time.time() + 0.04
for step in range(30):
    while time.time() < end:  # busy, so the ranks' CPU shows
        pass
    end += 0.04
    nbtrain.log(loss=1.0 / (step + 1) + rank, step=step)
    if step % 10 == 9:
        nbtrain.log(val_loss=2.0 / (step + 1), step=step)
"""


class WorkerPids(RunObserver):
    """Records the ranks' pids as the run reports them, and checks they are real nbtrain workers."""

    def __init__(self):
        self.pids = {}
        self.cmdlines = {}

    def ranks_ready(self, info):
        for r in info.ranks:
            self.pids[r.rank] = r.pid
            self.cmdlines[r.rank] = psutil.Process(r.pid).cmdline()


def test_dashboard_sees_both_ranks_metrics_and_their_processes(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    widget = DashboardObserver(RunDashboard, interval=0.25)
    stream = io.StringIO()
    text = DashboardObserver(lambda model: TextStatus(model, every=0.5, stream=stream), interval=0.25)
    pids = WorkerPids()
    samples = []
    original = widget.model.add_sample
    widget.model.add_sample = lambda snap: (samples.append(snap), original(snap))

    namespace = {}
    result = run_source(CELL, LaunchRequest(nprocs=2, cpu=True), namespace, observers=[widget, text, pids])

    assert set(pids.pids) == {0, 1} and all("nbtrain.rank" in cmd for cmd in pids.cmdlines.values())
    model = widget.model
    assert model.status == "finished" and model.store.total_steps == 30
    assert model.store.series("loss", rank=0).count == 30 and model.store.series("loss", rank=1).count == 30
    assert model.store.series("val_loss").count == 3
    assert model.store.series("loss", rank=1).last_value == pytest.approx(1.0 / 30 + 1)
    assert model.store.rank_step(0) == 29 and model.store.steps_per_second(0) > 5
    # the sampler followed the real worker processes, on the CPU path
    followed = [s for s in samples if s.ranks]
    assert followed, "no sample taken while the ranks ran"
    assert {u.pid for s in followed for u in s.ranks} == set(pids.pids.values())
    assert max(u.cpu_percent or 0 for s in followed for u in s.ranks) > 10
    for rank in (0, 1):  # a rank with torch imported holds well over 50 MiB
        assert max(u.rss or 0 for s in followed for u in s.ranks if u.rank == rank) > 50 * 2**20
    # the chart got the points, then the widget left a picture and a paragraph; the threads are gone
    assert widget.front.chart.sent >= 1 and widget.front.chart.feed.bases >= 1
    live, latest, figure, summary = shown  # the widget and its latest state in words, then the picture and summary
    assert live.widget is widget.front.widget and "2 ranks on gloo on cpu" in latest.text
    assert "image/png" in figure._repr_mimebundle_()
    assert "2 ranks on gloo on cpu finished" in summary.text and "step 30 of 30" in summary.text
    assert not widget.sampler.running and not widget.ticker.running and not text.ticker.running
    assert "nbtrain ▸ 2 ranks on gloo on cpu finished" in stream.getvalue()
    assert result.history["loss"].values[-1] == pytest.approx(1.0 / 30)


class StopButton(RunObserver):
    """Presses the stop button (SIGINT to this process, as Jupyter's interrupt sends it) a second after the
    ranks are ready."""

    def ranks_ready(self, info):
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_a_stopped_run_says_its_ranks_were_interrupted(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    widget = DashboardObserver(RunDashboard, interval=0.25)
    with pytest.raises(KeyboardInterrupt):
        run_source("import time\nwhile True:\n    time.sleep(0.05)\n", LaunchRequest(nprocs=2, cpu=True), {},
                   observers=[widget, StopButton()])
    summary = shown[-1]
    assert "2 ranks on gloo on cpu were interrupted" in summary.text, summary.text


def test_magic_in_a_terminal_prints_status_and_no_dashboard_turns_it_off(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "nbtrain")
        shell.run_cell_magic("distributed", "2 --cpu --keep-alive 0", "import nbtrain\nnbtrain.log(loss=0.5)\nx = 1")
        out = capsys.readouterr().out
        assert "nbtrain ▸ 2 ranks on gloo on cpu finished" in out and "loss 0.5" in out
        paragraph = next(line for line in out.splitlines() if line.startswith("nbtrain ▸"))
        # new ranks: the cold start's total in the summary, its split once, on the cell's closing line
        assert re.search(r"cold start (\d+ ms|\d+(\.\d+)? s)\.", paragraph) and out.count(" to the first step") == 1, out
        shell.run_cell_magic("distributed", "2 --cpu --keep-alive 0 --no-dashboard", "import nbtrain\nnbtrain.log(loss=0.5)")
        out = capsys.readouterr().out
        assert "nbtrain ▸" not in out and "nbtrain: 2 ranks" in out
        shell.run_line_magic("gpus", "--once")
        assert "machine: CPU" in capsys.readouterr().out or shell.user_ns is not None
    finally:
        shell.run_line_magic("unload_ext", "nbtrain")
        InteractiveShell.clear_instance()


BURST = """
import time
import nbtrain
for step in range(130):
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    time.sleep(0.01)
for step in range(130, 160):  # the last steps come at once, just before the run ends
    nbtrain.log(loss=1.0 / (step + 1), step=step)
"""


def test_the_live_chart_draws_the_last_points_before_the_picture_replaces_it(monkeypatch):
    """The chart's last message holds the run's last step, and goes before the final picture: the live chart never
    stops short of the step the progress line reports as finished, however its updates were spaced (here: one
    update in 30 s, so only the end of the run can send the last points)."""
    from nbtrain.kernel.dashboard import chart
    from nbtrain.kernel.dashboard.chart_feed import unpack

    monkeypatch.setattr(chart, "SEND_EVERY_S", 30.0)
    board: list[RunDashboard] = []
    shown = []

    def display(obj, **kw):
        chart = board[0].chart.widget
        steps = unpack(chart.tail["series"]["loss"]["step"]) if chart.tail else []
        shown.append((obj, steps[-1] if steps else None))

    monkeypatch.setattr("IPython.display.display", display)
    observer = DashboardObserver(lambda model: board.append(RunDashboard(model)) or board[0], interval=0.25)
    run_source(BURST, LaunchRequest(nprocs=2, cpu=True), {}, observers=[observer])
    (_, _), _, (figure, last_drawn), _ = shown
    assert "image/png" in figure._repr_mimebundle_()
    assert observer.model.store.rank_step(0) == 159
    assert last_drawn == 159, f"the live chart stopped at step {last_drawn} when the picture replaced it"
