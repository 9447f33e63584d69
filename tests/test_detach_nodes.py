"""``%%distributed --detach --nodes N``: a run on several machines that outlives its kernel.

The run's agent (on this machine, in a session of its own) brings up the run's nodes itself: a hub of its own on
``--rdzv-host``, whose join command is said in the cell. Here the nodes are two agents started from that
command on 127.0.0.2 and 127.0.0.3, as a person on two machines would start them (the token from its 0600 file),
or the agents of a Slurm job the run's agent submits (``--slurm``, on the tests' private one-host Slurm).
The kernel is SIGKILLed while the ranks train and all-reduce across the nodes; they keep stepping; a new kernel
attaches and gets the whole history and the names. Nothing is left: not the run's agent, not its nodes' agents, not
a rank. The options that only a kernel could carry out are refused before anything starts.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers.detachhelp import kernels, runs  # noqa: F401  (the fixtures)
from helpers.detachhelp import assert_nothing_left, start_detached, wait_for_step
from helpers.nodehelp import until
from helpers.restart_cells import lost_node_cell
from helpers.slurmhelp import slurm_cluster  # noqa: F401  (the session's private Slurm)

from nbtrain.kernel.cluster.hub import sampled_info
from nbtrain.kernel.cluster.tokens import token_dir
from nbtrain.kernel.observers.events import NodeState
from nbtrain.kernel.observers.registry import read_runs
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve
from nbtrain.wire import runfolder
from nbtrain.wire.link import JoinToken
from nbtrain.wire.runfolder import RecordedState

TRAINING = """%%distributed --detach --nodes 2 --nproc-per-node 1 --rdzv-host 127.0.0.1 --cpu --no-dashboard
import time, torch, torch.distributed as dist, nbtrain
w = torch.zeros(3)
for step in range(STEPS):
    both = torch.ones(1)
    dist.all_reduce(both)  # the two nodes' ranks are one group
    w += step * both.item() / 2
    nbtrain.log(seen=step)
    if rank == 0 and step % 20 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.05)
total = float(w.sum())
nbtrain.log(checksum=total)
"""


def test_detach_with_nodes_is_a_run_of_the_agent_that_brings_those_nodes():
    config = resolve(LaunchRequest(nodes="2", nproc_per_node=2, rdzv_host="127.0.0.1", cpu=True, detach=True))
    where = config.pool.nodes
    assert where is not None and where.detached and where.count == 1 and where.nproc_per_node == 4
    assert where.spread is not None and (where.spread.count, where.spread.nproc_per_node) == (2, 2)
    assert where.spread.rdzv_host == "127.0.0.1" and not where.spread.detached


@pytest.mark.parametrize("extra, message", [
    ({"nodes": "1:2"}, "elastic --nodes 1:2"),
    ({"nodes": "2", "preemption_url": "http://127.0.0.1:9/notice"}, "--preemption-url"),
    ({"nodes": "2", "session": "s"}, "--session"),
])
def test_what_only_a_kernel_can_carry_out_is_refused_with_detach_and_nodes(extra, message):
    with pytest.raises(ConfigError, match=message):
        resolve(LaunchRequest(rdzv_host="127.0.0.1", cpu=True, detach=True, **extra))


def _join_the_runs_hub(agent_pid: int, addresses=("127.0.0.2", "127.0.0.3")) -> list[subprocess.Popen]:
    """Node agents on ``addresses``, joined with the token the run's agent keeps in its 0600 file."""
    path = until(lambda: glob.glob(os.path.join(token_dir(), f"pool-{agent_pid}-*.token")), 60, "the run's join token")[0]
    assert os.stat(path).st_mode & 0o077 == 0
    with open(path) as fh:
        token = JoinToken.decode(fh.read().strip())
    agents = []
    for address in addresses:
        agents.append(subprocess.Popen([sys.executable, "-m", "nbtrain.node", "--join", f"{token.host}:{token.port}",
                                        "--token-file", path, "--address", address],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return agents


@contextlib.contextmanager
def _nodes_of(run_id: str):
    """Two node agents joined to run ``run_id``'s hub (more may be added to the list); any still there at the end
    is killed, whatever the test found."""
    agents = _join_the_runs_hub(until(lambda: runfolder.read_manifest(run_id), 30, "the run's record").agent_pid)
    try:
        yield agents
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def _until_ended(run_id: str, timeout: float) -> runfolder.RunSummary:
    return until(lambda: (s := runfolder.read_manifest(run_id)) and s.state is not RecordedState.RUNNING and s,
                 timeout, "the run's end")


def _nodes_listed(kernel_pid: int) -> list[dict]:
    """The nodes the kernel lists for its run (the run registry the JupyterLab panel reads): each machine, as
    its heartbeat says, relayed by the run's agent."""
    return [node for record in read_runs() if record.get("kernel_pid") == kernel_pid
            for node in record.get("nodes") or []]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_detached_run_on_two_nodes_outlives_a_killed_kernel_and_comes_back_whole(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, seconds = start_detached(first, TRAINING, steps=120)
    assert seconds < 5.0  # the cell returns while the nodes come
    with _nodes_of(run_id) as agents:
        at_kill = wait_for_step(run_id, 20)
        # each node's own heartbeat, relayed by the agent: its load is N/A (None) until a heartbeat has measured it
        nodes = until(lambda: (listed := _nodes_listed(first.pid())) and
                      all(n["cpu_percent"] is not None for n in listed) and listed, 30,
                      "the kernel to list the run's nodes with their load")
        assert sorted(n["ranks"] for n in nodes) == [[0], [1]], nodes  # each node, not the agent as one node
        assert {n["address"] for n in nodes} == {"127.0.0.2", "127.0.0.3"} and {n["state"] for n in nodes} == {"running"}
        os.kill(first.pid(), signal.SIGKILL)
        later = wait_for_step(run_id, at_kill.step + 15)  # both nodes keep stepping with no kernel
        assert later.state is RecordedState.RUNNING

        second = kernels()
        out = second.run("%distributed_attach", timeout=180)
        assert f"attached to detached run {run_id}" in out and "back in the notebook:" in out
        assert "step 0" in out and "step 100" in out
        total, logged, seen = json.loads(second.run(
            "import json; print(json.dumps([total, history['checksum'].last, list(history.series('seen', 0))]))"))
        assert total == logged == 3 * sum(range(120))  # every step all-reduced over both nodes
        assert seen == list(range(120))  # from step 0, no gap, no duplicate
        final = runfolder.read_manifest(run_id)
        assert final is not None and final.state is RecordedState.FINISHED
        assert_nothing_left(final)
        for agent in agents:  # the nodes' agents left with the run's agent
            assert agent.wait(15) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_detached_run_whose_nodes_never_come_ends_when_stopped_and_leaves_nothing(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=10)
    summary = until(lambda: runfolder.read_manifest(run_id), 30, "the run's record")
    out = first.run("%distributed_shutdown --detached", timeout=60)
    assert f"detached run {run_id} was stopped" in out
    final = _until_ended(run_id, 60)
    assert final.state is not RecordedState.FINISHED
    assert_nothing_left(summary)
    time.sleep(0.5)
    assert not glob.glob(os.path.join(token_dir(), f"pool-{summary.agent_pid}-*.token"))  # its hub's token went too


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_detached_slurm_run_outlives_its_kernel_and_its_job_ends_with_the_run(runs, kernels, slurm_cluster):  # noqa: F811
    first = kernels()
    cell = TRAINING.replace("--cpu", "--cpu --slurm --start-timeout 150")
    run_id, _ = start_detached(first, cell, steps=80)
    at_kill = wait_for_step(run_id, 10, timeout=180)  # the run's agent submitted the job; its nodes joined the agent
    jobs = slurm_cluster.jobs()
    assert len(jobs) == 1 and "|RUNNING|" in jobs[0], jobs
    os.kill(first.pid(), signal.SIGKILL)
    wait_for_step(run_id, at_kill.step + 10)  # the job's ranks keep stepping with no kernel

    second = kernels()
    out = second.run(f"%distributed_attach {run_id}", timeout=180)
    assert "back in the notebook:" in out
    assert second.run("print(total)").strip() == str(float(3 * sum(range(80))))
    until(lambda: not slurm_cluster.jobs(), 30, "the run's Slurm job to end with the run")
    assert_nothing_left(runfolder.read_manifest(run_id))


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_lost_node_of_a_detached_run_is_replaced_and_its_agent_restarts_the_run_with_no_kernel(
        runs, kernels, tmp_path):  # noqa: F811
    first = kernels()
    head = (f"%%distributed --detach --nodes 2 --nproc-per-node 1 --rdzv-host 127.0.0.1 --cpu --no-dashboard "
            f"--checkpoint {tmp_path / 'ckpt'} --max-restarts 1 --out steps,restart_count")
    run_id, _ = start_detached(first, head + lost_node_cell(tmp_path / "lost-once"))
    with _nodes_of(run_id) as agents:
        os.kill(first.pid(), signal.SIGKILL)  # no kernel from here on
        until(lambda: os.path.exists(tmp_path / "lost-once") and any(a.poll() is not None for a in agents), 120,
              "rank 1 to end its node's agent (the machine gone)")
        until(lambda: any(e["kind"] == "restart" for e in runfolder.read_events(run_id)[0]), 60,
              "the run's agent to decide a restart")
        agents.extend(_join_the_runs_hub(runfolder.read_manifest(run_id).agent_pid, ("127.0.0.4",)))  # the
        # replacement joins with the same command
        final = _until_ended(run_id, 180)
        assert final.state is RecordedState.FINISHED
        second = kernels()
        out = second.run(f"%distributed_attach {run_id}", timeout=120)
        assert re.search(r"node [ab] \(rank 1\) lost: (its connection broke|no heartbeat for 5 s)", out), out
        assert "(restart 1 of 1)" in out and "finished after 1 restart from the checkpoint" in out, out
        check = json.loads(second.run("import json; print(json.dumps([steps, restart_count, "
                                      "history.series('loss', 0).steps]))"))
        assert check == [6, 1, list(range(6))]  # 3 epochs × 2 steps, as if nothing had happened
        assert_nothing_left(final)
        for agent in agents:
            assert agent.wait(15) in (0, -signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stopping_a_detached_nodes_run_from_its_kernel_stops_the_ranks_on_every_node_a_follower_listed(
        runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=2000)
    with _nodes_of(run_id) as agents:
        wait_for_step(run_id, 10)
        second = kernels()  # follows the run's record: it lists the nodes the run's agent recorded
        second.run(f"%distributed_attach --background {run_id}")
        nodes = until(lambda: _nodes_listed(second.pid()), 30, "the attached kernel to list the run's nodes")
        assert sorted(n["ranks"] for n in nodes) == [[0], [1]], nodes
        assert {n["address"] for n in nodes} == {"127.0.0.2", "127.0.0.3"}
        began = time.monotonic()
        first.run("import nbtrain; nbtrain.last_run.stop()")
        final = _until_ended(run_id, 60)
        assert final.state is RecordedState.STOPPED and time.monotonic() - began < 60
        assert_nothing_left(final)
        for agent in agents:  # the nodes' agents left with the run
            assert agent.wait(15) == 0


def test_the_nodes_a_runs_agent_reports_are_read_field_by_field():
    """The kernel reads the nodes a detached run's agent relays (hub.node_sample) value by value, as it reads any
    heartbeat: N/A where a value does not read, nothing for what is not a node; never an exception."""
    info = sampled_info({"name": "a", "host": "gpu1", "address": "127.0.0.2", "ranks": [0, 1], "state": "running",
                         "silent_for": 0.5, "cpus": 8, "cpu_percent": 12.0, "ram_percent": 40.0, "gpus": []})
    assert info is not None
    assert (info.name, info.ranks, info.state, info.cpu_percent, info.cpus) == ("a", (0, 1), NodeState.RUNNING, 12.0, 8)
    junk = sampled_info({"name": "b", "ranks": ["x"], "state": "??", "silent_for": "soon", "cpu_percent": [1],
                         "gpus": {"0": 1}, "cpus": 1e99, "host": {"x": 1}})
    assert junk is not None
    assert (junk.ranks, junk.state, junk.cpu_percent, junk.gpus, junk.cpus, junk.host) == ((), NodeState.LOST, None, (),
                                                                                            None, "")
    assert sampled_info("a") is None and sampled_info({"name": 3}) is None and sampled_info({}) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_detached_nodes_run_that_ends_while_its_kernel_lives_brings_its_names_to_that_kernel(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=30)
    with _nodes_of(run_id) as agents:
        out = first.run("import nbtrain; nbtrain.last_run.wait(120); print(nbtrain.last_run.state.value, total)",
                        timeout=150)
        assert f"finished {float(3 * sum(range(30)))}" in out, out
        final = runfolder.read_manifest(run_id)
        assert final is not None and final.state is RecordedState.FINISHED
        assert_nothing_left(final)
        for agent in agents:
            assert agent.wait(15) == 0
