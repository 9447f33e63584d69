"""A ``--nodes`` run's machines reach every observer through the real run path: the dashboard's model (what its
device panel draws, what its advisor judges) and the run registry that the JupyterLab panel reads through
``/nbtrain/runs``.

Two emulated node agents × 1 rank on gloo run a cell long enough for a few heartbeats; the run goes through
``run_source`` and the restart wrapper that every run passes, as the magic's does. The agent on 127.0.0.2 reads
two stand-in GPUs (``helpers.fake_nvml`` in its process): a busy one held down by its power cap, with 18 NVLink
links, and one in MIG mode with an instance.
"""

from __future__ import annotations

import io
import os

import pytest
from helpers import fake_nvml

from nbtrain.kernel.dashboard.devices_view import devices_html
from nbtrain.kernel.dashboard.observer import DashboardObserver
from nbtrain.kernel.dashboard.text_status import TextStatus
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.observers.registry import RunRegistry, read_runs
from nbtrain.kernel.request.config import LaunchRequest
from nbtrain.server.kernels import KernelView
from nbtrain.server.runs import describe_runs

pytestmark = pytest.mark.timeout(300)

GIB = 2**30
GPUS = [{"util": 95, "clock_reasons": 0x4, "nvlinks": [1] * 18, "power_mw": 690_000},
        {"mig": True, "processes": None, "mig_devices": [{"uuid": "MIG-7f3a-a", "total": 10 * GIB, "used": 3 * GIB}]}]
CELL = "import time\ntime.sleep(4.0)  # a few heartbeats (one a second) while the run is live\ndone = rank\n"


def test_node_telemetry_reaches_the_dashboard_model_and_the_runs_route(nodes, tmp_path):
    nodes.start("127.0.0.2", env=fake_nvml.process_env(GPUS))
    nodes.start("127.0.0.3")
    dashboard = DashboardObserver(lambda model: TextStatus(model, every=0.5, stream=io.StringIO()), interval=0.25)
    registry = RunRegistry(str(tmp_path / "runs"))
    heard: list[list[dict]] = []
    original = registry.nodes_heard
    registry.nodes_heard = lambda infos: (heard.append(describe(registry)), original(infos))  # type: ignore[method-assign]
    request = LaunchRequest(nodes="2", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, start_timeout=120,
                            max_restarts=0)
    run_source(CELL, request, {}, manager=nodes.manager, observers=[dashboard, registry])
    names = sorted(node.name for node in dashboard.model.nodes)
    assert names == ["a", "b"], dashboard.model.nodes
    assert all(node.ranks for node in dashboard.model.nodes), "each machine with its ranks"
    assert heard, "the run told the registry of its nodes while it ran"
    live = [node for nodes_now in heard for node in nodes_now]
    assert {node["name"] for node in live} == {"a", "b"}
    assert all(node["state"] == "running" for node in heard[-1]), heard[-1]
    with_gpus = next(node for node in dashboard.model.nodes if node.address == "127.0.0.2")
    check_node_gpus(with_gpus, dashboard, [node for node in heard[-1] if node["name"] == with_gpus.name][0])
    assert "GPU 0 95% 2.0/80 GiB, GPU 1 N/A 2.0/80 GiB" in nodes.hub.describe()[0 if with_gpus.name == "a" else 1]


def check_node_gpus(node, dashboard, listed: dict) -> None:
    """The node's GPUs as its heartbeats carried them: structured in the model, drawn as local GPUs are in the
    device panel, written as a health line for the lab panel, and judged by the advisor under the node's name."""
    busy, mig = (gpu.status for gpu in node.gpus)
    assert busy.health.clock_reasons == ("power cap",) and busy.health.nvlinks == 18 and busy.power == 690.0
    assert [(d.uuid, d.memory_used, d.memory_total) for d in mig.mig_devices] == [("MIG-7f3a-a", 3 * GIB, 10 * GIB)]
    shown = devices_html(None, None, dashboard.model.nodes)
    rows = shown[shown.index(f"<b>node {node.name}</b>"):]
    assert "<b>GPU 0</b> NVIDIA H100 80GB HBM3 · 50°C · 690/700 W" in rows and "NVLink 18 up" in rows
    assert "slowed by power cap" in rows and "MIG 0 MIG-7f3a-a · mem" in rows and "3.0 GiB / 10.0 GiB" in rows
    assert "slowed by power cap" in listed["gpus"][0]["health"] and "NVLink 18 up" in listed["gpus"][0]["health"]
    [hint] = [h.text for h in dashboard.model.hints() if h.rule == "gpu-slowed"]
    assert hint == f"node {node.name} GPU 0 spent 100 % of the run slowed by its power cap (690 of 700 W).", hint


def describe(registry: RunRegistry) -> list[dict]:
    """The nodes of this process's run as ``/nbtrain/runs`` lists them, from the file the registry wrote."""
    this_kernel = {"": KernelView("", os.getpid(), "notebook.ipynb", "notebook")}
    runs = describe_runs(this_kernel, read_runs(registry.directory))
    return runs[0]["nodes"] if runs else []
