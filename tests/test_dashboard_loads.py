"""The chart's load panels without a kernel or a browser: which telemetry samples are sent (only new ones), in
which units, and what an unknown value becomes."""

from __future__ import annotations

import math

from matplotlib import colors as matplotlib_colors

from nbtrain.kernel.dashboard.chart_feed import unpack
from nbtrain.kernel.dashboard.load_feed import CPU_TITLES, GPU_TITLES, LoadFeed
from nbtrain.kernel.dashboard.telemetry_series import TelemetrySeries
from nbtrain.gpu.devices import GpuStatus
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.telemetry import RankUsage, Snapshot

GiB = 2**30
HOST = HostStatus(cpu_percent=40.0, cpu_count=8, memory_used=8 * GiB, memory_total=32 * GiB)


def gpu_sample(t: float, busy: int | None, used: int) -> Snapshot:
    gpus = tuple(GpuStatus(i, "NVIDIA H100", f"GPU-{i}", busy, used * GiB, 80 * GiB, 60, 300.0, 700.0, ())
                 for i in (0, 1))
    return Snapshot(t, gpus, (), HOST, None)


def cpu_sample(t: float, ranks: int = 2) -> Snapshot:
    usage = tuple(RankUsage(r, 100 + r, "cpu", None, None, 90.0 + r, 4 * GiB) for r in range(ranks))
    return Snapshot(t, (), usage, HOST, "no NVIDIA driver was found")


def test_only_the_samples_since_the_last_poll_are_sent():
    telemetry = TelemetrySeries()
    feed = LoadFeed(telemetry)
    assert feed.poll() is None
    telemetry.add(gpu_sample(100.0, 50, 20))
    telemetry.add(gpu_sample(101.0, 70, 40))
    first = feed.poll()
    assert first is not None and first["titles"] == GPU_TITLES and first["devices"] == ["GPU 0", "GPU 1"]
    assert unpack(first["t"]) == [0.0, 1.0], "seconds since the run's first sample"
    assert unpack(first["busy"]["GPU 1"]) == [50.0, 70.0] and unpack(first["memory"]["GPU 0"]) == [25.0, 50.0]
    assert feed.poll() is None, "nothing new"
    telemetry.add(gpu_sample(102.0, 90, 60))
    second = feed.poll()
    assert second is not None and unpack(second["t"]) == [2.0] and unpack(second["busy"]["GPU 0"]) == [90.0]


def test_without_gpus_cpu_is_in_cores_and_ram_a_share_of_the_machine():
    telemetry = TelemetrySeries()
    feed = LoadFeed(telemetry)
    telemetry.add(cpu_sample(5.0))
    load = feed.poll()
    assert load is not None and load["titles"] == CPU_TITLES
    assert load["devices"] == ["rank 0", "rank 1", "CPU (machine)"], "ranks by number, the machine last"
    assert unpack(load["busy"]["rank 1"]) == [91.0]
    assert unpack(load["busy"]["CPU (machine)"]) == [320.0], "40 % of 8 cores: 3.2 cores, as the ranks count"
    assert unpack(load["memory"]["rank 0"]) == [12.5] and unpack(load["memory"]["CPU (machine)"]) == [25.0]


def test_unknown_values_and_absent_devices_are_nan_so_the_browser_draws_a_gap():
    telemetry = TelemetrySeries()
    feed = LoadFeed(telemetry)
    telemetry.add(gpu_sample(0.0, None, 10))  # a driver that does not report utilisation
    telemetry.add(cpu_sample(1.0, ranks=1))
    telemetry.add(cpu_sample(2.0, ranks=2))  # rank 1 reported from the second sample on
    load = feed.poll()
    assert load is not None
    assert all(math.isnan(v) for v in unpack(load["busy"]["GPU 0"])[:1])
    rank1 = unpack(load["busy"]["rank 1"])
    assert math.isnan(rank1[0]) and math.isnan(rank1[1]) and rank1[2] == 91.0
    assert all(len(unpack(column)) == 3 for column in load["busy"].values()), "every column as long as t"


def test_a_long_run_keeps_the_kernel_side_bounded():
    telemetry = TelemetrySeries()
    feed = LoadFeed(telemetry)
    for second in range(5000):
        telemetry.add(cpu_sample(float(second)))
        if second % 2:
            assert feed.poll() is not None
    assert len(telemetry.samples_since(0)) <= 60, "only the last minute of samples is kept for the chart"


def test_the_final_picture_draws_the_load_as_the_live_panels_do():
    """Same units (the machine's CPU in % of one core), titles, order, colours and dashes in the live load panels
    and the final figure; one legend under both panels names each device; a rank's line covered by another stays
    visible."""
    from nbtrain.kernel.dashboard.final import final_figure
    from nbtrain.kernel.dashboard.metric_store import MetricStore

    telemetry = TelemetrySeries()
    feed = LoadFeed(telemetry)
    for t in range(5):
        telemetry.add(cpu_sample(float(t)))
    live = feed.poll()
    assert live is not None
    figure = final_figure(MetricStore(), telemetry, "run")
    busy_ax, memory_ax = figure.axes
    assert (busy_ax.get_title(), memory_ax.get_title()) == tuple(live["titles"]) == CPU_TITLES
    memory_names = [live["memory_labels"].get(device, device) for device in live["devices"]]
    assert memory_names == ["rank 0", "rank 1", "RAM (machine)"], "the machine's line in the RAM panel is its RAM"
    legend, = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["rank 0", "rank 1", "machine (CPU, RAM)"]
    for ax, column, names in ((busy_ax, "busy", live["devices"]), (memory_ax, "memory", memory_names)):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == names, "the same devices, in the same order"
        for line, device in zip(lines, live["devices"], strict=True):
            style = live["styles"][device]
            assert matplotlib_colors.to_hex(line.get_color()) == style["color"]
            assert (line.get_linestyle() == "-") == (not style["dash"]), "dashed where the live line is dashed"
            assert list(line.get_ydata()) == unpack(live[column][device]), "the same values"
    colors = {style["color"] for style in live["styles"].values()}
    assert len(colors) == len(live["devices"]), "every device its own colour"
    ranks = [live["styles"][f"rank {r}"] for r in (0, 1)]
    assert ranks[0]["dash"] == [] and ranks[1]["dash"], "rank 1's line over rank 0's is dashed: both are seen"


def test_the_live_chart_and_the_final_figure_draw_the_logged_series_with_one_style():
    """The browser chart is sent the palette, widths and smoothing rule the final figure draws with."""
    from nbtrain.kernel.dashboard import chart, theme
    from nbtrain.kernel.dashboard.final import final_figure
    from nbtrain.kernel.dashboard.metric_store import MetricStore

    store = MetricStore()
    store.add(0, [(s, float(s), {"loss": 1.0 / (s + 1)}) for s in range(50)]
              + [(s, float(s), {"val_loss": 2.0 / (s + 1)}) for s in range(0, 50, 10)])
    style = chart.live_chart().chart_style
    assert style == theme.chart_style()
    ax = final_figure(store, TelemetrySeries(), "run").axes[0]
    bold = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [matplotlib_colors.to_hex(line.get_color()) for line in bold] == style["series_colors"][:2]
    raw = [line for line in ax.get_lines() if line.get_label().startswith("_")]
    assert len(raw) == 1, "loss (50 points) is smoothed over its raw line; val_loss (5 points) is not, live or here"
    assert style["smooth_min_points"] == 10 and style["smooth_dense_share"] == 0.25


def test_no_legend_of_the_final_picture_covers_a_plot():
    """The legends sit outside every panel's plot area: the series' beside their panel, the devices' under the
    load panels (inside a load panel, a legend of every device covered its lines)."""
    from nbtrain.kernel.dashboard.final import final_figure
    from nbtrain.kernel.dashboard.metric_store import MetricStore

    telemetry = TelemetrySeries()
    for t in range(20):
        telemetry.add(cpu_sample(float(t)))
    store = MetricStore()
    store.add(0, [(s, float(s), {"loss": 1.0 / (s + 1), "val_loss": 1.5 / (s + 1), "accuracy": s / 60}) for s in range(60)])
    figure = final_figure(store, telemetry, "run")
    figure.canvas.draw()
    legends = [*figure.legends, *(sub for subfigure in figure.subfigs for sub in subfigure.legends),
               *(ax.get_legend() for ax in figure.axes if ax.get_legend() is not None)]
    assert len(legends) == 2, "the loss panel's legend and the devices' legend"
    for legend in legends:
        box = legend.get_window_extent()
        for ax in figure.axes:
            assert not box.overlaps(ax.get_window_extent()), f"a legend covers the plot of {ax.get_title()!r}"


def test_the_final_picture_of_many_ranks_keeps_its_load_panels_and_names_the_rest_by_count():
    """200 CPU ranks: a legend of every rank under the load panels left them no height (matplotlib warned into the
    cell); the legend names the first eleven and the rest by their count."""
    import warnings

    from nbtrain.kernel.dashboard.final import final_figure
    from nbtrain.kernel.dashboard.metric_store import MetricStore
    from nbtrain.kernel.dashboard.plotting import png_bytes

    telemetry = TelemetrySeries()
    for t in range(5):
        telemetry.add(cpu_sample(float(t), ranks=200))
    figure = final_figure(MetricStore(), telemetry, "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied because axes sizes collapsed to zero"
        png_bytes(figure)
    legend, = figure.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels[:2] == ["rank 0", "rank 1"] and labels[-1] == "and 190 more" and len(labels) == 12
    assert all(ax.get_window_extent().height > 50 for ax in figure.axes), "the load panels keep their height"
