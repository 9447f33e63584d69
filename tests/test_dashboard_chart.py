"""The browser chart's data without a kernel or a browser: what the kernel sends (base and tail), that the
browser's join of the two is always the store's series, that updates carry only news, and the bounds of
downsampling over long runs."""

from __future__ import annotations

import math
import random
import time
import uuid

import comm
import ipywidgets
import pytest

from helpers.chartbuild import node_join

from nbtrain.kernel.dashboard import chart
from nbtrain.kernel.dashboard.chart_feed import COLUMNS, ChartFeed, unpack
from nbtrain.kernel.dashboard.final import final_figure
from nbtrain.kernel.dashboard.metric_store import MetricStore
from nbtrain.kernel.dashboard.series import BoundedSeries
from nbtrain.kernel.dashboard.telemetry_series import TelemetrySeries


def as_lists(update: dict | None) -> dict | None:
    """A base or tail as JSON can carry it: each column's bytes as a list of floats."""
    if update is None:
        return None
    series = {name: {key: unpack(cols[key]) for key in COLUMNS} for name, cols in update["series"].items()}
    return {**update, "series": series}


def stored(store: MetricStore) -> dict:
    return {name: dict(zip(COLUMNS, cols, strict=True)) for name, (_, _, _, cols) in store.chart_columns({}).items()}


def log(store: MetricStore, first: int, count: int, rank: int = 0, every: int = 1, name: str = "loss") -> None:
    store.add(rank, [(s, 1000.0 + s / 10, {name: 1.0 / (s + 1)}) for s in range(first, first + count, every)])


def test_the_first_update_is_a_base_and_a_tail_then_only_news():
    store = MetricStore()
    feed = ChartFeed(store)
    assert feed.poll() is None, "nothing logged, nothing sent"
    log(store, 0, 40)
    first = feed.poll()
    assert first is not None and first.base is not None
    assert [len(unpack(first.base["series"]["loss"]["step"])), len(unpack(first.tail["series"]["loss"]["step"]))] == [39, 1]
    assert first.tail["groups"] == [("loss", ["loss"])]
    assert feed.poll() is None, "no news since"
    log(store, 40, 10)
    log(store, 0, 40, every=20, name="val_loss")
    second = feed.poll()
    assert second is not None and second.base is not None, "a new name is sent with a new base"
    log(store, 50, 5)
    news = feed.poll()
    assert news is not None and news.base is None, "a few more points: a tail only"
    assert len(unpack(news.tail["series"]["loss"]["step"])) == 6, "the tail holds the points after the base"
    assert len(unpack(news.tail["series"]["val_loss"]["mean"])) == 1
    assert news.tail["groups"] == [("loss", ["loss", "val_loss"])], "training and validation share a panel"
    [view] = node_join([(as_lists(last_base(first, second, news)), as_lists(news.tail))])
    assert view == stored(store)
    assert view["loss"]["time"][-1] == pytest.approx(1000.0 + 54 / 10), "the wall time of each point travels too"


def last_base(*updates) -> dict | None:
    """The last base among ``updates`` (what the browser holds)."""
    bases = [u.base for u in updates if u is not None and u.base is not None]
    return bases[-1] if bases else None


def test_the_browsers_join_is_always_the_stores_series_through_merges_and_rebases():
    random.seed(7)
    store = MetricStore(capacity=64)
    feed = ChartFeed(store, rebase_after=16)
    base = None
    step = 0
    sizes, pairs, expected = [], [], []
    for _ in range(300):
        count = random.randint(1, 30)
        store.add(random.choice([0, 1]), [(s, 1000.0 + s, {"loss": random.random()}) for s in range(step, step + count)])
        step += count
        update = feed.poll()
        assert update is not None
        base = update.base or base
        pairs.append((as_lists(base), as_lists(update.tail)))
        expected.append(stored(store))
        sizes.append(len(unpack(update.tail["series"]["loss"]["step"])))
    assert node_join(pairs) == expected  # the browser's own joinSeries, run by node
    series = store.series("loss")
    assert series is not None and series.merges >= 5, "the run was long enough to merge buckets several times"
    assert max(sizes) <= 16 + 30, "a tail never grows much past the rebase bound"
    assert feed.bases < feed.tails / 3, "most updates carry a tail only"


def test_downsampling_keeps_spikes_and_memory_flat_over_a_long_run():
    """2·10^5 points (benchmarks/dashboard_cost.py feeds 10^6 into the store and reports its size)."""
    series = BoundedSeries(1000)
    most = 0
    for start in range(0, 2 * 10**5, 10**4):
        for step in range(start, start + 10**4):
            series.add(step, 5.0 if step == 177_777 else 1.0 + (step % 7) / 100, 1e9 + step / 100)
        most = max(most, len(series))
    assert most < 1000 and 500 <= len(series) and series.width == 2**8, "bounded at every point of the run"
    assert max(series.maxs) == 5.0, "a one-step spike stays visible in its bucket's max"
    assert min(series.mins) == 1.0 and series.count == 2 * 10**5
    assert all(len(column) == len(series) for column in series.columns()), "five columns of one float per bucket"
    times = series.times
    assert times == sorted(times) and math.isclose(times[-1], 1e9 + series.steps[-1] / 100)


class _FrontEnd:
    """A comm whose front end is always there: ipywidgets sends only through a comm with a kernel, and which
    comm a widget gets depends on what the process did before (an IPython shell without a kernel gives none)."""

    kernel = True

    def __init__(self, **_kwargs) -> None:
        self.comm_id = uuid.uuid4().hex

    def send(self, *args, **kwargs) -> None:
        pass

    def on_msg(self, callback) -> None:
        pass

    def close(self, *args, **kwargs) -> None:
        pass


@pytest.fixture
def messages(monkeypatch):
    """Every comm message the widgets would send, as (widget, data, buffers)."""
    sent = []
    original = ipywidgets.Widget._send

    def _send(self, msg, buffers=None):
        sent.append((self, msg, buffers or []))
        return original(self, msg, buffers)

    monkeypatch.setattr(comm, "create_comm", _FrontEnd)
    monkeypatch.setattr(ipywidgets.Widget, "_send", _send)
    return sent


def test_the_widget_sends_binary_deltas_at_most_every_half_second(messages):
    store = MetricStore()
    panel = chart.ChartPanel(store, smoothing=0.8)
    assert panel.widget.get_state()["smoothing"] == 0.8
    assert ".uplot" in panel.widget.get_state()["_esm"], "the module is the bundle, uPlot (and its CSS) included"
    messages.clear()
    assert not panel.update(), "nothing to send"
    log(store, 0, 100)
    assert panel.update()
    (widget, msg, buffers), = messages
    assert widget is panel.widget and set(msg["state"]) == {"base", "tail"}, "base and tail in one message"
    assert len(buffers) == 10 and sum(len(b) for b in buffers) == 100 * 5 * 8, "columns travel as float64 buffers"
    log(store, 100, 10)
    assert not panel.update(), f"a second message within {chart.SEND_EVERY_S} s"
    panel._due = time.monotonic()  # half a second later
    assert panel.update()
    _, msg, buffers = messages[-1]
    assert set(msg["state"]) == {"tail"} and sum(len(b) for b in buffers) == 11 * 5 * 8, "only the news"


def test_a_tick_a_few_ms_early_still_sends_so_the_chart_keeps_two_updates_a_second(messages):
    store = MetricStore()
    panel = chart.ChartPanel(store)
    log(store, 0, 10)
    assert panel.update()
    log(store, 10, 10)
    panel._due = time.monotonic() + 0.005  # the next tick of the 0.25 s ticker came 5 ms before the grid
    assert panel.update(), "an early tick must not push the update to the tick after"
    log(store, 20, 10)
    assert not panel.update(), "but a tick a quarter second early is not on time"


def test_telemetry_samples_ride_with_the_curves_or_alone_when_nothing_was_logged(messages):
    from nbtrain.kernel.dashboard.telemetry_series import TelemetrySeries
    from nbtrain.gpu.processes import HostStatus
    from nbtrain.gpu.telemetry import Snapshot

    store, telemetry = MetricStore(), TelemetrySeries()
    panel = chart.ChartPanel(store, telemetry=telemetry)
    messages.clear()
    telemetry.add(Snapshot(10.0, (), (), HostStatus(50.0, 2, 1, 4), None))
    assert panel.update(force=True)
    (_, msg, _), = messages
    assert set(msg["state"]) == {"load"}, "a sample alone: the load panels move while nothing is logged"
    log(store, 0, 10)
    telemetry.add(Snapshot(11.0, (), (), HostStatus(60.0, 2, 1, 4), None))
    assert panel.update(force=True)
    assert set(messages[-1][1]["state"]) == {"base", "tail", "load"}, "curves and load in one message"
    assert not panel.update(force=True), "nothing new"


def test_a_checkout_without_the_bundle_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setattr(chart, "BUNDLE", tmp_path / "chart.js")
    with pytest.raises(RuntimeError, match="jlpm build:chart"):
        chart.bundle_source()


def test_the_panels_of_what_nbtrain_measures_itself_say_their_unit():
    store = MetricStore()
    feed = ChartFeed(store)
    for name in ("loss", "data_wait", "tflops", "samples_per_s", "mfu"):
        log(store, 0, 5, name=name)
    update = feed.poll()
    assert update is not None
    assert [title for title, _ in update.tail["groups"]] == [
        "loss", "data_wait (% of each step)", "tflops (TFLOP/s per rank)", "samples_per_s (all ranks)",
        "mfu (% of the dense peak)"]
    figure = final_figure(store, TelemetrySeries(), "run")  # the picture left under the cell says the same
    titles = [ax.get_title() for ax in figure.axes]
    assert "data_wait\n(% of each step)" in titles and "tflops\n(TFLOP/s per rank)" in titles and "loss" in titles
