"""A ``--nodes`` run's machines reach every observer through the real run path: the dashboard's model (what its
device panel draws) and the run registry that the JupyterLab panel reads through ``/nbtrain/runs``.

Two emulated node agents × 1 rank on gloo run a cell long enough for a few heartbeats; the run goes through
``run_source`` and the restart wrapper that every run passes, as the magic's does.
"""

from __future__ import annotations

import io
import os

import pytest

from nbtrain.dashboard.observer import DashboardObserver
from nbtrain.dashboard.text_status import TextStatus
from nbtrain.launch.lifecycle.entry import run_source
from nbtrain.launch.observers.registry import RunRegistry, read_runs
from nbtrain.launch.request.config import LaunchRequest
from nbtrain.server.kernels import KernelView
from nbtrain.server.runs import describe_runs

pytestmark = pytest.mark.timeout(300)

CELL = "import time\ntime.sleep(3.0)  # a few heartbeats (one a second) while the run is live\ndone = rank\n"


def test_node_telemetry_reaches_the_dashboard_model_and_the_runs_route(nodes, tmp_path):
    nodes.start("127.0.0.2")
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


def describe(registry: RunRegistry) -> list[dict]:
    """The nodes of this process's run as ``/nbtrain/runs`` lists them, from the file the registry wrote."""
    this_kernel = {"": KernelView("", os.getpid(), "notebook.ipynb", "notebook")}
    runs = describe_runs(this_kernel, read_runs(registry.directory))
    return runs[0]["nodes"] if runs else []
