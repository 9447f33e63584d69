"""Earlier runs in the chart: the kernel keeps the last runs' series, labels each with what differed from the run
now, and sends them to the chart once, reduced, through the chart's feed."""

from __future__ import annotations

import math

import pytest

from helpers.runhelp import run_cell
from nbtrain.kernel.dashboard import configure
from nbtrain.kernel.dashboard.chart_feed import OVERLAY_POINTS, ChartFeed, reduced, unpack
from nbtrain.kernel.dashboard.metric_store import MetricStore
from nbtrain.kernel.observers.history import History
from nbtrain.kernel.observers.events import RunObserver, RunState
from nbtrain.kernel.observers.runlog import KEEP_SERIES, EarlierRun, RunEnd, RunLog, differences

CELL = "import nbtrain\nfor step in range(4):\n    nbtrain.log(loss=LR / (step + 1))\n"


@pytest.mark.parametrize("before, now, said", [
    (("a = 1\nb = 2\n", "--amp bf16"), ("a = 1\nb = 2\n", "--amp off"), "--amp bf16"),
    (("a = 1\n", "--grad-accum 2 --fresh"), ("a = 1\n", "--fresh"), "--grad-accum 2"),
    (("a = 1\n", ""), ("a = 1\n", "--fresh"), "no --fresh"),
    (("a = 1\nlr = 0.1\nb = 2\n", ""), ("a = 1\nlr = 0.3\nb = 2\n", ""), "cell line 3: lr = 0.1"),
    (("a = 1\n", ""), ("a = 1\nb = 2\n", ""), "cell line 3: (no line here)"),
    (("a = 1\n", "--amp bf16"), ("a = 2\n", ""), "--amp bf16 · cell line 2: a = 1"),
    (("a = 1\n", "--amp bf16"), ("a = 1\n", "--amp bf16"), "the same cell and options"),
])
def test_an_earlier_run_is_labelled_with_what_differed(before, now, said):
    assert differences(*before, *now) == said


def history(*values: float) -> History:
    h = History()
    h.add(0, [(step, 1000.0 + step, {"loss": v}) for step, v in enumerate(values)])
    h.add(1, [(0, 1000.0, {"loss": 99.0})])
    return h


def test_the_log_keeps_the_series_of_its_last_runs_that_logged_anything():
    log = RunLog()
    for number in range(KEEP_SERIES + 2):
        log.add(RunEnd(f"x = {number}\n", "", 0.0, 1.0, 2, RunState.FINISHED), history(float(number)))
    log.add(RunEnd("pass\n", "", 0.0, 1.0, 2, RunState.FINISHED), History())  # nothing logged: nothing to compare with
    earlier = log.earlier("x = 11\n", "--fresh", count=3)
    assert [run.number for run in earlier] == [10, 11, 12]
    assert [run.label for run in earlier] == ["finished · no --fresh · cell line 2: x = 9",
                                              "finished · no --fresh · cell line 2: x = 10", "finished · no --fresh"]
    assert len(log.earlier("", "")) == KEEP_SERIES and log.earlier("", "", count=0) == ()


def test_a_long_series_is_reduced_to_its_shape_and_its_non_finite_values_left_out():
    steps = list(range(10_000))
    values = [float("nan") if s == 7 else float(s) for s in steps]
    cols = {key: unpack(col) for key, col in reduced(steps, values, [2000.0 + s for s in steps]).items()}
    assert len(cols["mean"]) == OVERLAY_POINTS and all(math.isfinite(v) for v in cols["mean"])
    assert cols["step"][-1] == cols["mean"][-1] == 9990.0  # the last 19 finite steps, 9981 to 9999
    assert cols["time"][0] - cols["step"][0] == pytest.approx(2000.0)


def test_the_earlier_runs_travel_once_with_the_first_update():
    earlier = (EarlierRun(4, "x = 1", "", history(3.0, 2.0, 1.0), "--amp bf16"),)
    store = MetricStore()
    feed = ChartFeed(store, earlier=earlier)
    assert feed.poll() is None  # nothing logged by this run yet: nothing to draw beside
    store.add(0, [(0, 1.0, {"loss": 5.0})])
    first = feed.poll()
    assert first is not None and first.overlays is not None
    [run] = first.overlays["runs"]
    assert (run["number"], run["label"]) == (4, "--amp bf16")
    assert unpack(run["series"]["loss"]["mean"]) == [3.0, 2.0, 1.0]  # rank 0's series
    store.add(0, [(1, 2.0, {"loss": 4.0})])
    assert feed.poll().overlays is None


class Heard(RunObserver):
    def __init__(self) -> None:
        self.earlier: tuple = ()

    def earlier_runs(self, runs) -> None:
        self.earlier = runs


def test_real_runs_hand_the_next_run_their_series_and_what_differed(fresh_pools):
    run_cell(fresh_pools, CELL, {"LR": 1.0})
    heard = Heard()
    run_cell(fresh_pools, CELL, {"LR": 2.0}, observers=[heard], grad_accum=2)
    [first] = heard.earlier
    assert first.label == "finished · no --grad-accum" and list(first.history["loss"]) == [1.0, 0.5, 1 / 3, 0.25]


def test_how_many_runs_are_compared_is_a_setting():
    try:
        assert configure(compare=1)["compare"] == 1
        with pytest.raises(ValueError, match="compare is a number of earlier runs from 0 to 10"):
            configure(compare=11)
    finally:
        configure(compare=3)


def test_the_picture_left_after_a_run_draws_the_earlier_runs_beside_it(monkeypatch):
    """The live chart draws the kernel's earlier runs faded and dashed beside this one; so does the PNG that
    replaces it in the notebook, each labelled as in the live legend."""
    import base64

    from nbtrain.kernel.dashboard import theme
    from nbtrain.kernel.dashboard.final import Beside, final_figure
    from nbtrain.kernel.dashboard.model import RunModel
    from nbtrain.kernel.dashboard.widget import RunDashboard

    log = RunLog()
    log.add(RunEnd("lr = 0.1\n", "--amp bf16", 0.0, 1.0, 2, RunState.FINISHED), history(*(1.0 / (s + 2) for s in range(20))))
    model = RunModel()
    model.set_earlier(log.earlier("lr = 0.2\n", ""))
    model.add_metrics(0, [(s, 100.0 + s, {"loss": 1.0 / (s + 1)}) for s in range(20)])
    model.finish(RunState.FINISHED, "2 ranks finished")
    ax = final_figure(model.store, model.telemetry, "run", 0.6, Beside(tuple(model.earlier))).axes[0]
    faded = [line for line in ax.get_lines() if line.get_alpha() == theme.OVERLAY_ALPHA]
    assert [line.get_label() for line in faded] == ["loss · run 1: finished · --amp bf16 · cell line 2: lr = 0.1"]
    assert faded[0].get_linestyle() == "--" and faded[0].get_color() == theme.series_color(0)
    legend, = ax.get_figure(root=True).legends  # named once under the panels (the load panels have none here)
    assert [text.get_text() for text in legend.get_texts()] == ["run 1: finished · --amp bf16 · cell line 2: lr = 0.1"]

    shown: list = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    pictures = []
    for compare in (3, 0):  # the picture of the same run with and without the earlier runs beside it
        shown.clear()
        RunDashboard(model, compare=compare).finish()
        pictures.append(base64.b64decode(shown[0]._repr_mimebundle_()["image/png"]))
    assert pictures[0] != pictures[1], "the saved picture draws the earlier run the live chart drew"


def test_the_picture_follows_this_run_and_marks_how_each_earlier_run_ended():
    """A 20-step run drawn beside a stopped 200-step run and a failed one: the x axis spans this run's 20 steps (it
    spanned the earlier run's 200), each earlier run's label says how it ended, and the legend sits under the
    plot, over none of its lines (it sat inside the plot, over the curves, where matplotlib found room)."""
    from nbtrain.kernel.dashboard.final import Beside, final_figure
    from nbtrain.kernel.dashboard.model import RunModel

    log = RunLog()
    log.add(RunEnd("lr = 0.1\n", "", 0.0, 1.0, 2, RunState.INTERRUPTED), history(*(1.0 / (s + 2) for s in range(200))))
    log.add(RunEnd("lr = 0.3\n", "", 0.0, 1.0, 2, RunState.FAILED), history(*(1.0 / (s + 3) for s in range(50))))
    model = RunModel()
    model.set_earlier(log.earlier("lr = 0.2\n", ""))
    model.add_metrics(0, [(s, 100.0 + s, {"loss": 1.0 / (s + 1)}) for s in range(20)])
    model.finish(RunState.FINISHED, "2 ranks finished")
    figure = final_figure(model.store, model.telemetry, "run", 0.6, Beside(tuple(model.earlier)))
    ax = figure.axes[0]
    low, high = ax.get_xlim()
    assert low > -1 and 19 <= high < 20, f"the x axis spans {low:.1f} to {high:.1f}, not this run's steps 0 to 19"
    assert ax.get_legend() is None  # one series of its own: nothing to tell apart
    legend, = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["run 1: stopped · cell line 2: lr = 0.1",
                                                               "run 2: failed · cell line 2: lr = 0.3"]
    renderer = figure.canvas.get_renderer()
    figure.draw_without_rendering()
    below, plot = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert below.y1 <= plot.y0, f"the legend covers the plot: legend {below}, plot {plot}"


def test_five_panels_beside_an_earlier_run_keep_their_width():
    """A resumed run's five series beside the run before it: each panel named the earlier run beside it, three in
    a row left them no width, and matplotlib warned into the cell ("axes sizes collapsed to zero")."""
    import warnings

    from nbtrain.kernel.dashboard.final import Beside, final_figure
    from nbtrain.kernel.dashboard.model import RunModel
    from nbtrain.kernel.dashboard.plotting import png_bytes

    names = ("loss", "val_loss", "data_wait", "samples_per_s", "tokens_per_s", "tflops")
    earlier = History()
    earlier.add(0, [(step, 100.0 + step, {name: 1.0 / (step + 1) for name in names}) for step in range(20)])
    log = RunLog()
    log.add(RunEnd("for epoch in nbtrain.epochs(EPOCHS):\n", "", 0.0, 1.0, 1, RunState.FINISHED), earlier)
    model = RunModel()
    model.set_earlier(log.earlier("x = 2\n", ""))
    model.add_metrics(0, [(s, 200.0 + s, {name: 2.0 / (s + 1) for name in names}) for s in range(20, 40)])
    model.finish(RunState.FINISHED, "1 rank finished")
    figure = final_figure(model.store, model.telemetry, "run", 0.6, Beside(tuple(model.earlier)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png_bytes(figure)
    assert all(ax.get_window_extent().width > 100 for ax in figure.axes), [ax.get_window_extent() for ax in figure.axes]
    loss = figure.axes[0]
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["loss", "val_loss"]  # its own two, beside it
    legend, = figure.legends
    assert len(legend.get_texts()) == 1 and legend.get_texts()[0].get_text().startswith("run 1: finished")


def test_a_panel_of_one_measured_window_spans_the_runs_steps():
    """A short run's rates are measured over one window: their panels showed one point between step 38 and 40."""
    from nbtrain.kernel.dashboard.final import final_figure
    from nbtrain.kernel.dashboard.model import RunModel

    model = RunModel()
    model.add_metrics(0, [(s, 100.0 + s, {"loss": 1.0 / (s + 1)}) for s in range(70)])
    model.add_metrics(0, [(39, 140.0, {"data_wait": 94.0})])
    model.finish(RunState.FINISHED, "2 ranks finished")
    loss, data_wait = final_figure(model.store, model.telemetry, "run", 0.6).axes[:2]
    assert data_wait.get_xlim() == loss.get_xlim() and loss.get_xlim()[1] - loss.get_xlim()[0] > 60
