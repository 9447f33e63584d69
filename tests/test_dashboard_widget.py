"""The dashboard's widgets without a kernel or a browser: their state, and the messages they would send."""

from __future__ import annotations

import base64
import time

import ipywidgets
import pytest

import nbtrain.kernel.dashboard as dashboard
from nbtrain.kernel.dashboard import chart
from nbtrain.kernel.dashboard.devices_view import devices_html
from nbtrain.kernel.dashboard.model import RunModel
from nbtrain.kernel.observers.events import RunState
from nbtrain.kernel.dashboard.monitor import GpuMonitor, gpus_table
from nbtrain.kernel.dashboard.observer import DashboardObserver
from nbtrain.kernel.dashboard.widget import RunDashboard
from nbtrain.gpu.devices import GpuProcess, GpuStatus
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.telemetry import RankUsage, Snapshot
from nbtrain.kernel.observers.events import NodeGpu, NodeInfo, RankInfo, RunInfo

PNG = b"\x89PNG\r\n\x1a\n"
GiB = 2**30
HOST = HostStatus(cpu_percent=40.0, cpu_count=8, memory_used=8 * GiB, memory_total=32 * GiB)


def gpu_snapshot() -> Snapshot:
    gpu = GpuStatus(0, "NVIDIA H100 80GB HBM3", "GPU-0", 87, 30 * GiB, 80 * GiB, 61, 350.0, 700.0,
                    (GpuProcess(101, 12 * GiB), GpuProcess(102, 10 * GiB), GpuProcess(999, 8 * GiB)))
    ranks = (RankUsage(0, 101, "cuda:0", 0, 12 * GiB, 100.0, GiB), RankUsage(1, 102, "cuda:0", 0, 10 * GiB, 98.0, GiB))
    return Snapshot(time.time(), (gpu,), ranks, HOST, None)


def cpu_snapshot() -> Snapshot:
    ranks = (RankUsage(0, 101, "cpu", None, None, 180.0, GiB), RankUsage(1, 102, "cpu", None, None, 95.0, GiB))
    return Snapshot(time.time(), (), ranks, HOST, "no NVIDIA driver was found (NVMLError_LibraryNotFound)")


def run_model(snap: Snapshot) -> RunModel:
    model = RunModel()
    model.set_info(RunInfo("r/1", 2, "nccl", "cuda", (0,), (RankInfo(0, 101, "cuda:0", 0), RankInfo(1, 102, "cuda:0", 0)), False))
    model.telemetry_source.set_ranks(())  # these pids are made up: keep the model's own sampler off them
    model.add_metrics(0, [(0, 100.0, {"total_steps": 1000})])
    for batch in range(10):  # as the ranks send them: a batch every half second, 20 steps per second
        for r in (0, 1):
            model.add_metrics(r, [(s, 100.0 + s / 20, {"loss": 2.0 / (s + 1)}) for s in range(batch * 10, batch * 10 + 10)])
    model.add_metrics(0, [(50, 102.5, {"val_loss": 1.0}), (99, 105.0, {"val_loss": 0.5})])
    model.add_sample(snap)
    return model


@pytest.fixture
def sent(monkeypatch):
    """Every state message the widgets would send to the front end, as (widget, keys)."""
    messages = []
    original = ipywidgets.Widget.send_state

    def send_state(self, key=None):
        messages.append((self, key))
        return original(self, key)

    monkeypatch.setattr(ipywidgets.Widget, "send_state", send_state)
    return messages


def test_widget_state_shows_progress_ranks_devices_and_curves(sent):
    board = RunDashboard(run_model(gpu_snapshot()))
    board.tick()
    run_text = board.run_panel.widget.value
    assert "step 100 / 1000 (10%)" in run_text and "20.0 steps/s" in run_text and "ETA 45 s" in run_text
    assert "12.0 GiB GPU" in run_text and "cuda:0 (GPU 0)" in run_text
    devices = board.devices.widget.value
    assert "GPU 0" in devices and "NVIDIA H100" in devices and "87%" in devices and "61°C" in devices
    assert "rank 0 12.0 GiB" in devices and "rank 1 10.0 GiB" in devices  # who uses how much
    assert "350/700 W" in devices
    tail = board.chart.widget.get_state()["tail"]
    assert tail["groups"] == [("loss", ["loss", "val_loss"])] and board.chart.sent == 1
    assert len(tail["series"]["loss"]["mean"]) == 8, "the tail: the bucket still filling, as float64"
    assert len(board.chart.widget.get_state()["base"]["series"]["loss"]["mean"]) == 99 * 8


def test_no_redraw_without_news_and_chart_throttled(sent):
    model = run_model(gpu_snapshot())
    model.elapsed = lambda: 10.0  # the shown elapsed second would otherwise change between ticks
    board = RunDashboard(model)
    board.tick()
    sent.clear()
    board.tick()
    board.tick()
    assert sent == [], "nothing changed, nothing sent"
    board.model.add_metrics(0, [(100, 110.0, {"loss": 0.01})])
    board.tick()
    assert board.chart.sent == 1, f"sent again before {chart.SEND_EVERY_S} s"
    board.chart._due = 0.0  # as if the half second were over
    board.tick()
    assert board.chart.sent == 2
    assert {w for w, _ in sent} <= {board.chart.widget, board.run_panel.widget}


def test_a_node_runs_panel_lists_its_nodes_and_redraws_when_they_report():
    model = run_model(gpu_snapshot())
    model.elapsed = lambda: 10.0
    board = RunDashboard(model)
    observer = DashboardObserver(lambda m: board, model=model)
    board.tick()
    assert "<th" in board.run_panel.widget.value and ">node<" not in board.run_panel.widget.value  # one machine
    nodes = (NodeInfo("a", "gpu1", "10.0.0.7", (0, 1), "running", time.time(), 35.0, 41.0,
                      (NodeGpu(GpuStatus(0, "NVIDIA H100", "GPU-0", 97, 12 * GiB, 80 * GiB, 50, 300.0, 700.0, None)),)),
             NodeInfo("b", "gpu2", "10.0.0.8", (2, 3), "lost", time.time() - 6, None, None, ()))
    observer.nodes_heard(nodes)  # what the run loop calls once a second on a --nodes run
    board.tick()  # the shown second did not move: only the node report can redraw the panel
    panel = board.run_panel.widget.value
    assert ">node<" in panel and "gpu1 (10.0.0.7)" in panel and "0–1" in panel and "running" in panel
    assert "35%" in panel and "41%" in panel and "GPU 0 97% 12.0 GiB/80.0 GiB" in panel
    assert "gpu2 (10.0.0.8)" in panel and "lost" in panel and "2–3" in panel


def test_cpu_only_panel_says_no_driver_and_shows_ranks():
    html = devices_html(cpu_snapshot(), {})
    assert "No GPU on this machine: showing CPU and RAM" in html and "NVMLError" not in html
    assert "rank 0 CPU" in html and "180% of a core" in html and "8 cores" in html and "machine" in html


def test_finish_leaves_a_png_and_a_paragraph(monkeypatch):
    model = run_model(cpu_snapshot())
    board = RunDashboard(model)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    model.finish(RunState.FINISHED, "2 ranks finished")
    board.finish()
    figure, summary = shown
    bundle = figure._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"])[:8] == PNG
    text = summary._repr_mimebundle_()["text/markdown"]
    assert "2 ranks on nccl on GPU 0 finished" in text and "step 100 of 1000" in text and "loss 2 → 0.02" in text
    assert board.widget.comm is None, "the live widgets are closed once the picture replaced them"


def test_a_cell_over_before_its_second_tick_gets_its_summary_without_a_widget_and_a_longer_one_the_live_one(
        monkeypatch):
    """A cell's dashboard comes live once its run has lasted SHOW_AFTER_S (the ticker's second tick): a quicker run
    gets the picture and the summary alone; building the widgets only to replace them cost a warm cell 10 ms."""
    from nbtrain.kernel.dashboard import widget

    outputs: list = []
    monkeypatch.setattr("IPython.display.display",
                        lambda obj, display_id=None, **kw: outputs.append(obj) or Handle(outputs, len(outputs) - 1))
    quick = widget.DeferredDashboard(run_model(cpu_snapshot()))
    quick.show()
    quick.tick()  # the ticker's first tick, at the run's start
    quick.model.finish(RunState.FINISHED, "2 ranks finished")
    quick.finish()
    assert quick.live is None and [type(o).__name__ for o in outputs] == ["FinalFigure", "Summary"]
    assert "step 100 of 1000" in outputs[1].text
    outputs.clear()
    longer = widget.DeferredDashboard(run_model(cpu_snapshot()))
    longer.show()
    monkeypatch.setattr(longer, "_show_at", 0.0)  # its second tick
    longer.tick()
    assert longer.live is not None and outputs[0].widget is longer.live.widget  # the live widget, then its words
    longer.model.finish(RunState.FINISHED, "2 ranks finished")
    longer.finish()
    assert [type(o).__name__ for o in outputs] == ["FinalFigure", "Summary"]  # in the live outputs' places
    assert longer.live.widget.comm is None
    outputs.clear()
    empty = widget.DeferredDashboard(RunModel())  # a quick cell that logged nothing: no picture, the summary alone
    empty.show()
    empty.model.finish(RunState.FINISHED, "2 ranks finished")
    empty.finish()
    assert [type(o).__name__ for o in outputs] == ["Summary"]


class Handle:
    """What ``display(..., display_id=True)`` returns: each ``update`` replaces that output."""

    def __init__(self, outputs: list, index: int) -> None:
        self.outputs, self.index = outputs, index

    def update(self, obj, **kw) -> None:
        self.outputs[self.index] = obj


def test_the_latest_state_in_words_follows_the_run_under_the_widget_and_the_summary_takes_its_place(monkeypatch):
    """The output under the live widget (what a notebook saved mid-run shows where the widget cannot be drawn)
    names the step, the logged series and the load from the start, is refreshed by the ticker every few seconds,
    shows a metric named like a tag as text, and becomes the summary when the run ends."""
    mistune = pytest.importorskip("mistune")
    from nbtrain.kernel.dashboard import snapshot

    outputs: list = []
    monkeypatch.setattr("IPython.display.display",
                        lambda obj, display_id=None, **kw: outputs.append(obj) or Handle(outputs, len(outputs) - 1))
    model = run_model(cpu_snapshot())
    board = RunDashboard(model)
    board.show()
    live, latest = outputs
    assert live.widget is board.widget and "nbtrain-live" in board.widget._dom_classes
    view = live._repr_mimebundle_()  # an untrusted notebook or an export shows its text: a line, not the widgets' repr
    assert view["text/plain"] == snapshot.LIVE_TEXT and view["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert "step 100 of 1000" in latest.text and "loss 2 → 0.02" in latest.text and "Last seen at" in latest.text
    bundle = latest._repr_mimebundle_()
    assert bundle["text/plain"] == latest.text and bundle["text/markdown"].startswith(snapshot.MARK)
    for s in range(100, 120):
        model.add_metrics(0, [(s, 105.0 + s / 20, {"loss": 0.01, "<img src=x onerror=alert(1)>": 1.0})])
    board.tick()
    assert outputs[1] is latest, "refreshed a few times a minute, not at every tick"
    monkeypatch.setattr(board, "_snapshot_at", 0.0)  # its time has come
    board.tick()
    assert "step 120 of 1000" in outputs[1].text
    shown = mistune.html(outputs[1]._repr_mimebundle_()["text/markdown"])
    assert "&lt;img src=x onerror=alert(1)&gt;" in shown and "<img" not in shown
    model.finish(RunState.FINISHED, "2 ranks finished")
    board.finish()
    assert len(outputs) == 2, "the picture and the summary take the two outputs' places"
    assert "image/png" in outputs[0]._repr_mimebundle_()
    assert "finished" in outputs[1].text and snapshot.MARK not in outputs[1]._repr_mimebundle_()["text/markdown"]


def test_gpu_monitor_lives_and_stops():
    monitor = GpuMonitor(interval=0.25, duration=0).start()
    try:
        deadline = time.monotonic() + 5
        while "machine" not in monitor.panel.widget.value and "GPU" not in monitor.panel.widget.value:
            assert time.monotonic() < deadline, "no sample shown"
            time.sleep(0.05)
        assert "live" in monitor.status.value
        while monitor.chart.sent == 0:  # the load panels: the machine's history since the monitor started
            assert time.monotonic() < deadline, "no sample sent to the chart"
            time.sleep(0.05)
        load = monitor.chart.widget.load
        assert load["devices"] and set(load["busy"]) == set(load["devices"])
        assert not monitor.chart.widget.curves, "no logged curves in %gpus: the chart hides their controls"
    finally:
        monitor.stop()
    assert monitor.stop_button.disabled and "stopped" in monitor.status.value
    assert not monitor.sampler.running and not monitor.ticker.running


def test_a_new_monitor_stops_the_previous_one():
    first = GpuMonitor(interval=1, duration=0).start()
    second = GpuMonitor(interval=1, duration=0).start()
    try:
        assert first.stopped and not second.stopped
    finally:
        second.stop()


def test_gpus_once_prints_a_table(capsys):
    dashboard.show_gpus(None, once=True)
    out = capsys.readouterr().out
    assert "machine: CPU" in out or "GPU" in out
    assert "machine: CPU" in gpus_table(cpu_snapshot()) and "No GPU on this machine." in gpus_table(cpu_snapshot())
    table = gpus_table(gpu_snapshot())
    assert "NVIDIA H100" in table and "87%" in table and "pid 101" in table and "12.0 GiB" in table


def test_rank_memory_the_driver_hides_is_na_with_one_note():
    """A VM's driver lists no processes: the views show N/A for the ranks (never 0) and say why once."""
    from nbtrain.kernel.dashboard.run_view import _memory
    from nbtrain.gpu.telemetry import hidden_processes_note

    gpu = GpuStatus(0, "NVIDIA H100 80GB HBM3", "GPU-0", 12, 9 * GiB, 80 * GiB, 40, 150.0, 700.0, ())
    ranks = (RankUsage(0, 101, "cuda:0", 0, None, 100.0, GiB),)
    snap = Snapshot(time.time(), (gpu,), ranks, HOST, None, (hidden_processes_note(gpu),))
    panel = devices_html(snap, {})
    assert "rank 0 N/A" in panel and panel.count("lists no processes") == 1 and "0 B" not in panel
    assert _memory(ranks[0]) == "N/A GPU"
    table = gpus_table(snap)
    assert "processes: N/A (the driver lists none" in table and table.count("memory.used (9.0 GiB)") == 1


def test_mode_follows_the_front_end_and_the_environment(monkeypatch):
    class Kernel:
        kernel = object()

    class Terminal:
        pass

    assert dashboard.dashboard_mode(Kernel(), {}) == "widget"
    assert dashboard.dashboard_mode(Terminal(), {}) == "text"
    assert dashboard.dashboard_mode(Kernel(), {"NBTRAIN_DASHBOARD": "text"}) == "text"
    assert dashboard.observer_for(Kernel(), enabled=False) is None
    monkeypatch.setenv("NBTRAIN_DASHBOARD", "off")
    assert dashboard.observer_for(Kernel()) is None
    monkeypatch.setenv("NBTRAIN_DASHBOARD", "fancy")
    with pytest.raises(ValueError, match="NBTRAIN_DASHBOARD is 'fancy'"):
        dashboard.observer_for(Kernel())


def test_configure_checks_its_input():
    before = dashboard.configure()
    try:
        assert dashboard.configure(interval=0.5)["interval"] == 0.5
        with pytest.raises(ValueError, match="between 0.25 and 5"):
            dashboard.configure(interval=10)
        assert dashboard.configure(smoothing=0.9)["smoothing"] == 0.9
        with pytest.raises(ValueError, match="smoothing"):
            dashboard.configure(smoothing=1.5)
    finally:
        dashboard.configure(**before)


def test_the_html_panels_show_what_the_run_names_as_text():
    """Node names, hosts, devices, setup words, hints and status that hold HTML reach the panels as text."""
    from types import SimpleNamespace

    from nbtrain.kernel.dashboard.metric_store import MetricStore
    from nbtrain.kernel.dashboard.run_view import run_html

    attack = "<img src=x onerror=alert(1)>"
    nodes = (NodeInfo(attack, attack, "10.0.0.7", (0,), attack, time.time(), None, None, ()),)
    ranks = [RankInfo(0, 100, attack, None)]
    panel = run_html(MetricStore(), None, ranks, 1.0, attack, setup=[attack], hints=[SimpleNamespace(text=attack)],
                     nodes=nodes)
    assert "<img" not in panel and panel.count("&lt;img src=x onerror=alert(1)&gt;") >= 6, panel
    gpu = GpuStatus(0, attack, "GPU-0", 10, GiB, 80 * GiB, 50, 100.0, 300.0, ())
    devices = devices_html(Snapshot(1.0, (gpu,), (), cpu_snapshot().host, attack), {})
    assert "<img" not in devices and "&lt;img" in devices


def test_a_live_dashboard_shown_again_resends_every_widget_then_its_output_and_never_after_the_picture(monkeypatch):
    """What a page reloaded mid-run gets (nbtrain.kernel.dashboard.reopen): a comm_open with the full state of each
    widget of the dashboard, children before the box that names them, then the dashboard's output again; once
    the run ended and left its picture, nothing."""
    from nbtrain.kernel.dashboard import reopen

    monkeypatch.setattr(reopen, "_live", {})  # this test's dashboard alone
    opened = []
    model = run_model(cpu_snapshot())
    board = RunDashboard(model)
    comm_class = type(board.widget.comm)  # a kernel's Comm, or comm's DummyComm outside a kernel
    original = comm_class.publish_msg

    def publish(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        if msg_type == "comm_open":
            opened.append((self.comm_id, data["state"]))
        return original(self, msg_type, data, metadata, buffers, **keys)

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    board.show()
    board.tick()
    monkeypatch.setattr(comm_class, "publish_msg", publish)
    assert reopen.show_again() == 1
    ids = [model_id for model_id, _ in opened]
    assert ids[-1] == board.widget.model_id and board.chart.widget.model_id in ids
    assert ids.index(board.chart.widget.model_id) < ids.index(board.widget.model_id), "children first"
    chart_state = dict(opened)[board.chart.widget.model_id]
    assert chart_state["chart_style"] and chart_state["_esm"], "the chart's whole state, its code included"
    assert [view.widget for view in (shown[0], shown[2])] == [board.widget] * 2, "the dashboard's output, shown again"
    model.finish(RunState.FINISHED, "2 ranks finished")
    board.finish()
    opened.clear()
    assert reopen.show_again() == 0, "an ended run is no longer listed"
    board.show_again()  # a request that was under way when the run ended
    assert opened == [] and len(shown) == 5 and getattr(shown[-1], "widget", None) is None, "the picture stays"
