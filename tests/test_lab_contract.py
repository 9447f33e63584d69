"""The JupyterLab extension and the server agree: each route's real JSON has exactly the keys (and simple
types) that labextension/src/types.ts declares, and the extension's package.json runs only tools it has.

The routes are called on a real Jupyter server (pytest-jupyter, nbtrain's server extension enabled) with a
real kernel running a real ``%%distributed 2 --cpu`` run, so the run, rank and process entries are the
ones a user's panel receives. Only NVML is a stand-in (no GPU here), to get the GPU forms of the answers.
The TypeScript side is read by tests/helpers/tsinterfaces.py.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from helpers import fake_nvml
from helpers.agents import waiting_agent
from helpers.serverhelp import ENDLESS_RUN, fetch_json, open_notebook_kernel, wait_for
from helpers.tsinterfaces import literals, mismatches, parse_interfaces

# pytest-jupyter's fixtures, for this module only (see test_server_routes.py for why they are imported).
from pytest_jupyter.jupyter_server import *  # noqa: F403
from tornado.httpclient import HTTPClientError

from nbtrain.server.handlers import ROUTES
from nbtrain.wire.runfolder import RunFolder, reserve

pytestmark = pytest.mark.usefixtures("no_leftover_workers")

LABEXTENSION = Path(__file__).resolve().parent.parent / "labextension"
# Each route's successful answer, by the interface in types.ts that describes it.
REPLIES = {"gpus": "IMachine", "runs": "IRunsReply", "processes": "IProcessesReply", "stop": "IStopReply",
           "leases/release": "IReleaseReply", "detached/stop": "IDetachedStopReply"}


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"nbtrain.server": True}}}


def interfaces() -> dict:
    return parse_interfaces((LABEXTENSION / "src" / "types.ts").read_text())


def test_every_route_has_an_interface_for_its_answer():
    assert set(REPLIES) == set(ROUTES)
    assert set(REPLIES.values()) | {"IErrorReply"} <= set(interfaces())


def test_route_answers_have_the_keys_types_ts_declares(jp_fetch, jp_serverapp, jp_asyncio_loop):
    answers = jp_asyncio_loop.run_until_complete(_answers_of_a_real_run(jp_fetch, jp_serverapp))
    declared = interfaces()
    problems = [p for label, interface, value in answers for p in mismatches(value, interface, declared, label)]
    assert not problems, "the server's JSON and labextension/src/types.ts disagree:\n" + "\n".join(problems)
    assert {label.split(" ")[0] for label, _, _ in answers} >= set(REPLIES)


async def _answers_of_a_real_run(jp_fetch, jp_serverapp) -> list[tuple[str, str, object]]:
    """(label, interface, JSON) for every route, in each of the forms the panel meets."""
    answers = [("gpus (no GPU)", "IMachine", (await fetch_json(jp_fetch, "nbtrain", "gpus"))[1]),
               ("runs (none)", "IRunsReply", (await fetch_json(jp_fetch, "nbtrain", "runs"))[1])]
    kernel_id, kernel = await open_notebook_kernel(jp_fetch, jp_serverapp, "train.ipynb")
    try:
        await kernel.ready()
        await kernel.run("%load_ext nbtrain")
        cell = kernel.start(ENDLESS_RUN)
        running = await _running(jp_fetch, kernel_id)
        answers.append(("runs (running)", "IRunsReply", running))
        rank_pids = [r["pid"] for r in running["runs"][0]["ranks"]]
        with pytest.MonkeyPatch.context() as patch:
            # One GPU holding a rank, one holding a process of no kernel (this test's own process).
            fake_nvml.install(patch, [fake_nvml.FakeGpu(processes=[(rank_pids[0], 2**30)]),
                                      fake_nvml.FakeGpu(uuid="GPU-1", processes=[(os.getpid(), 2**29)])])
            answers.append(("gpus (GPUs)", "IMachine", (await fetch_json(jp_fetch, "nbtrain", "gpus"))[1]))
            answers.append(("processes", "IProcessesReply", (await fetch_json(jp_fetch, "nbtrain", "processes"))[1]))
        code, stopped = await fetch_json(jp_fetch, "nbtrain", "stop", method="POST",
                                         body=json.dumps({"kernel_id": kernel_id}))
        assert code == 202
        answers.append(("stop", "IStopReply", stopped))
        reply, output = await kernel.finish(cell, timeout=30)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", output[-2000:]
        answers.append(("runs (ended)", "IRunsReply", (await fetch_json(jp_fetch, "nbtrain", "runs"))[1]))
        answers.append(("stop (refused, 409)", "IErrorReply", await _refusal(jp_fetch, {"kernel_id": kernel_id})))
        answers.append(("stop (refused, 400)", "IErrorReply", await _refusal(jp_fetch, {})))
        # A GPU nobody leases: refused (the browser test gives one back: tests/test_shared_server_lab_browser.py)
        answers.append(("leases/release (refused, 404)", "IErrorReply",
                        await _refusal(jp_fetch, {"gpu": 7}, "leases/release")))
        answers += await _detached_answers(jp_fetch)
    finally:
        kernel.close()
    return answers


async def _detached_answers(jp_fetch) -> list[tuple[str, str, object]]:
    """A detached run of this user's (its folder, and a real agent as /proc shows it): listed, then stopped."""
    with tempfile.TemporaryDirectory() as runs, pytest.MonkeyPatch.context() as patch, waiting_agent() as agent:
        patch.setenv("NBTRAIN_RUNS_DIR", runs)
        reserve("train-2", {"notebook": "train.ipynb"})
        RunFolder("train-2", nprocs=2, agent_pid=agent.pid).step(3)
        listed = (await fetch_json(jp_fetch, "nbtrain", "runs"))[1]
        assert listed["detached"], listed
        code, stopped = await fetch_json(jp_fetch, "nbtrain", "detached", "stop", method="POST",
                                         body=json.dumps({"run_id": "train-2"}))
        assert code == 202
        refused = await _refusal(jp_fetch, {"run_id": "gone"}, "detached/stop")
    return [("runs (detached)", "IRunsReply", listed), ("detached/stop", "IDetachedStopReply", stopped),
            ("detached/stop (refused, 404)", "IErrorReply", refused)]


def test_a_node_runs_answer_lists_its_nodes_as_types_ts_declares(jp_fetch, jp_serverapp, jp_asyncio_loop):
    """A --nodes run on two emulated nodes: /nbtrain/runs lists each node with its heartbeats' CPU and RAM."""
    running = jp_asyncio_loop.run_until_complete(_a_node_run(jp_fetch, jp_serverapp))
    assert not mismatches(running, "IRunsReply", interfaces(), "runs (nodes)")
    nodes = running["runs"][0]["nodes"]
    assert sorted((n["name"], n["state"]) for n in nodes) == [("a", "running"), ("b", "running")], nodes
    assert sorted(rank for n in nodes for rank in n["ranks"]) == [0, 1]
    assert sorted(n["address"] for n in nodes) == ["127.0.0.2", "127.0.0.3"]
    assert all(n["cpu_percent"] is not None and n["ram_percent"] is not None and n["gpus"] == [] for n in nodes)


async def _a_node_run(jp_fetch, jp_serverapp) -> dict:
    kernel_id, kernel = await open_notebook_kernel(jp_fetch, jp_serverapp, "nodes.ipynb")
    try:
        await kernel.ready()
        await kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --emulate 2")
        cell = kernel.start(ENDLESS_RUN.replace("%%distributed 2 --cpu", "%%distributed --nodes 2 --rdzv-host 127.0.0.1 "
                                                "--cpu --start-timeout 120"))

        async def probe():
            _, body = await fetch_json(jp_fetch, "nbtrain", "runs")
            ours = [r for r in body["runs"] if r["kernel_id"] == kernel_id and r["state"] == "running"]
            heard = ours and len(ours[0]["nodes"]) == 2 and all(n["cpu_percent"] is not None for n in ours[0]["nodes"])
            return body if heard else None

        running = await wait_for(probe, "the node run to list its nodes", timeout=150)
        await fetch_json(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps({"kernel_id": kernel_id}))
        await kernel.finish(cell, timeout=30)
        await kernel.run("%distributed_shutdown")  # the emulated agents leave with the pool
    finally:
        kernel.close()
    return running


async def _running(jp_fetch, kernel_id) -> dict:
    async def probe():
        _, body = await fetch_json(jp_fetch, "nbtrain", "runs")
        ours = [r for r in body["runs"] if r["kernel_id"] == kernel_id and r["state"] == "running"]
        return body if ours and (ours[0]["step"] or 0) >= 1 and len(ours[0]["ranks"]) == 2 else None

    return await wait_for(probe, "the run to be listed as running", timeout=90)


async def _refusal(jp_fetch, body: dict, route: str = "stop") -> dict:
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch("nbtrain", *route.split("/"), method="POST", body=json.dumps(body))
    return json.loads(caught.value.response.body)


def test_package_scripts_use_only_tools_the_package_has():
    """Every command a `jlpm <script>` runs is jlpm, jupyter, node (which runs every script), or a binary of a
    declared dependency."""
    package = json.loads((LABEXTENSION / "package.json").read_text())
    declared = {**package.get("dependencies", {}), **package.get("devDependencies", {})}
    # Binaries and the npm package that provides each (only those a JupyterLab extension commonly uses).
    provided_by = {"tsc": "typescript", "rimraf": "rimraf", "run-p": "npm-run-all2", "run-s": "npm-run-all2",
                   "concurrently": "concurrently", "eslint": "eslint", "prettier": "prettier", "jest": "jest",
                   "esbuild": "esbuild"}
    for name, script in package["scripts"].items():
        for command in re.split(r"&&|\|\||[;&|]", script):
            tool = command.split()[0] if command.split() else ""
            if tool in ("jlpm", "jupyter", "node", ""):
                continue
            assert provided_by.get(tool) in declared, (
                f"script {name!r} runs {tool!r}, which no dependency in labextension/package.json provides")


def test_run_and_node_states_have_the_same_names_in_python_and_types_ts():
    """One set of state names: the run registry writes RunState's values, the panel's types allow exactly them."""
    from nbtrain.kernel.observers.events import GroupState, NodeState, RunState

    shapes = interfaces()
    assert literals(shapes, "RunState") == {state.value for state in RunState}
    assert literals(shapes, "NodeState") == {state.value for state in NodeState}
    assert literals(shapes, "GroupState") == {state.value for state in GroupState}
    from nbtrain.wire.runfolder import RecordedState

    assert literals(shapes, "DetachedState") == {state.value for state in RecordedState}
