"""nbtrain's server routes on a real Jupyter server: auth, shapes, and stopping a real run of a real kernel.

The server runs in this process (pytest-jupyter); its kernel manager starts a real ipykernel that runs
``%%distributed 2 --cpu``. Only NVML is a stand-in (this machine has no GPU): it reports the run's real
rank processes as GPU processes, so the process → kernel → notebook mapping is exercised on a real
process tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import psutil
import pytest
from helpers import fake_nvml
from helpers.serverhelp import ENDLESS_RUN, fetch_json, open_notebook_kernel, wait_for

# pytest-jupyter's fixtures (jp_fetch, jp_serverapp, ... and their autouse clean-ups), imported into this
# module rather than registered as a plugin, so they apply to these tests only. Their coroutine-test hook
# is not active here, which is why each test drives its scenario on jp_asyncio_loop itself.
from pytest_jupyter.jupyter_server import *  # noqa: F403
from tornado.httpclient import HTTPClientError

from nbtrain.server.handlers import ROUTES

pytestmark = pytest.mark.usefixtures("no_leftover_workers")

NOTEBOOK = "work/train.ipynb"


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"nbtrain.server": True}}}


async def _refused(jp_fetch, *parts, **kwargs) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch(*parts, **kwargs)
    body = caught.value.response.body if caught.value.response is not None else b"{}"
    return caught.value.code, json.loads(body or b"{}")


def test_every_route_needs_authentication(jp_fetch, jp_asyncio_loop):
    jp_asyncio_loop.run_until_complete(_every_route_needs_authentication(jp_fetch))


async def _every_route_needs_authentication(jp_fetch):
    # jp_fetch puts every path under pytest-jupyter's non-root base_url, so this also checks that each
    # route is joined to it.
    no_token = {"Authorization": ""}
    assert set(ROUTES) == {"gpus", "runs", "processes", "stop", "leases/release", "detached/stop"}
    for route, handler in ROUTES.items():
        if "post" in vars(handler):
            code, _ = await _refused(jp_fetch, "nbtrain", *route.split("/"), method="POST",
                                     body=json.dumps({"pid": os.getpid(), "gpu": 0}), headers=no_token)
            assert code == 403, route
            continue
        code, _ = await _refused(jp_fetch, "nbtrain", route, headers=no_token)
        assert code == 403, route
        assert (await jp_fetch("nbtrain", route)).code == 200


def test_machine_state_without_a_gpu_falls_back_to_cpu_and_ram(jp_fetch, jp_asyncio_loop):
    jp_asyncio_loop.run_until_complete(_machine_state_without_a_gpu_falls_back_to_cpu_and_ram(jp_fetch))


async def _machine_state_without_a_gpu_falls_back_to_cpu_and_ram(jp_fetch):
    code, machine = await fetch_json(jp_fetch, "nbtrain", "gpus")
    assert code == 200
    if machine["gpus"]:
        pytest.skip("this machine has a GPU; the fallback is for machines without one")
    assert machine["gpu_error"]  # says why (no driver, no pynvml...)
    assert 0.0 <= machine["cpu"]["percent"] <= 100.0 and machine["cpu"]["count"] == psutil.cpu_count()
    assert machine["ram"]["total"] == psutil.virtual_memory().total
    assert 0 < machine["ram"]["used"] < machine["ram"]["total"]
    assert (await fetch_json(jp_fetch, "nbtrain", "processes"))[1] == {"processes": []}


def test_gpu_load_memory_and_processes_come_from_nvml(jp_fetch, monkeypatch, jp_asyncio_loop):
    jp_asyncio_loop.run_until_complete(_gpu_load_memory_and_processes_come_from_nvml(jp_fetch, monkeypatch))


async def _gpu_load_memory_and_processes_come_from_nvml(jp_fetch, monkeypatch):
    gpus = [fake_nvml.FakeGpu(uuid="GPU-0", used=41 * 2**30, util=73, processes=[(4242, 3 * 2**30)]),
            fake_nvml.FakeGpu(name="NVIDIA A100", uuid="GPU-1", total=40 * 2**30, used=0, util=0),
            fake_nvml.FakeGpu(uuid="GPU-2", used=9 * 2**30, processes=[])]  # a VM: none listed, 9 GiB used
    module = fake_nvml.install(monkeypatch, gpus)
    # A process in both the compute and the graphics list is one process.
    module.nvmlDeviceGetGraphicsRunningProcesses = module.nvmlDeviceGetComputeRunningProcesses
    _, machine = await fetch_json(jp_fetch, "nbtrain", "gpus")
    assert machine["gpu_error"] is None
    first, second, hidden = machine["gpus"]
    assert first == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": gpus[0].uuid, "utilization": 73,
                     "memory_used": 41 * 2**30, "memory_total": 80 * 2**30, "temperature": 50,
                     "power": 200.0, "power_limit": 700.0, "processes": [{"pid": 4242, "memory_used": 3 * 2**30}]}
    assert (second["index"], second["name"], second["memory_total"], second["processes"]) == (1, "NVIDIA A100",
                                                                                              40 * 2**30, [])
    assert hidden["processes"] is None and hidden["memory_used"] == 9 * 2**30  # unknown, not "none"
    assert [n for n in machine["notes"] if "GPU 2: the driver lists no processes" in n]
    _, listed = await fetch_json(jp_fetch, "nbtrain", "processes")
    assert {p["pid"] for p in listed["processes"]} == {4242}


def test_a_run_is_listed_mapped_to_its_notebook_and_stopped(jp_fetch, jp_serverapp, jp_root_dir, jp_asyncio_loop):
    jp_asyncio_loop.run_until_complete(_run_listed_mapped_and_stopped(jp_fetch, jp_serverapp, jp_root_dir))


async def _run_listed_mapped_and_stopped(jp_fetch, jp_serverapp, jp_root_dir):
    (jp_root_dir / "work").mkdir()
    kernel_id, kernel = await open_notebook_kernel(jp_fetch, jp_serverapp, NOTEBOOK)
    foreign = subprocess.Popen(["sleep", "120"])
    try:
        await kernel.ready()
        await _refusals_before_any_run(jp_fetch, jp_serverapp, kernel_id)
        await kernel.run("%load_ext nbtrain")

        # First run: listed with its notebook, ranks and progress; its ranks map to it; stopped by kernel id.
        cell = kernel.start(ENDLESS_RUN)
        run = await _running(jp_fetch, kernel_id)
        assert run["path"] == NOTEBOOK and run["name"] == "train.ipynb"
        assert run["kernel_pid"] == jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.pid
        assert run["nprocs"] == 2 and run["backend"] == "gloo" and run["device_type"] == "cpu"
        assert [(r["rank"], r["device"], r["alive"]) for r in run["ranks"]] == [(0, "cpu", True), (1, "cpu", True)]
        assert run["loss"] == pytest.approx(1.0 / run["step"])  # step: steps done
        rank_pids = [r["pid"] for r in run["ranks"]]
        await _processes_map_to_the_notebook(jp_fetch, kernel_id, rank_pids, foreign.pid)

        code, body = await _refused(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps({"pid": foreign.pid}))
        assert code == 404 and "belongs to no nbtrain run" in body["message"]
        assert foreign.poll() is None, "a refused stop must leave the process alone"

        await _stop_and_see_the_cell_end(jp_fetch, kernel, cell, {"kernel_id": kernel_id}, rank_pids)
        code, body = await _refused(jp_fetch, "nbtrain", "stop", method="POST",
                                    body=json.dumps({"kernel_id": kernel_id}))
        assert code == 409 and "interrupted" in body["message"]

        # Second run: stopped through the pid of one of its ranks (the server interrupts the kernel).
        cell = kernel.start(ENDLESS_RUN)
        run = await _running(jp_fetch, kernel_id)
        rank_pids = [r["pid"] for r in run["ranks"]]
        await _stop_and_see_the_cell_end(jp_fetch, kernel, cell, {"pid": rank_pids[1]}, rank_pids)
    finally:
        foreign.kill()
        foreign.wait()
        kernel.close()


async def _refusals_before_any_run(jp_fetch, jp_serverapp, kernel_id):
    code, body = await _refused(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps({"kernel_id": kernel_id}))
    assert code == 404 and "has no nbtrain run" in body["message"]
    code, body = await _refused(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps({"kernel_id": "nope"}))
    assert code == 404 and "no kernel 'nope'" in body["message"]
    for bad in ({"pid": "12"}, {"pid": True}, [kernel_id], {}):
        code, body = await _refused(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps(bad))
        assert code == 400 and "kernel_id" in body["message"], bad
    # A record that names this server's kernel but another process is not that kernel's run.
    service = jp_serverapp.web_app.settings["nbtrain"]
    os.makedirs(service.runs_directory, exist_ok=True)
    forged = {"version": 1, "kernel_pid": os.getpid(), "kernel_id": kernel_id, "state": "running", "ranks": [],
              "updated": time.time()}
    with open(os.path.join(service.runs_directory, "kernel-forged.json"), "w") as fh:
        json.dump(forged, fh)
    assert (await fetch_json(jp_fetch, "nbtrain", "runs"))[1]["runs"] == []
    code, _ = await _refused(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps({"kernel_id": kernel_id}))
    assert code == 404


async def _running(jp_fetch, kernel_id) -> dict:
    async def probe():
        _, body = await fetch_json(jp_fetch, "nbtrain", "runs")
        for run in body["runs"]:
            if run["kernel_id"] == kernel_id and run["state"] == "running" and (run["step"] or 0) >= 3:
                return run
        return None

    return await wait_for(probe, "the run to be listed as running with a few steps logged", timeout=90)


async def _processes_map_to_the_notebook(jp_fetch, kernel_id, rank_pids, foreign_pid):
    with pytest.MonkeyPatch.context() as patch:
        fake_nvml.install(patch, [fake_nvml.FakeGpu(processes=[(rank_pids[0], 2**30), (foreign_pid, 2**29)]),
                                  fake_nvml.FakeGpu(uuid="GPU-1", processes=[(rank_pids[1], 2**30)])])
        _, body = await fetch_json(jp_fetch, "nbtrain", "processes")
    found = {p["pid"]: p for p in body["processes"]}
    for rank, pid in enumerate(rank_pids):
        assert (found[pid]["kernel_id"], found[pid]["path"], found[pid]["rank"], found[pid]["gpu_index"]) == (
            kernel_id, NOTEBOOK, rank, rank)
    assert (found[foreign_pid]["kernel_id"], found[foreign_pid]["path"]) == (None, None)
    assert found[foreign_pid]["process_name"] == "sleep" and found[foreign_pid]["memory_used"] == 2**29


async def _stop_and_see_the_cell_end(jp_fetch, kernel, cell, request, rank_pids):
    started = time.monotonic()
    code, body = await fetch_json(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps(request))
    assert code == 202 and body["kernel_id"] == kernel.kernel_id and body["path"] == NOTEBOOK
    reply, output = await kernel.finish(cell, timeout=30)
    ended = time.monotonic() - started
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", output[-2000:]
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in rank_pids):
        assert time.monotonic() < deadline, f"ranks {rank_pids} still alive 5 s after the cell ended"
        time.sleep(0.1)
    print(f"stop request -> cell ended in {ended:.2f} s")


def test_a_background_run_is_listed_as_such_and_the_kernels_stop_does_not_claim_it(jp_fetch, jp_serverapp,
                                                                                     jp_asyncio_loop):
    jp_asyncio_loop.run_until_complete(_background_run_listed(jp_fetch, jp_serverapp))


async def _background_run_listed(jp_fetch, jp_serverapp):
    kernel_id, kernel = await open_notebook_kernel(jp_fetch, jp_serverapp, NOTEBOOK)
    try:
        await kernel.ready()
        await kernel.run("%load_ext nbtrain")
        await kernel.run(ENDLESS_RUN.replace("--cpu", "--cpu --background --no-dashboard", 1))
        run = await _running(jp_fetch, kernel_id)
        assert run["background"] == 1 and run["path"] == NOTEBOOK
        code, body = await _refused(jp_fetch, "nbtrain", "stop", method="POST", body=json.dumps({"kernel_id": kernel_id}))
        assert code == 409 and "is background run 1" in body["message"] and "nbtrain.last_run.stop()" in body["message"]
        await kernel.run("import nbtrain; nbtrain.last_run.stop()")
        _, body = await fetch_json(jp_fetch, "nbtrain", "runs")
        assert [(r["background"], r["state"]) for r in body["runs"]] == [(1, "interrupted")]
    finally:
        kernel.close()


def test_detached_runs_are_listed_and_stopped_through_their_own_agent(jp_fetch, tmp_path, monkeypatch, jp_asyncio_loop):
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    jp_asyncio_loop.run_until_complete(_detached_listed_and_stopped(jp_fetch))


async def _detached_listed_and_stopped(jp_fetch):
    from helpers.agents import waiting_agent

    from nbtrain.wire.runfolder import RecordedState, RunFolder, reserve

    with waiting_agent() as agent:  # a real node agent: the run's, as /proc shows it
        reserve("train-1", {"line": "2 --detach", "source": "pass", "notebook": "work/train.ipynb"})
        running = RunFolder("train-1", nprocs=2, agent_pid=agent.pid)
        running.step(41)
        ended = RunFolder("old-1", nprocs=4, agent_pid=agent.pid)
        ended.finish(RecordedState.FINISHED)
        _, listed = await fetch_json(jp_fetch, "nbtrain", "runs")
        rows = {row["run_id"]: row for row in listed["detached"]}
        assert rows["train-1"]["active"] and rows["train-1"]["step"] == 41 and rows["train-1"]["nprocs"] == 2
        assert rows["train-1"]["notebook"] == "work/train.ipynb" and rows["train-1"]["notebook_gone"]  # no such file
        assert rows["old-1"]["notebook"] is None and rows["old-1"]["notebook_gone"]  # never known: follow it here
        assert rows["train-1"]["attach"] == "%distributed_attach train-1"
        assert rows["old-1"]["state"] == "finished" and not rows["old-1"]["active"]
        for body, status in ((json.dumps({"run_id": "../x"}), 400), (json.dumps({"run_id": "nope"}), 404),
                             (json.dumps({"run_id": "old-1"}), 409)):
            code, refused = await _refused(jp_fetch, "nbtrain", "detached", "stop", method="POST", body=body)
            assert code == status and refused["message"], body
        assert agent.poll() is None  # none of those reached it
        code = (await jp_fetch("nbtrain", "detached", "stop", method="POST", body=json.dumps({"run_id": "train-1"}))).code
        assert code == 202
        agent.wait(30)  # the run's agent ended on the signal (a TimeoutExpired fails the test)


def test_a_detached_runs_notebook_is_named_under_the_servers_root_and_said_gone_once_removed(tmp_path):
    from nbtrain.server.detached_rows import _notebook

    root = tmp_path / "root"
    (root / "work").mkdir(parents=True)
    (root / "work" / "train.ipynb").write_text("{}")
    assert _notebook(str(root / "work" / "train.ipynb"), str(root)) == ("work/train.ipynb", False)  # Jupyter's full path
    assert _notebook("work/train.ipynb", str(root)) == ("work/train.ipynb", False)  # a path under the root
    (root / "work" / "train.ipynb").unlink()
    assert _notebook("work/train.ipynb", str(root)) == ("work/train.ipynb", True)
    outside = tmp_path / "elsewhere.ipynb"
    outside.write_text("{}")
    assert _notebook(str(outside), str(root)) == (None, True)  # there, but this server cannot open it
    assert _notebook(None, str(root)) == (None, True)
