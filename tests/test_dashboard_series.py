"""Bounded series, the metric store (speed, progress, total steps) and how names pair up in panels."""

from __future__ import annotations

import math
import tracemalloc

import pytest

from nbtrain.kernel.dashboard.metric_store import MetricStore
from nbtrain.kernel.dashboard.plotting import group_names
from nbtrain.kernel.dashboard.progress import progress
from nbtrain.kernel.dashboard.series import BoundedSeries, smooth


def test_a_million_points_stay_bounded_and_summarised_exactly():
    series = BoundedSeries(capacity=1000)
    n = 10**6
    for step in range(n):
        series.add(step, math.sin(step / 1000.0) + (5.0 if step == 123_457 else 0.0))
    assert 500 <= len(series) <= 1000
    assert sum(series.counts) == series.count == n
    overall = sum(m * c for m, c in zip(series.means, series.counts, strict=True)) / n
    exact = sum(math.sin(s / 1000.0) for s in range(n)) / n + 5.0 / n
    assert overall == pytest.approx(exact, abs=1e-9)
    assert series.finite_max == pytest.approx(math.sin(123.457) + 5.0), "a spike survives downsampling in the max"
    assert series.steps == sorted(series.steps) and series.steps[0] < 2000 and series.steps[-1] > n - 2000
    assert series.last_step == n - 1


def test_memory_is_flat_in_the_number_of_steps():
    def retained(points: int) -> int:
        tracemalloc.start()
        store = MetricStore()
        for start in range(0, points, 1000):  # as the run delivers them: batches of records
            store.add(0, [(s, float(s), {"loss": 1.0 / (s + 1), "lr": 0.1}) for s in range(start, start + 1000)])
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(store.series("loss")) <= 1000
        return size

    # tracemalloc makes every allocation slow, so 10^5 steps stand for "many" here (memory grows 10x if
    # it is linear); benchmarks/dashboard_cost.py measures 10^6 without it.
    small, large = retained(10_000), retained(100_000)
    assert large < 1.5 * small + 100_000, (small, large)


def test_non_finite_values_are_remembered_not_averaged():
    series = BoundedSeries(capacity=8)
    for step, value in enumerate([1.0, 2.0, float("nan"), 3.0, float("inf")]):
        series.add(step, value)
    assert series.first_nonfinite_step == 2 and series.count == 3
    assert all(math.isfinite(m) for m in series.means)


def test_capacity_must_be_sensible():
    with pytest.raises(ValueError, match="capacity"):
        BoundedSeries(capacity=2)


def test_smoothing_removes_start_bias_and_checks_weight():
    assert smooth([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])
    assert smooth([1.0, 3.0], 0.0) == [1.0, 3.0]
    with pytest.raises(ValueError, match="smoothing"):
        smooth([1.0], 1.0)


def test_speed_progress_and_eta_from_the_ranks_clocks():
    store = MetricStore()
    store.add(0, [(0, 100.0, {"total_steps": 1000})])
    for batch in range(10):  # 10 steps per second on rank 0, 5 on rank 1, val_loss every 50 steps
        store.add(0, [(s, 100.0 + s / 10, {"loss": 1.0}) for s in range(batch * 10, batch * 10 + 10)])
        store.add(1, [(s, 100.0 + s / 5, {"loss": 1.0}) for s in range(batch * 5, batch * 5 + 5)])
        if batch % 5 == 4:
            store.add(0, [(batch * 10, 100.0 + batch, {"val_loss": 2.0})])
    assert store.total_steps == 1000 and "total_steps" not in store.names
    assert store.rank_step(0) == 99 and store.steps_per_second(0) == pytest.approx(10.0)
    assert store.steps_per_second(1) == pytest.approx(5.0)
    p = progress(store, elapsed=10.0)
    assert p.step == 100 and p.total == 1000 and p.fraction == pytest.approx(0.1)
    assert p.eta == pytest.approx(90.0)


def test_progress_without_total_has_no_eta():
    store = MetricStore()
    store.add(0, [(s, float(s), {"loss": 1.0}) for s in range(5)])
    p = progress(store, 5.0)
    assert p.total is None and p.eta is None and p.fraction is None and p.step == 5


@pytest.mark.parametrize("names, panels", [
    (["loss", "val_loss", "lr"], [("loss", ["loss", "val_loss"]), ("lr", ["lr"])]),
    (["train_acc", "val_acc"], [("acc", ["train_acc", "val_acc"])]),
    (["eval/loss", "train/loss"], [("loss", ["train/loss", "eval/loss"])]),
    (["loss_val", "loss"], [("loss", ["loss", "loss_val"])]),
    (["validation_loss", "loss", "test_loss"], [("loss", ["loss", "validation_loss", "test_loss"])]),
    (["value", "val"], [("value", ["value"]), ("val", ["val"])]),
    # what Hugging Face's Trainer logs: its eval_* metrics drawn as the validation twins of its training ones
    (["loss", "learning_rate", "eval_loss", "eval_accuracy"],
     [("loss", ["loss", "eval_loss"]), ("learning_rate", ["learning_rate"]), ("accuracy", ["eval_accuracy"])]),
])
def test_training_and_validation_share_a_panel(names, panels):
    assert group_names(names) == panels


def test_the_run_model_is_data_only_and_names_devices_by_key():
    import subprocess
    import sys

    code = ("import sys, nbtrain.kernel.dashboard.model, nbtrain.kernel.dashboard.telemetry_series; "
            "print(sorted(m for m in sys.modules if m.startswith('nbtrain.kernel.dashboard.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for view in ("run_view", "devices_view", "widget", "chart", "final", "monitor", "theme"):
        assert f"nbtrain.kernel.dashboard.{view}'" not in loaded, f"the model imports the view {view}"

    from nbtrain.kernel.dashboard.telemetry_series import MACHINE, DeviceKey, DeviceKind, TelemetrySeries
    from nbtrain.gpu.processes import HostStatus
    from nbtrain.gpu.telemetry import RankUsage, Snapshot

    host = HostStatus(cpu_percent=50.0, cpu_count=4, memory_used=2**30, memory_total=2**32)
    series = TelemetrySeries()
    series.add(Snapshot(1.0, (), (RankUsage(1, 11, "cpu", None, None, 120.0, 2**28),), host, "no driver"))
    assert list(series.sparks()) == [MACHINE, DeviceKey.rank(1)]
    assert [key.kind for key in series.peaks()] == [DeviceKind.MACHINE, DeviceKind.RANK]
    assert [str(key) for key in series.timelines()] == ["rank 1", "CPU (machine)"], "as the load panels list them"


def test_the_browser_smooths_as_the_final_figure_does():
    """The chart's JavaScript (labextension/chart/data.js, run by node) and the kernel draw the same smoothed
    curve and smooth the same series, with the rule's numbers the kernel sends (theme.chart_style)."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    from nbtrain.kernel.dashboard.series import worth_smoothing
    from nbtrain.kernel.dashboard.theme import chart_style

    node = shutil.which("node")
    data_js = Path(__file__).resolve().parents[1] / "labextension" / "chart" / "data.js"
    if node is None or not data_js.exists():
        pytest.skip("needs node and the chart's sources (a checkout)")
    values = [math.sin(i / 3) + i / 10 for i in range(40)]
    sizes = [(points, most) for points in (5, 10, 11, 30, 300) for most in (11, 40, 1000)]
    script = (f"import {{ smooth, worthSmoothing }} from {json.dumps(data_js.as_uri())};\n"
              f"const style = {json.dumps(chart_style())};\n"
              f"console.log(JSON.stringify({{ curve: smooth({json.dumps(values)}, 0.6),\n"
              f"  smoothed: {json.dumps(sizes)}.map(([n, most]) => worthSmoothing(n, most, style)) }}));")
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    browser = json.loads(done.stdout)
    assert browser["curve"] == pytest.approx(smooth(values, 0.6), rel=1e-12)
    assert browser["smoothed"] == [worth_smoothing(n, most) for n, most in sizes]
