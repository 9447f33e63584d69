"""``--slurm``: the kernel starts the node agents as a job of a real Slurm.

The cluster is this machine as a one-node Slurm of its own (:mod:`helpers.slurmhelp`: munged, slurmctld and
slurmd on loopback, 2 CPUs). The cell's ``--rdzv-host`` is loopback, so the job is one node with a task per
agent, each connecting from 127.0.0.(2 + SLURM_PROCID) as emulated agents do. Through a real kernel: a 2-node
cell runs from an sbatch job (token in no command line and not in the batch script Slurm keeps) and
``%distributed_shutdown`` cancels it; a held job is shown ``PENDING (JobHeldUser)``, the stop button leaves it
queued, released it serves the next cell; a job past its time limit is a lost node "Slurm job N ended:
TIMEOUT (TimeLimit)"; sbatch refusing ARGS is said before anything starts; the kernel's exit cancels a job
still waiting; inside an allocation (``salloc --no-shell``, its id as the kernel's ``SLURM_JOB_ID``) the agents
run as an ``srun`` step of it. Without Slurm those tests skip, saying why; the option checks and the commands
nbtrain writes are tested here without it.
"""

from __future__ import annotations

import glob
import os
import re
import sys

import psutil
import pytest

from helpers.kernelhelp import Kernel
from helpers.nodehelp import until
from helpers.restart_cells import held_node_cell
from helpers.slurmhelp import slurm_cluster  # noqa: F401  (the session's private Slurm)
from helpers.workers import assert_no_workers
from nbtrain.kernel.cluster.slurm import agent_command, batch_script, srun_argv
from nbtrain.kernel.cluster.tokens import token_dir
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

BASE = "%%distributed --nodes 2 --rdzv-host 127.0.0.1 --cpu --start-timeout 120"
SUBMITTED = re.compile(r"submitted Slurm job (\d+)")


@pytest.mark.parametrize("request_args, message", [
    ({"slurm": "-p gpu"}, "--slurm starts the node agents of --nodes N"),
    ({"nodes": "2", "slurm": "--wrap=hostname"}, "not --wrap"),
    ({"nodes": "2", "slurm": "--comment='open"}, "No closing quotation"),
    ({"nodes": "2", "slurm": "", "hosts": "a,b"}, "--hosts and --slurm both start the node agents"),
])
def test_bad_slurm_options_are_refused_before_anything_starts(request_args, message):
    request = LaunchRequest(rdzv_host="127.0.0.1", cpu=True, **request_args)
    with pytest.raises(ConfigError, match=message):
        resolve(request)


@pytest.mark.parametrize("allocation, command", [("", "sbatch"), ("42", "srun")])
def test_missing_slurm_commands_are_said_before_anything_starts(monkeypatch, tmp_path, allocation, command):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm on it
    monkeypatch.setenv("SLURM_JOB_ID", allocation)
    with pytest.raises(ConfigError, match=f"start with {command}|submitted with {command}") as caught:
        resolve(LaunchRequest(nodes="2", rdzv_host="127.0.0.1", cpu=True, slurm="-p gpu"))
    assert "not on this machine's PATH" in str(caught.value)


def test_nbtrain_slurm_applies_to_node_cells_only(monkeypatch):
    monkeypatch.setenv("NBTRAIN_SLURM", "--time=10")
    assert resolve(LaunchRequest(nprocs=2, cpu=True)).pool.nodes is None  # a one-machine cell is unaffected
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert resolve(LaunchRequest(nodes="2", rdzv_host="10.0.0.5", cpu=True)).pool.nodes.slurm == ("--time=10",)
    assert resolve(LaunchRequest(nodes="1", rdzv_host="10.0.0.5", cpu=True, hosts="gpu1")).pool.nodes.slurm is None


def test_the_commands_name_the_token_file_never_the_token():
    command = agent_command("10.0.0.5:4000", "/home/u/.local/share/jupyter/runtime/nbtrain/tokens/pool-1.token",
                            "", loopback=False)
    assert "--token-file /home/u/.local/share/jupyter/runtime/nbtrain/tokens/pool-1.token" in command
    assert "--address" not in command  # a real node connects from its own address
    script = batch_script(2, 0, False, command, "/logs/slurm-nbtrain-%j.out")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in script
    assert "srun --whole --nodes=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 /bin/sh -c" in script
    assert "#SBATCH --signal=B:USR1@60\n" in script and "exec srun" not in script  # the warning is trapped, not fatal
    assert "--nodes=1\n#SBATCH --ntasks=3" in batch_script(3, 0, True, command, "out")  # loopback: one machine
    step = srun_argv(4, 2, False, ("--gpus-per-node=8",), command)
    assert step[:6] == ["srun", "--job-name=nbtrain-nodes", "--whole", "--nodes=2-4", "--ntasks-per-node=1",
                        "--gpus-per-node=8"]  # inside an allocation: a step of it, ARGS after nbtrain's words
    assert "127.0.0.$((2 + SLURM_PROCID))" in agent_command("127.0.0.1:1", "/t", "python3", loopback=True)


@pytest.fixture(scope="module")
def kernel(slurm_cluster):  # noqa: F811
    k = Kernel()
    k.run("%load_ext nbtrain\nscale = 3")
    yield k
    k.shutdown()
    assert_no_workers(15)


def _job(out: str) -> str:
    found = SUBMITTED.search(out)
    assert found, out
    return found.group(1)


def _token() -> str:
    files = glob.glob(os.path.join(token_dir(), "pool-*-*.token"))
    texts = [open(f).read().strip() for f in files]
    assert texts, f"no token file in {token_dir()}"
    return texts[-1]


def _queue_empty(slurm) -> bool:
    return not slurm.jobs()


def test_a_two_node_cell_runs_as_a_slurm_job(slurm_cluster, kernel):  # noqa: F811
    slurm = slurm_cluster
    line = f"{BASE} --slurm\n"
    out = kernel.run(line + "print(f'hi from {rank}')\ntotal = scale * world_size + rank\n", timeout=180)
    job = _job(out)
    assert f"Slurm job {job} is running on {slurm.node}" in out, out
    assert "python -m nbtrain.node --join" not in out  # nobody has to paste the command
    assert "hi from 0" in out and "[node b rank 1] hi from 1" in out, out
    assert "total 6" in kernel.run("print('total', total)")
    assert [f"{job}|RUNNING|None"] == slurm.jobs()
    token = _token()
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])]
    agents = [p for p in psutil.process_iter(["cmdline", "environ"]) if "nbtrain.node" in (p.info["cmdline"] or [])
              and (p.info["environ"] or {}).get("SLURM_JOB_ID") == job]  # this job's, not other tests' agents
    assert len(agents) == 2 and not [p.pid for p in agents if token in str(p.info["environ"])], agents
    script = slurm.run("scontrol", "write", "batch_script", job, "-")
    assert "--token-file" in script and token not in script, script
    listing = kernel.run("%distributed_nodes")
    assert "(127.0.0.2)" in listing and "(127.0.0.3)" in listing and f"Slurm job {job} (node agents): RUNNING" in listing
    again = kernel.run(line + "again = world_size\n", timeout=60)
    assert "(warm)" in again and "submitted" not in again, again
    kernel.run("%distributed_shutdown")
    until(lambda: _queue_empty(slurm), 20, "the job to leave the queue")


def test_a_held_job_is_shown_pending_and_the_stop_button_leaves_it_queued(slurm_cluster, kernel):  # noqa: F811
    slurm = slurm_cluster
    msg_id = kernel.start(f'{BASE} --slurm "--hold"\nx = 1\n')
    _, out = kernel.collect(msg_id, 60, until=lambda text: "PENDING (JobHeldUser)" in text, poll=0.2)
    job = _job(out)
    assert f"Slurm job {job} is PENDING (JobHeldUser); the cell waits for it" in out, out
    kernel.km.interrupt_kernel()
    reply, out = kernel.collect(msg_id, 30)
    assert reply["status"] == "error" and f"Slurm job {job} stays" in out, out
    assert slurm.jobs() == [f"{job}|PENDING|JobHeldUser"]  # the stop button ended the wait, not the job
    listing = kernel.run("%distributed_nodes")
    assert f"Slurm job {job} (node agents): PENDING (JobHeldUser)" in listing, listing
    msg_id = kernel.start(f"{BASE} --slurm=--hold\ny = world_size\n")
    _, out = kernel.collect(msg_id, 60, until=lambda text: "JobHeldUser" in text, poll=0.2)
    assert "submitted" not in out, out  # the queued job serves this cell
    slurm.run("scontrol", "release", job)
    reply, out = kernel.collect(msg_id, 180)
    assert reply["status"] == "ok" and f"Slurm job {job} is running on {slurm.node}" in out, out
    kernel.run("%distributed_shutdown")
    until(lambda: _queue_empty(slurm), 20, "the job to leave the queue")


def test_after_the_time_limit_a_restart_resumes_on_a_new_job(slurm_cluster, kernel, tmp_path):  # noqa: F811
    slurm = slurm_cluster
    line = (f"%%distributed --nodes 1:2 --last-call 30 --rdzv-host 127.0.0.1 --cpu --start-timeout 120 --slurm "
            f"--checkpoint {tmp_path / 'ckpt'} --max-restarts 1 --out steps,restart_count\n")
    msg_id = kernel.start(line + held_node_cell(tmp_path / "held-once"))
    _, out = kernel.collect(msg_id, 180, until=lambda text: "held" in text, poll=0.2)
    first = _job(out)
    slurm.run("scontrol", "update", f"JobId={first}", "TimeLimit=1", "EndTime=now")  # checked every 30 s
    reply, out = kernel.collect(msg_id, 240)
    assert reply["status"] == "ok", out
    lost = re.findall(rf"node ([ab]) \(rank [01]\) lost: Slurm job {first} ended: TIMEOUT \(TimeLimit\)", out)
    assert sorted(lost) == ["a", "b"] and "(restart 1 of 1)" in out, out  # a lost node in Slurm's words
    second = _job(out)
    assert second != first, out  # the restart submitted a new job for the lost nodes
    assert "steps 6 restart 1" in kernel.run("print('steps', steps, 'restart', restart_count)")
    kernel.run("%distributed_shutdown")
    until(lambda: _queue_empty(slurm), 20, "the job to leave the queue")


def test_a_job_cancelled_by_someone_is_a_lost_node_in_slurm_s_words(slurm_cluster, kernel):  # noqa: F811
    msg_id = kernel.start(f"{BASE} --slurm\nimport time\nprint('going', flush=True)\ntime.sleep(300)\n")
    _, out = kernel.collect(msg_id, 180, until=lambda text: "going" in text, poll=0.2)
    job = _job(out)
    slurm_cluster.run("scancel", job)  # an administrator, or the user from a shell
    reply, out = kernel.collect(msg_id, 60)
    assert reply["status"] == "error", out
    assert re.search(rf"node [ab] \(rank [01]\) lost: Slurm job {job} ended: CANCELLED", out), out
    kernel.run("%distributed_shutdown")
    until(lambda: _queue_empty(slurm_cluster), 20, "the job to leave the queue")


def test_sbatch_refusing_the_arguments_is_said_before_anything_starts(slurm_cluster, kernel):  # noqa: F811
    reply, out = kernel.execute(f'{BASE} --slurm "--partition=nowhere"\nx = 1\n', timeout=60)
    assert reply["status"] == "error", out
    assert "sbatch refused the node agents' job (--slurm --partition=nowhere)" in out, out
    assert "invalid partition specified: nowhere" in out, out  # Slurm's own words
    assert "Traceback" not in out and "submitted" not in out, out
    assert not slurm_cluster.jobs()
    kernel.run("%distributed_shutdown")


def test_a_job_whose_agents_cannot_start_fails_the_cell_with_its_output(slurm_cluster, kernel):  # noqa: F811
    python = f"env PYTHONPATH= {sys.executable} -I -S"  # a Python without nbtrain
    reply, out = kernel.execute(f"{BASE} --slurm --remote-python '{python}'\nx = 1\n", timeout=90)
    job = _job(out)
    assert reply["status"] == "error", out
    assert f"Slurm job {job} ended: FAILED (NonZeroExitCode)" in out, out
    assert "No module named 'nbtrain'" in out and "install nbtrain there" in out, out
    kernel.run("%distributed_shutdown")
    until(lambda: _queue_empty(slurm_cluster), 20, "the job to leave the queue")


def test_the_kernel_s_exit_cancels_a_waiting_job(slurm_cluster):  # noqa: F811
    k = Kernel()
    try:
        out = k.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --nodes 2 --slurm=--hold")
        job = _job(out)
        assert f"Slurm job {job} (node agents): PENDING (JobHeldUser)" in out, out
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=False)  # as JupyterLab's shutdown: the kernel exits by itself
    until(lambda: _queue_empty(slurm_cluster), 20, "the waiting job to be cancelled")


def test_inside_an_allocation_the_agents_run_as_a_step_of_it(slurm_cluster, monkeypatch):  # noqa: F811
    granted = slurm_cluster.run("salloc", "--no-shell", "--nodes=1", "--ntasks=2", check=False)
    found = re.search(r"Granted job allocation (\d+)", granted)
    assert found, granted
    allocation = found.group(1)
    monkeypatch.setenv("SLURM_JOB_ID", allocation)  # as in a notebook started in salloc or by Open OnDemand
    k = Kernel()
    try:
        k.run("%load_ext nbtrain")
        reply, out = k.execute(f'{BASE} --slurm "--bogus"\nx = 1\n', timeout=60)
        assert reply["status"] == "error" and f"srun step in job {allocation} ended at once" in out, out
        assert "unrecognized option '--bogus'" in out, out  # srun's own words
        out = k.run(f"{BASE} --slurm\nw = world_size\nprint('ranks', w)\n", timeout=180)
        assert f"as a step of this notebook's Slurm job {allocation} (srun)" in out and "ranks 2" in out, out
        assert "submitted" not in out and len(slurm_cluster.jobs()) == 1, out  # no job of its own
        steps = slurm_cluster.run("squeue", "-h", "-s", "-j", allocation, "-o", "%i %j")
        assert "nbtrain-nodes" in steps, steps
        k.run("%distributed_shutdown")
        until(lambda: "nbtrain-nodes" not in slurm_cluster.run("squeue", "-h", "-s", "-j", allocation, "-o", "%j"),
              20, "the step to end")
        assert slurm_cluster.jobs() == [f"{allocation}|RUNNING|None"]  # the allocation is the user's: it stays
    finally:
        k.shutdown()
        slurm_cluster.run("scancel", allocation, check=False)
        until(lambda: _queue_empty(slurm_cluster), 20, "the allocation to end")


_PREPARED = """
import time
import torch, nbtrain
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data, batch_size=4))
"""
_LONG_TRAINING = _PREPARED + """for epoch in nbtrain.epochs(1000):
    for x, y in loader:
        nbtrain.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step(); opt.zero_grad()
        time.sleep(0.2)
    print('epoch', epoch, flush=True)
steps = nbtrain.training_state().step
"""


def test_the_time_limit_s_warning_saves_a_checkpoint_and_the_cell_says_how_to_resume(slurm_cluster, kernel, tmp_path):  # noqa: F811
    slurm = slurm_cluster
    checkpoint = tmp_path / "ckpt"
    line = (f'{BASE} --slurm "--time=2 --signal=B:USR1@40" --checkpoint {checkpoint} --keep-alive 0 '
            f'--preemption-grace 20\n')
    reply, out = kernel.execute(line + _LONG_TRAINING, timeout=150)  # the warning comes 40 to 70 s before the end
    job = _job(out)
    assert reply["status"] == "error", out
    notice = re.search(r"nbtrain: node [ab]: SIGTERM at [\d:]+ .*; checkpoint at step (\d+) saved in", out)
    assert notice, out  # Slurm's warning became a notice: the ranks saved at their next step
    assert f"run the cell again to resume from {checkpoint / 'checkpoint.pt'}" in out, out
    assert "TIMEOUT" not in out and "connection broke" not in out, out  # not killed at the limit
    assert (checkpoint / "checkpoint.pt").exists()
    state = slurm.run("scontrol", "show", "job", "-o", job)
    # the agents left: the job ends before its limit (COMPLETING while Slurm tidies its steps, then COMPLETED)
    assert "JobState=COMPLETED" in state or "JobState=COMPLETING" in state or not slurm.jobs(), state
    again = kernel.run(f"{BASE} --slurm --checkpoint {checkpoint} --keep-alive 0\n" + _PREPARED
                       + "resumed = nbtrain.training_state().step\n", timeout=150)  # running the cell again
    assert _job(again) != job and f"nbtrain: resuming from {checkpoint / 'checkpoint.pt'}" in again, again
    assert f"resumed {notice.group(1)}" in kernel.run("print('resumed', resumed)")


def test_a_released_job_s_agents_are_not_given_to_the_next_cell(slurm_cluster, kernel):  # noqa: F811
    slurm = slurm_cluster
    until(lambda: "no node" in kernel.run("%distributed_nodes"), 60, "an earlier job's agents to leave")
    out = kernel.run(f"{BASE} --slurm --keep-alive 0\nx = world_size\n", timeout=180)
    job = _job(out)
    assert f"nbtrain: Slurm job {job} released (scancel)" in out, out
    # at once, while Slurm is still ending the job: its agents are no longer offered to a cell
    listing = kernel.run("%distributed_nodes")
    assert "nbtrain: no node is joined now." in listing, listing
    until(lambda: _queue_empty(slurm), 20, "the released job to leave the queue")


def test_the_job_is_released_after_keep_alive_whether_the_cell_finished_or_was_stopped(slurm_cluster, kernel):  # noqa: F811
    slurm = slurm_cluster
    # a released job's agents leave as Slurm ends it: a cell started before they are gone would be given them
    until(lambda: "no node" in kernel.run("%distributed_nodes"), 60, "an earlier job's agents to leave")
    out = kernel.run(f"{BASE} --slurm --keep-alive 8\nx = world_size\n", timeout=180)
    job = _job(out)
    assert f"nbtrain: Slurm job {job} kept for 8 s (--keep-alive), then released" in out, out
    assert slurm.jobs() == [f"{job}|RUNNING|None"]  # warm for the next cell meanwhile
    until(lambda: _queue_empty(slurm), 40, "the idle job to be released")
    listing = kernel.run("%distributed_nodes")
    assert f"Slurm job {job}" not in listing, listing
    msg_id = kernel.start(f"{BASE} --slurm --keep-alive 0\nimport time\nprint('going', flush=True)\ntime.sleep(300)\n")
    _, out = kernel.collect(msg_id, 180, until=lambda text: "going" in text, poll=0.2)
    second = _job(out)
    assert second != job, out  # the released job was not reused
    kernel.km.interrupt_kernel()  # the stop button
    reply, out = kernel.collect(msg_id, 60)
    assert reply["status"] == "error" and f"nbtrain: Slurm job {second} released (scancel)" in out, out
    until(lambda: _queue_empty(slurm), 20, "the stopped cell's job to be released")
    kernel.run("%distributed_shutdown")
