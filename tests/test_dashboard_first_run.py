"""What a newcomer's first run leaves, without a browser: a short run's load drawn as lines (or left out with a
reason, never as empty panels), one unit for the CPU in every view, one step count, and a summary short enough
to read. The same run in a real JupyterLab: tests/test_dashboard_browser.py."""

from __future__ import annotations

import re
import time

import pytest

from nbtrain.kernel.dashboard.devices_view import devices_html
from nbtrain.kernel.dashboard.final import final_figure, final_png, summary_paragraph
from nbtrain.kernel.dashboard.metric_store import MetricStore
from nbtrain.kernel.dashboard.progress import progress
from nbtrain.kernel.dashboard.telemetry_series import MACHINE, TIME_AXIS, TelemetrySeries
from nbtrain.kernel.dashboard.threads import Sampler
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.telemetry import NO_DRIVER, RankUsage, Snapshot, Telemetry

GiB = 2**30
HOST = HostStatus(cpu_percent=92.5, cpu_count=2, memory_used=5 * GiB, memory_total=24 * GiB)


def cpu_sample(at: float, rank_cpu: float | None = 93.0) -> Snapshot:
    ranks = (RankUsage(0, 101, "cpu", None, None, rank_cpu, GiB // 4), RankUsage(1, 102, "cpu", None, None, rank_cpu, GiB // 4))
    return Snapshot(at, (), ranks, HOST, f"{NO_DRIVER} (NVMLError_LibraryNotFound: NVML Shared Library Not Found)")


def telemetry_of(samples: int) -> TelemetrySeries:
    telemetry = TelemetrySeries()
    for i in range(samples):
        telemetry.add(cpu_sample(1000.0 + 0.25 * i, None if i == 0 else 93.0))  # a rank's first CPU %: no baseline
    return telemetry


def test_a_runs_first_second_is_sampled_four_times_not_once():
    """The quickstart trains for about a second: sampled once a second from the start it had one sample, drawn as
    nothing; its first samples are a quarter of a second apart."""
    samples: list = []
    sampler = Sampler(Telemetry(), samples.append, interval=1.0).start()
    time.sleep(1.1)
    sampler.stop()
    assert len(samples) >= 4, f"{len(samples)} samples in the run's first 1.1 s"
    sampler = Sampler(Telemetry(), samples.append, interval=1.0)
    sampler.taken = 100  # long after the start: the interval asked for
    assert sampler.next_period() == 1.0


def test_a_run_that_ends_before_the_machines_first_cpu_reading_stops_its_sampler_at_once():
    """The first snapshot needs 0.1 s of the machine's CPU history: the sampler waits for it itself, so a short
    cell's end, which stops and joins the sampler, does not wait for it (it cost every short cell 0.1 s)."""
    samples: list = []
    sampler = Sampler(Telemetry(), samples.append, interval=1.0).start()
    began = time.perf_counter()
    sampler.stop()
    assert time.perf_counter() - began < 0.05 and samples == [] and not sampler.running


def _load_axes(fig) -> list:
    return [ax for ax in fig.get_axes() if ax.get_xlabel() == TIME_AXIS]


def test_one_load_sample_leaves_no_empty_panels_but_says_why():
    store = MetricStore()
    store.add(0, [(s, 100.0 + s, {"loss": 1.0 / (s + 1)}) for s in range(160)])
    fig = final_figure(store, telemetry_of(1), "nbtrain · 2 ranks")
    assert _load_axes(fig) == [], "one sample draws no line: no panel of axes without one"
    notes = [t.get_text() for t in fig.texts]
    assert any("load over the run not drawn" in note for note in notes), notes


def test_a_run_with_nothing_to_draw_leaves_no_picture_only_its_summary():
    """A trivial cell (nothing logged, over before a second load sample): an empty picture was most of its cost."""
    assert final_png(MetricStore(), telemetry_of(1), "nbtrain · 2 ranks") is None
    assert final_png(MetricStore(), telemetry_of(2), "nbtrain · 2 ranks").startswith(b"\x89PNG")  # its load
    store = MetricStore()
    store.add(0, [(0, 100.0, {"loss": 1.0})])
    assert final_png(store, TelemetrySeries(), "nbtrain · 2 ranks").startswith(b"\x89PNG")  # its series


def test_a_few_load_samples_are_drawn_as_lines_with_their_points_marked():
    store = MetricStore()
    store.add(0, [(s, 100.0 + s, {"loss": 1.0 / (s + 1)}) for s in range(160)])
    busy, memory = _load_axes(final_figure(store, telemetry_of(4), "nbtrain · 2 ranks"))
    machine = next(line for line in busy.get_lines() if line.get_label() == "CPU (machine)")
    assert len(machine.get_xdata()) == 4 and machine.get_marker() == "o"
    assert machine.get_ydata()[-1] == pytest.approx(185.0), "% of one core: the machine's 2 cores at 92.5%"
    assert busy.get_xlim()[0] <= 0 and busy.get_xlim()[1] >= 0.75


def test_the_machines_cpu_is_in_percent_of_one_core_in_every_view():
    """The row over the chart said "machine CPU 93%" (of the machine) where the chart drew 185 and the summary
    "185% of a core": every view now says the load panels' unit."""
    telemetry = telemetry_of(4)
    row = devices_html(telemetry.latest, telemetry.sparks())
    shown = re.sub(r"<style>.*?</style>|<[^>]+>", " ", row)  # the text a reader sees
    machine_row = shown[shown.index("machine"):shown.index("rank 0")]
    assert "185% of a core" in machine_row and not re.search(r"\b9[23]%", machine_row), machine_row
    store = MetricStore()
    summary = summary_paragraph(store, telemetry, "finished", "", 2, "gloo on cpu", progress(store, 3.0))
    assert "185% of a core" in summary, summary


def test_a_cpu_quickstarts_summary_is_short_and_says_nothing_twice():
    store = MetricStore()
    store.add(0, [(s, 100.0 + s / 300, {"loss": 0.7 / (s + 1) ** 0.5}) for s in range(160)])
    summary = summary_paragraph(store, telemetry_of(4), "finished", "2 ranks finished in 6.7 s", 2, "gloo on cpu",
                                progress(store, 6.7), "cold start 5.8 s")
    words = summary.split()
    assert len(words) <= 60, f"{len(words)} words:\n{summary}"
    assert "NVMLError" not in summary and "No GPU on this machine" in summary, summary
    assert "communicator" not in summary and "names arrive" not in summary, summary
    assert re.search(r"\d+s\b", summary) is None, f"one form of durations, '7 s':\n{summary}"
    assert "2 ranks on gloo on cpu finished after 7 s, step 160" in summary and "lowest" not in summary, summary
    lines = summary.splitlines()
    assert len(lines) == len(set(lines)) and summary.count("cold start") == 1, summary


def test_the_step_counted_in_each_view_is_the_same(tmp_path):
    """A 423-step run's last logged step is 422: the JupyterLab panel said "step 422" (the registry's record) where
    the live line and the summary said 423. Every view now says the steps done."""
    from nbtrain.kernel.observers.registry import RunRegistry

    store = MetricStore()
    records = [(s, 100.0 + s, {"loss": 1.0}) for s in range(423)]
    store.add(0, records)
    registry = RunRegistry(str(tmp_path))
    try:
        registry.metrics(0, records)
        assert progress(store, 35.0).step == registry.record["step"] == 423
    finally:
        registry.remove()


def test_the_machines_line_is_grey_as_the_guide_says():
    """The user guide says the machine's line is grey; it was drawn near-black (#444444)."""
    from matplotlib import colors

    from nbtrain.kernel.dashboard.theme import device_style

    red, green, blue = colors.to_rgb(device_style(MACHINE)["color"])
    assert red == green == blue and 0.45 <= red <= 0.75, device_style(MACHINE)
