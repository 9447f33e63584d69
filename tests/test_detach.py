"""``%%distributed --detach`` and ``%distributed_attach`` in real kernels (jupyter_client; 2 CPU ranks on gloo):
the run outlives a SIGKILLed or restarted kernel, any kernel of the user's attaches and sees the whole run (no gap,
no duplicate) and its names, a failure is reported on attach as the cell would have, the stop button of an
attached kernel stops the run, another Unix user can neither read nor stop it, and nothing is left behind."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import time

import pytest
from helpers.attacker import needs_root, python_as_attacker
from helpers.detachhelp import kernels, runs  # noqa: F401  (the fixtures)
from helpers.detachhelp import assert_nothing_left, start_detached, wait_for_step
from helpers.kernelhelp import Kernel
from helpers.nodehelp import Nodes, until
from helpers.restart_cells import gated_killed_rank_cell
from helpers.workers import nbtrain_workers

from nbtrain.kernel.cluster.tokens import token_dir
from nbtrain.wire import nodes as N
from nbtrain.wire import runfolder
from nbtrain.wire.runfolder import RecordedState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TRAINING = """%%distributed 2 --cpu --detach --no-dashboard
import time, torch, nbtrain
w = torch.zeros(3)
for step in range(STEPS):
    w += step
    nbtrain.log(seen=step)
    if rank == 0 and step % 25 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.05)
total = float(w.sum())
nbtrain.log(checksum=total)
"""
FAILING = """%%distributed 2 --cpu --detach --no-dashboard
import time, nbtrain
for step in range(40):
    nbtrain.log(seen=step)
    if rank == 1 and step == 30:
        raise ValueError("the data ran dry")
    time.sleep(0.05)
"""


def test_a_detached_run_outlives_a_killed_kernel_and_another_kernel_attaches_to_all_of_it(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, seconds = start_detached(first, TRAINING)
    assert seconds < 1.0  # the cell returned while the ranks start and train
    at_kill = wait_for_step(run_id, 20)
    tokens = token_dir()  # the agent got its token on stdin: no token of the run is on disk for the kill to leave
    assert not [name for name in (os.listdir(tokens) if os.path.isdir(tokens) else []) if f"-{first.pid()}-" in name]
    os.kill(first.pid(), signal.SIGKILL)
    later = wait_for_step(run_id, at_kill.step + 10)  # the ranks keep stepping with no kernel
    assert later.state is RecordedState.RUNNING

    second = kernels()
    out = second.run("%distributed_attach", timeout=120)
    assert f"attached to detached run {run_id} (running" in out
    assert "step 0" in out and "step 75" in out  # the output from the start, then live
    assert "back in the notebook:" in out and "total" in out
    check = json.loads(second.run("import json; print(json.dumps([total, history['checksum'].last, "
                                  "history.series('seen', 0).steps, list(history.series('seen', 0))]))"))
    total, logged, steps, seen = check
    assert total == logged == 3 * sum(range(100))  # the model the ranks held
    assert seen == list(range(100)) and steps == sorted(set(steps))  # from step 0, no gap, no duplicate

    again = second.run("del total\n%distributed_attach " + run_id)  # after its end: the same result
    assert "back in the notebook:" in again
    seconds = float(re.search(r"· ([0-9.]+) s · back in the notebook", again).group(1))
    final = runfolder.read_manifest(run_id)
    assert abs(seconds - (final.ended - final.started)) < 2.0  # the run's own time, not the replay's
    assert second.run("print(total)").strip() == str(float(3 * sum(range(100))))
    final = runfolder.read_manifest(run_id)
    assert final is not None and final.state is RecordedState.FINISHED
    assert_nothing_left(final)


def test_a_restarted_kernel_and_a_second_kernel_both_follow_the_run_and_get_its_names(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=80)
    wait_for_step(run_id, 10)
    first.km.restart_kernel(now=False)  # a clean restart: the kernel's exit must not stop the run
    first.kc.wait_for_ready(timeout=60)
    assert runfolder.read_manifest(run_id).state is RecordedState.RUNNING
    first.run("%load_ext nbtrain")
    second = kernels()
    out = second.run("%distributed_attach --background")
    assert "<nbtrain detached run" in out
    first.run(f"%distributed_attach {run_id}", timeout=120)
    assert first.run("print(total)").strip() == str(float(3 * sum(range(80))))
    second.run("import nbtrain; nbtrain.last_run.wait(60)")
    assert second.run("print(total)").strip() == str(float(3 * sum(range(80))))
    assert_nothing_left(runfolder.read_manifest(run_id))


def test_a_detached_runs_failure_is_reported_on_attach_as_the_cell_would_have(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, FAILING)
    wait_for_step(run_id, 5)
    os.kill(first.pid(), signal.SIGKILL)
    second = kernels()
    reply, out = second.execute("%distributed_attach", timeout=120)
    assert reply["status"] == "error"
    assert "ValueError: the data ran dry" in out
    assert "Cell line 6, in <module>" in out and 'raise ValueError("the data ran dry")' in out  # mapped to the cell's own lines
    final = runfolder.read_manifest(run_id)
    assert final.state is RecordedState.FAILED
    assert_nothing_left(final)


def _restarting_cell(tmp_path) -> tuple[str, os.PathLike]:
    """A detached cell whose rank 1 dies once in epoch 1, when the test creates the returned file."""
    go = tmp_path / "go"
    head = (f"%%distributed 2 --cpu --detach --no-dashboard --checkpoint {tmp_path / 'ckpt'} --max-restarts 1 "
            "--out steps,restart_count,world")
    return head + gated_killed_rank_cell(tmp_path / "killed-once", go), go


def _until_exists(path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _until_final(run_id: str, timeout: float = 120) -> runfolder.RunSummary:
    deadline = time.monotonic() + timeout
    while (summary := runfolder.read_manifest(run_id)).state is RecordedState.RUNNING:
        assert time.monotonic() < deadline, f"run {run_id} did not end"
        time.sleep(0.1)
    return summary


def test_max_restarts_restart_a_detached_run_in_its_agent_with_no_kernel(runs, kernels, tmp_path):  # noqa: F811
    first = kernels()
    cell, go = _restarting_cell(tmp_path)
    run_id, _ = start_detached(first, cell)
    _until_exists(tmp_path / "killed-once")  # rank 1 is in epoch 1, waiting to die
    os.kill(first.pid(), signal.SIGKILL)
    second = kernels()  # the run's checkpoint folder is still the run's: its agent holds the lock
    reply, out = second.execute(f"%%distributed 2 --cpu --no-dashboard --checkpoint {tmp_path / 'ckpt'}\npass")
    assert reply["status"] == "error" and f"--checkpoint {tmp_path / 'ckpt'} is in use by" in out, out
    go.touch()
    final = _until_final(run_id)
    assert final.state is RecordedState.FINISHED  # restarted by its agent, with no kernel anywhere
    decisions = [e for e in runfolder.read_events(run_id)[0] if e["kind"] == "restart"]
    assert [(e["attempt"], e["reason"]) for e in decisions] == [(1, "")]

    out = second.run(f"%distributed_attach {run_id}", timeout=120)  # the whole run, as the cell would have shown it
    assert "rank 1 was killed by SIGKILL" in out
    assert f"restarting the ranks from {tmp_path / 'ckpt' / 'checkpoint.pt'} (epoch 1, step 2) (restart 1 of 1)" in out
    assert "finished after 1 restart from the checkpoint" in out
    check = json.loads(second.run("import json; print(json.dumps([steps, restart_count, world, "
                                  "history.series('loss', 0).steps, history.series('loss', 1).steps]))"))
    assert check == [6, 1, 2, list(range(6)), list(range(6))]  # 3 epochs × 2 steps, no gap, no duplicate
    assert_nothing_left(final)
    with open(tmp_path / "ckpt" / ".nbtrain-lock") as lock:  # the folder is free again once the run ended
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_detached_run_restarted_while_its_kernel_watches_brings_its_names_back(runs, kernels, tmp_path):  # noqa: F811
    first = kernels()
    cell, go = _restarting_cell(tmp_path)
    run_id, _ = start_detached(first, cell)
    go.touch()
    out = first.run("import nbtrain; nbtrain.last_run.wait(150); print(nbtrain.last_run.state)", timeout=180)
    assert out.strip().endswith("finished"), out
    assert first.run("print(steps, restart_count, world)").strip() == "6 1 2"
    assert [e["attempt"] for e in runfolder.read_events(run_id)[0] if e["kind"] == "restart"] == [1]
    assert_nothing_left(_until_final(run_id))


SHARDED = """%%distributed 2 --cpu --detach --shard --no-dashboard
import torch, nbtrain
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))
for step in range(30):
    loss = model(torch.ones(4, 8)).pow(2).mean()
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
    nbtrain.log(loss=loss)
"""


def test_a_sharded_detached_run_brings_its_model_back_whole_on_attach(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, SHARDED)
    wait_for_step(run_id, 3)
    os.kill(first.pid(), signal.SIGKILL)  # while it trains: the run is the agent's
    final = _until_final(run_id)
    assert final.state is RecordedState.FINISHED
    second = kernels()
    out = second.run(f"%distributed_attach {run_id}", timeout=120)
    assert "back in the notebook:" in out and "model" in out
    check = second.run("import torch; print(type(model).__name__, sum(p.numel() for p in model.parameters()), "
                       "len(history.series('loss', 0).steps))")
    assert check.split() == ["Sequential", "161", "30"], check  # the plain module, whole: 8*16+16+16+1
    assert_nothing_left(final)
    written = runs / run_id / "results.safetensors"  # its tensors, readable without nbtrain or a pickle
    assert oct(written.stat().st_mode & 0o777) == "0o600"
    from safetensors.torch import load_file

    tensors = load_file(written)
    assert sorted(tensors) == ["loss", "model.0.bias", "model.0.weight", "model.2.bias", "model.2.weight",
                               "net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"], sorted(tensors)
    same = second.run("import json; from safetensors.torch import load_file; f = load_file(" + repr(str(written)) +
                      "); print(all(torch.equal(f['model.' + k], v) for k, v in model.state_dict().items()))")
    assert same.strip() == "True", same


def test_the_stop_button_of_an_attached_kernel_stops_the_detached_run(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=2000)
    wait_for_step(run_id, 5)
    os.kill(first.pid(), signal.SIGKILL)
    second = kernels()
    second.run("%distributed_attach --background")
    wait_for_step(run_id, 15)
    began = time.monotonic()
    second.run("import nbtrain; nbtrain.last_run.stop(); print(nbtrain.last_run.state)")
    deadline = time.monotonic() + 10
    while runfolder.read_manifest(run_id).state is RecordedState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runfolder.read_manifest(run_id).state is RecordedState.STOPPED
    assert time.monotonic() - began < 10
    assert_nothing_left(runfolder.read_manifest(run_id))


def test_two_kernels_follow_one_run_and_only_the_one_in_control_stops_it_unless_forced(runs, kernels):  # noqa: F811
    first = kernels()  # started the run: its stop button stops it
    run_id, _ = start_detached(first, TRAINING, steps=2000)
    wait_for_step(run_id, 5)
    second = kernels()
    out = second.run("%distributed_attach --background")
    assert "controls this run: this kernel follows it" in out and "--force takes control" in out
    stopped = second.run("import nbtrain; nbtrain.last_run.stop(); nbtrain.last_run.wait(10); "
                         "print(nbtrain.last_run.state)")
    assert stopped.strip().endswith("interrupted"), stopped  # this kernel's following, not the run
    at_stop = runfolder.read_manifest(run_id)
    wait_for_step(run_id, at_stop.step + 10)  # following ended there; the run goes on
    assert runfolder.read_manifest(run_id).state is RecordedState.RUNNING

    forced = second.run(f"%distributed_attach {run_id} --force --background")
    assert "controls this run" not in forced
    second.run("nbtrain.last_run.stop()")
    final = _until_final(run_id, timeout=15)
    assert final.state is RecordedState.STOPPED
    assert_nothing_left(final)


@needs_root
def test_another_user_can_neither_read_nor_stop_a_detached_run(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=400)
    summary = wait_for_step(run_id, 3)
    os.chmod(runs.parent, 0o755)  # the attacker may reach the runs directory itself: it is the folder that says no
    attack = python_as_attacker(
        "import os, signal, sys\n"
        "tried = []\n"
        "for what, act in [('list', lambda: os.listdir(sys.argv[1])),\n"
        "                  ('read', lambda: open(os.path.join(sys.argv[1], sys.argv[2], 'events.jsonl')).read()),\n"
        "                  ('stop', lambda: os.kill(int(sys.argv[3]), signal.SIGINT))]:\n"
        "    try:\n"
        "        act(); tried.append(what + ': done')\n"
        "    except PermissionError:\n"
        "        tried.append(what + ': refused')\n"
        "print(', '.join(tried))\n", str(runs), run_id, str(summary.agent_pid))
    assert attack.stdout.strip() == "list: refused, read: refused, stop: refused", attack.stderr
    assert runfolder.read_manifest(run_id).state is RecordedState.RUNNING
    first.run("import nbtrain; nbtrain.last_run.stop()")
    deadline = time.monotonic() + 10
    while runfolder.read_manifest(run_id).state is RecordedState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_nothing_left(runfolder.read_manifest(run_id))
    assert nbtrain_workers() == []


def test_a_new_kernel_is_told_of_a_running_detached_run_and_can_shut_it_down(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=2000)
    wait_for_step(run_id, 5)
    os.kill(first.pid(), signal.SIGKILL)
    second = Kernel()
    try:
        loaded = second.run("%load_ext nbtrain")
        assert f"detached run {run_id} is running" in loaded and "%distributed_attach" in loaded
        listed = second.run("%distributed_attach --list")
        assert run_id in listed and "running" in listed
        said = second.run("%distributed_shutdown --detached")
        assert f"detached run {run_id} was stopped" in said
        assert runfolder.read_manifest(run_id).state is RecordedState.STOPPED
        assert_nothing_left(runfolder.read_manifest(run_id))
    finally:
        second.shutdown()


def test_a_run_whose_folder_is_removed_goes_on_and_its_names_still_arrive_in_its_kernel(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=60)
    summary = wait_for_step(run_id, 5)
    shutil.rmtree(runs / run_id)  # the user's own clean-up, mid-run
    first.run("import nbtrain; nbtrain.last_run.wait(90); print(nbtrain.last_run.state)")
    assert first.run("print(total)").strip() == str(float(3 * sum(range(60))))
    assert_nothing_left(summary)


class _Quiet:
    """A dashboard front end that draws nothing: the test reads the dashboard's model."""

    def show(self) -> None:
        return None

    def tick(self) -> None:
        return None

    def finish(self) -> None:
        return None


def test_a_detached_runs_load_is_sampled_by_its_agent_and_drawn_by_a_kernel_that_attaches_after_its_end(runs, kernels):  # noqa: F811
    from nbtrain.kernel.cluster import Cluster
    from nbtrain.kernel.dashboard.observer import DashboardObserver
    from nbtrain.kernel.dashboard.telemetry_series import DeviceKey
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.lifecycle.pools import PoolManager
    from nbtrain.kernel.request.config import LaunchRequest

    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=60)
    wait_for_step(run_id, 5)
    os.kill(first.pid(), signal.SIGKILL)  # from here the agent samples alone
    final = _until_final(run_id)
    events, _ = runfolder.read_events(run_id)
    pids = next(e["ranks"] for e in events if e["kind"] == "started")
    samples = [e["sample"] for e in events if e["kind"] == "telemetry"]
    assert len(samples) >= (final.ended - final.started) - 3, len(samples)  # about one a second, to the end
    for sample in samples:
        assert [(r["rank"], r["pid"], r["device"]) for r in sample["ranks"]] == [
            (0, pids["0"], "cpu"), (1, pids["1"], "cpu")]
    assert all(r["rss"] > 0 and r["cpu_percent"] is not None for r in samples[-2]["ranks"])
    assert samples[-1]["time"] - samples[0]["time"] > 2.0

    observer = DashboardObserver(lambda model: _Quiet())
    body = TRAINING.replace("STEPS", "60").split("\n", 1)[1]
    namespace: dict = {}
    manager = PoolManager(Cluster().make_pool)  # as the magics hold it: a spec that follows a record reads it
    try:
        run_source(body, LaunchRequest(nprocs=2, cpu=True), namespace, attach=run_id, observers=[observer],
                   manager=manager)
    finally:
        manager.shutdown()
    assert namespace["total"] == float(3 * sum(range(60)))  # the run's names, not a run of its own
    assert observer.sampler is None  # the record's samples, none of this process's own
    assert observer.model.telemetry.version == len(samples)
    timelines = observer.model.telemetry.timelines()
    assert {DeviceKey.rank(0), DeviceKey.rank(1)} <= set(timelines)  # each rank, beside the machine
    (seconds, busy), _memory = timelines[DeviceKey.rank(0)]
    measured = [sample for sample in samples if sample["ranks"][0]["cpu_percent"] is not None]  # the last sample
    # may come as the rank ends, with no CPU reading: the line ends at the last one that has it
    assert seconds[-1] == pytest.approx(measured[-1]["time"] - samples[0]["time"], abs=0.5)
    assert_nothing_left(final)


ASKING = """%%distributed 2 --cpu --detach --no-dashboard
import time, nbtrain
for step in range(40):
    nbtrain.log(seen=step)
    time.sleep(0.05)
try:
    answer = input("Name? ") if rank == 1 else "none"
except EOFError as exc:
    answer = f"EOF ({exc})"
print(f"rank {rank} answer {answer}", flush=True)
"""


def test_a_prompt_of_a_detached_run_is_said_to_a_kernel_that_attaches_and_its_output_goes_on(runs, kernels):  # noqa: F811
    first = kernels()
    run_id, _ = start_detached(first, ASKING)
    wait_for_step(run_id, 5)
    os.kill(first.pid(), signal.SIGKILL)  # no kernel to answer: the agent's EOFError
    _until_final(run_id)
    out = kernels().run(f"%distributed_attach {run_id}", timeout=120)
    assert "nbtrain: rank 1 asked for input ('Name?'); this kernel follows the detached run and cannot answer" in out
    assert "rank 1 answer EOF (input() on rank 1: the run is detached: no notebook is attached to answer input())" in out
    assert "back in the notebook:" in out and "answer" in out  # the prompt held nothing back


def test_a_kernel_shut_down_right_after_the_cell_hands_the_cell_to_the_runs_agent_first(runs, kernels):  # noqa: F811
    """Jupyter's kernel manager asks the kernel to shut down, sends SIGTERM half-way through its 5 s wait, then
    SIGKILL: the kernel's exit waits (past the SIGTERM) until the run's agent has the cell, so the run goes on."""
    first = kernels()
    run_id, _ = start_detached(first, TRAINING, steps=40)
    first.kc.stop_channels()
    first.km.shutdown_kernel(now=False)  # as JupyterLab's restart or shutdown does
    summary = runfolder.read_manifest(run_id)
    assert summary is not None and summary.delivered, summary
    final = _until_final(run_id)
    assert final.state is RecordedState.FINISHED
    out = kernels().run(f"%distributed_attach {run_id}", timeout=120)
    assert "back in the notebook:" in out and "total" in out
    assert_nothing_left(final)


def test_a_kernel_that_attaches_writes_the_runs_tensorboard_curve_once_not_twice(runs, kernels, tmp_path):  # noqa: F811
    """The kernel that started the run wrote its --tensorboard series; a kernel that attaches later writes them
    again from the run's record, marked so that TensorBoard draws each rank's curve once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tb"
    first = kernels()
    run_id, _ = start_detached(first, TRAINING.replace("--no-dashboard", f"--no-dashboard --tensorboard {board}"), steps=30)
    wait_for_step(run_id, 0)
    final = _until_final(run_id)
    first.run("print('the run ended in the kernel that started it')")  # its tracker closed its files
    second = kernels()
    assert "back in the notebook:" in second.run(f"%distributed_attach {run_id}", timeout=120)
    for rank in (0, 1):
        assert len(os.listdir(board / f"rank{rank}")) == 2  # each kernel's file
        events = EventAccumulator(str(board / f"rank{rank}"))
        events.Reload()
        assert [event.step for event in events.Scalars("seen")] == list(range(30))  # once, not twice
    assert_nothing_left(final)


def test_a_kernel_killed_before_its_cell_reached_the_agent_leaves_a_stopped_run_that_says_why(runs):  # noqa: F811
    """The kernel's end of the link closes after StartRanks and before the cell (Deliver): as a kernel SIGKILLed
    right after it started the run. The agent stops the idle ranks and ends the run stopped, with the reason in
    the record (which %distributed_attach says), instead of keeping them waiting for a cell that never comes."""
    nodes = Nodes()
    try:
        agent = nodes.start("127.0.0.2")
        nodes.wait_joined(1)
        run_id = runfolder.new_run_id()
        link = nodes.hub.live_nodes()[0].link
        link.send(N.StartRanks(run_id, "", 1, 2, "gloo", "cpu", 60.0, (), os.getpid(), detached_run=run_id))
        until(lambda: runfolder.read_manifest(run_id) and any(e["kind"] == "started"
                                                              for e in runfolder.read_events(run_id)[0]),
              90, "the ranks to start")
        link.close()  # the kernel is gone; no cell was delivered
        final = until(lambda: (s := runfolder.read_manifest(run_id)) and s.state is not RecordedState.RUNNING and s,
                      60, "the run's end")
        assert final.state is RecordedState.STOPPED and "before the cell reached the run's agent" in final.reason
        assert agent.wait(30) == 0
        assert_nothing_left(final)
    finally:
        nodes.close()
