"""--price-per-gpu-hour: what a run holds (GPUs, or cores on the CPU), its hours and their cost — in the summary
line, the dashboard's run panel and nbtrain.runs()."""

from __future__ import annotations

import os
import re
import time

import pytest
from IPython.core.error import UsageError

from helpers.workers import nbtrain_workers
from nbtrain.kernel.dashboard.metric_store import MetricStore
from nbtrain.kernel.dashboard.run_view import run_html
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, PoolSpec, resolve
from nbtrain.kernel.ranks.spec import NodesSpec
from nbtrain.kernel.observers.cost import Metering, metering_for
from nbtrain.kernel.observers.events import NodeInfo, NodeState


def spec(nodes: int = 0, **fields) -> PoolSpec:
    """A pool spec; ``nodes``: that many machines of nprocs / nodes ranks each."""
    base = dict(nprocs=2, backend="gloo", device_type="cpu", gpu_ids=(), timeout_s=600.0)
    where = {**base, **fields}
    if nodes:
        where["nodes"] = NodesSpec(nodes, where["nprocs"] // nodes, "h")
    return PoolSpec(**where)


def node(name: str, ranks, cpus) -> NodeInfo:
    return NodeInfo(name, name, "10.0.0.1", tuple(ranks), NodeState.RUNNING, time.time(), None, None, (), cpus)


@pytest.mark.parametrize("pool, nodes, unit, count", [
    (spec(nprocs=4, backend="nccl", device_type="cuda", gpu_ids=(0, 1, 2, 3)), (), "GPU", 4),
    (spec(nprocs=2, backend="nccl", device_type="cuda", gpu_ids=(0, 1, 2, 3)), (), "GPU", 2),
    (spec(nprocs=8, device_type="cuda", gpu_ids=(0, 2)), (), "GPU", 2),  # gloo: 4 ranks on each GPU, held once
    (spec(nprocs=16, backend="nccl", device_type="cuda", nodes=2), (), "GPU", 16),
    (spec(nprocs=4, env=(("OMP_NUM_THREADS", "3"),)), (), "core", min(12, os.cpu_count() or 1)),
    (spec(nprocs=4, nodes=2, env=(("OMP_NUM_THREADS", "1"),)),
     (node("a", (0, 1), 32), node("b", (2, 3), 32)), "core", 4),
    (spec(nprocs=4, nodes=2),  # the nodes' cores divided among their ranks
     (node("a", (0, 1), 32), node("b", (2, 3), 7)), "core", 32 + 6),
])
def test_a_run_holds_its_gpus_or_its_ranks_cores(pool, nodes, unit, count, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert metering_for(pool, nodes, 2.0) == Metering(unit, count, 2.0)


def test_one_machine_on_the_cpu_holds_its_cores_divided_among_the_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = os.cpu_count() or 1
    assert metering_for(spec(nprocs=1)).count == cores
    assert metering_for(spec(nprocs=cores * 2)).count == cores  # more ranks than cores: each has one, shared
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel's own setting reaches the ranks
    assert metering_for(spec(nprocs=1)).count == 1


def test_hours_and_cost():
    eight = Metering("GPU", 8, 2.5)
    assert eight.hours(1800) == pytest.approx(4.0) and eight.cost(1800) == pytest.approx(10.0)
    assert eight.words(1800) == "4.00 GPU-hours · cost 10.00"
    small = Metering("core", 2, 0.05)
    assert small.words(9.0) == "0.005 core-hours · cost 0.00025"
    assert Metering("GPU", 1).cost(3600) is None and Metering("GPU", 1).words(3600) == "1.00 GPU-hours"


def test_the_price_comes_from_the_option_then_its_variable(monkeypatch):
    monkeypatch.delenv("NBTRAIN_PRICE_PER_GPU_HOUR", raising=False)
    assert resolve(LaunchRequest(cpu=True)).price_per_hour is None
    assert resolve(LaunchRequest(cpu=True, price_per_gpu_hour=0)).price_per_hour == 0
    monkeypatch.setenv("NBTRAIN_PRICE_PER_GPU_HOUR", "1.75")
    assert resolve(LaunchRequest(cpu=True)).price_per_hour == 1.75
    assert resolve(LaunchRequest(cpu=True, price_per_gpu_hour=3.0)).price_per_hour == 3.0


@pytest.mark.parametrize("request_, environ, message", [
    (LaunchRequest(cpu=True, price_per_gpu_hour=-1.0), {}, "--price-per-gpu-hour takes the price of one GPU for an "
     "hour (of one core on the CPU), a number of 0 or more such as --price-per-gpu-hour 2.5 (got -1.0)."),
    (LaunchRequest(cpu=True, price_per_gpu_hour=float("nan")), {}, "a number of 0 or more"),
    (LaunchRequest(cpu=True), {"NBTRAIN_PRICE_PER_GPU_HOUR": "cheap"},
     "NBTRAIN_PRICE_PER_GPU_HOUR must be a number (got 'cheap')."),
])
def test_a_bad_price_says_what_it_takes(request_, environ, message, monkeypatch):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(request_)


@pytest.mark.parametrize("line, message", [
    ("2 --cpu --price-per-gpu-hour -2", "a number of 0 or more"),
    ("2 --cpu --price-per-gpu-hour two", "argument --price-per-gpu-hour: invalid float value"),
])
def test_a_bad_price_stops_the_cell_before_any_process(shell, line, message):
    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match=message):
        shell.run_cell_magic("distributed", line, "x = 1\n")
    assert {p.pid for p in nbtrain_workers()} == before


def test_the_run_panel_shows_the_hours_and_cost_so_far():
    shown = run_html(MetricStore(), None, (), 1800.0, None, metering=Metering("GPU", 8, 2.5))
    assert "elapsed 30 min 0 s · 4.00 GPU-hours · cost 10.00" in shown
    assert "GPU-hours" not in run_html(MetricStore(), None, (), 1800.0, None, metering=Metering("GPU", 8))


@pytest.mark.slow
def test_a_cpu_run_with_a_price_carries_its_core_hours_in_the_summary_and_runs(shell, capsys, monkeypatch):
    import nbtrain

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    shell.run_cell("%%distributed 2 --cpu --no-dashboard --price-per-gpu-hour 3600\nimport time\ntime.sleep(2.0)\n"
                   ).raise_error()
    summary = capsys.readouterr().out
    cores = metering_for(spec(nprocs=2)).count
    seconds = float(re.search(r"· ([\d.]+) s", summary).group(1))
    shown = re.search(r"· ([\d.]+) core-hours · cost ([\d.]+)", summary)
    assert shown, summary
    assert float(shown.group(2)) == pytest.approx(cores * seconds, rel=0.06)  # 3600 a core-hour: a core-second each
    row = nbtrain.runs().to_dicts()[-1]
    assert row["gpu_hours"] is None and row["core_hours"] == pytest.approx(cores * row["seconds"] / 3600)
    assert row["cost"] == pytest.approx(row["core_hours"] * 3600) and row["cost"] == pytest.approx(cores * seconds,
                                                                                                  rel=0.1)
    assert "--price-per-gpu-hour 3600" in row["options"]
