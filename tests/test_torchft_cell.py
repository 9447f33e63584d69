"""``%%distributed N --ft``: a cell whose ranks are torchft replica groups keeps stepping when one is killed.

Real ranks (gloo on the CPU), a real Lighthouse, real torchft Managers: rank 2 of 3 is SIGKILLed in the middle
of the run; the others go on without a pause longer than 2 s, a new rank 2 copies a peer's state and finishes
the cell with them, every group ends with the same parameters, and the cell and ``history`` say what happened.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.attacker import needs_root, python_as_attacker
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.observers.events import RunObserver
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

pytestmark = pytest.mark.timeout(300)

STEPS = 60  # 3 epochs of 20 steps: 240 samples, 3 groups, batches of 4

CELL = """
import os, time, torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(rank)  # different weights at first: --ft makes them equal at step 0, as DDP does
data = TensorDataset(torch.randn(240, 4, generator=torch.Generator().manual_seed(0)),
                     torch.randint(0, 2, (240,), generator=torch.Generator().manual_seed(1)))
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                                     DataLoader(data, batch_size=4, shuffle=True))
for epoch in nbtrain.epochs(3):
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        nbtrain.log(loss=loss)
        with open(os.path.join(MARKS, f"rank{rank}"), "a") as mark:
            mark.write(f"{os.getpid()} {nbtrain.training_state().step} {time.time():.3f}\\n")
        time.sleep(0.1)
torch.save([p.detach() for p in model.module.parameters()], os.path.join(MARKS, f"final{rank}.pt"))
steps = nbtrain.training_state().step
"""


def _marks(folder, rank: int) -> list[tuple[int, int, float]]:
    path = folder / f"rank{rank}"
    if not path.exists():
        return []
    return [(int(pid), int(step), float(when)) for pid, step, when in
            (line.split() for line in path.read_text().splitlines() if line.strip())]


def _kill_at_step(folder, rank: int, step: int) -> dict:
    """SIGKILL ``rank``'s process once it has written ``step`` (in a thread); what was sent is in the dict."""
    sent: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            marks = _marks(folder, rank)
            if marks and marks[-1][1] >= step:
                sent.update(pid=marks[-1][0], step=marks[-1][1], at=time.time())
                os.kill(marks[-1][0], signal.SIGKILL)
                return
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return sent


class _GroupStates(RunObserver):
    """Each state a group was told to be in, in order, as the dashboard hears them."""

    def __init__(self) -> None:
        self.seen: dict[int, list[str]] = {}

    def replica_groups(self, groups) -> None:
        for group in groups:
            states = self.seen.setdefault(group.group, [])
            if not states or states[-1] != group.state:
                states.append(str(group.state))


@pytest.mark.slow
def test_torchft_cell_keeps_stepping_when_a_rank_is_killed_and_its_replacement_copies_a_peer(fresh_pools, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    sent = _kill_at_step(marks, rank=2, step=20)
    output, states = Captured(), _GroupStates()
    ns, result = run_cell(fresh_pools, CELL, {"MARKS": str(marks)}, write=output, nprocs=3, ft="on",
                          out="steps", start_timeout=120, observers=(states,))
    text = output.text()
    assert sent, text
    # nbtrain sets DDP's find_unused_parameters itself: DDP's C++ advice to turn it off stays out of the cell, on
    # the first ranks and on the replacement alike
    assert "find_unused_parameters" not in text, text
    assert re.search(r"nbtrain: --ft: rank 2 was lost \(killed by SIGKILL\) at \d\d:\d\d:\d\d; 2 other replica "
                     r"groups keep stepping, and a new rank 2 starts", text), text
    summary = re.search(r"nbtrain: --ft: 1 replica group lost and replaced; 0 steps redone; (\d+) steps? of (\d+) at "
                        r"fewer than 3 groups", text)
    # the kill lands between two steps, or (on a busy machine) in one, which no group then commits: its batch is
    # dropped, and the run commits one step fewer than the loader's batches
    steps = ns["steps"]
    assert steps in (STEPS - 1, STEPS)
    # 0 steps at fewer groups when the new rank is back within the join timeout
    assert summary and int(summary.group(1)) < 30 and int(summary.group(2)) == steps, text

    for survivor in (0, 1):  # no pause longer than 2 s in their steps, and each step committed once
        taken = [step for _, step, _ in _marks(marks, survivor)]
        times = [when for _, _, when in _marks(marks, survivor)]
        assert taken[0] == 1 and taken == sorted(taken) and len(set(taken)) == steps, taken  # the groups start together
        assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 2.0 + 0.1, times
        assert result.history.series("ft_groups", survivor).steps == list(range(steps))

    replacement = [(pid, step) for pid, step, _ in _marks(marks, 2) if pid != sent["pid"]]
    assert replacement and replacement[0][1] > sent["step"] and replacement[-1][1] == steps, replacement
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(3)]
    for other in finals[1:]:  # one model: the copy and the averaged steps keep the groups equal
        for mine, theirs in zip(finals[0], other, strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6)
    groups = result.history.series("ft_groups", 2)
    assert len(groups.steps) == len(set(groups.steps))  # the new rank 2 goes on from the peer's step
    assert fresh_pools.pool is not None and fresh_pools.pool.alive()  # the pool, its new rank included, stays warm
    # what the dashboard's badges showed: the others in quorum throughout, rank 2 lost, recovering, then back
    assert states.seen == {0: ["in quorum"], 1: ["in quorum"],
                           2: ["in quorum", "out", "recovering from a peer", "rejoined"]}, states.seen


@pytest.mark.slow
def test_torchft_cell_still_fails_on_an_exception(fresh_pools, tmp_path):
    source = "import nbtrain\nif rank == 1:\n    raise ValueError('bad batch')\n"
    with pytest.raises(RankFailedError, match="bad batch"):
        run_cell(fresh_pools, source, nprocs=2, ft="on")


@pytest.mark.parametrize("options, says", [
    ({"nprocs": 1}, "needs 2 ranks or more"),
    ({"session": "s1"}, "use one of --session and --ft"),
    ({"detach": True}, "--ft does not go with --detach yet: a detached run's agent restarts the whole run"),
    ({"shard": "full"}, "use --shard hybrid --ft"),
    ({"shard": "hybrid"}, "give the groups 2 ranks or more"),
    ({"nprocs": 3, "ft": "replicas=2"}, "give a number of ranks that 2 divides"),
    ({"ft": "replicas=1"}, "replicas=R with R of 2 or more"),
    ({"ft": "groups"}, "--ft takes nothing (a replica group per rank), replicas=R with R of 2 or more, keep-batch"),
    ({"ft": "replicas=2,replicas=3"}, "--ft takes nothing"),
])
def test_torchft_cell_refuses_what_it_does_not_go_with_before_anything_starts(options, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    request = LaunchRequest(**{"nprocs": 2, "cpu": True, "ft": "on", **options})
    with pytest.raises(ConfigError, match=re.escape(says)):
        resolve(request)


# The attacker's part, standard library only: find the Lighthouse among the loopback listeners (its status page names
# every group), then end one group through the page's kill route.
_END_A_GROUP = r"""
import re, sys, urllib.request
ports = set()
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    if state == "0A" and local.startswith("0100007F:"):
        ports.add(int(local.split(":")[1], 16))
for port in sorted(ports):
    try:
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=0.5).read().decode()
    except Exception:
        continue
    groups = re.findall(r"\b1:[0-9a-f-]{36}\b", page)
    if groups:
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/replica/{groups[0]}/kill",
                                                          method="POST"), timeout=5).read()
        except Exception as exc:
            print("answered", exc)
        print("ended", groups[0], "at port", port)
        sys.exit(0)
sys.exit("no Lighthouse found")
"""


@needs_root
@pytest.mark.slow
def test_torchft_cell_another_user_who_ends_a_group_through_the_lighthouse_only_costs_a_replacement(fresh_pools,
                                                                                                  tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    attacked: dict = {}

    def attack() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if any(step >= 5 for _, step, _ in _marks(marks, 1)):
                attacked["done"] = python_as_attacker(_END_A_GROUP)
                return
            time.sleep(0.05)

    threading.Thread(target=attack, daemon=True).start()
    output = Captured()
    slower = CELL.replace("time.sleep(0.1)", "time.sleep(0.3)")  # 18 s: time for the attacker to look around
    ns, _ = run_cell(fresh_pools, slower, {"MARKS": str(marks)}, write=output, nprocs=3, ft="on", out="steps",
                     start_timeout=120)
    done = attacked["done"]
    assert done.returncode == 0 and "ended 1:" in done.stdout, (done.stdout, done.stderr)
    text = output.text()
    assert re.search(r"nbtrain: --ft: rank 1 was lost \((exit code|killed by)", text), text  # torchft ends it
    assert "nbtrain: --ft: 1 replica group lost and replaced; 0 steps redone" in text, text
    assert ns["steps"] in (STEPS - 1, STEPS)  # the step it was ended in, if it was in one, is committed by no group


def test_torchft_cell_channel_admits_only_the_replacement_it_started(tmp_path):
    """Under --ft the channel keeps listening: a peer without the key is refused by the challenge, and one with the
    key but not the pid of a replacement the kernel started is dropped; the replacement is admitted as its rank."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from nbtrain.kernel.ranks.channel import Channel
    from nbtrain.wire import protocol as P

    channel = Channel(str(tmp_path))
    channel.listen(2)
    channel.keep_listening()
    channel.accept([os.getpid(), os.getpid() + 1])
    try:
        first = Client(channel.address, family="AF_UNIX", authkey=channel.key)
        first.send(P.Hello(0, os.getpid()))
        with pytest.raises((AuthenticationError, EOFError, ConnectionError)):
            Client(channel.address, family="AF_UNIX", authkey=b"x" * 32)
        stranger = Client(channel.address, family="AF_UNIX", authkey=channel.key)  # the key, but no pid it started
        stranger.send(P.Hello(1, 999_999))
        with pytest.raises(EOFError):
            stranger.recv()
        channel.expect(1, 424_242)  # a replacement the kernel started
        replacement = Client(channel.address, family="AF_UNIX", authkey=channel.key)
        replacement.send(P.Hello(1, 424_242))
        deadline = time.monotonic() + 5
        while not channel.connected():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        channel.send_to(1, P.Shutdown())
        assert isinstance(replacement.recv(), P.Shutdown)
    finally:
        channel.close()


@pytest.mark.slow
def test_torchft_cell_replica_groups_of_two_ranks_lose_one_and_both_come_back(fresh_pools, tmp_path):
    """``--ft replicas=2`` on 4 ranks: groups {0, 1} and {2, 3}. Rank 3 is SIGKILLed: rank 2 is ended with it, the
    other group keeps stepping, and two new ranks copy its state; every rank ends with the same parameters."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sent = _kill_at_step(marks, rank=3, step=15)
    output = Captured()
    ns, result = run_cell(fresh_pools, CELL, {"MARKS": str(marks)}, write=output, nprocs=4, ft="replicas=2",
                          out="steps", start_timeout=120)
    text = output.text()
    steps = ns["steps"]
    assert steps in (44, 45)  # 240 samples over 4 ranks in batches of 4: 15 steps an epoch; one may be dropped
    assert sent, text
    assert re.search(r"nbtrain: --ft: replica group 1 \(ranks 2–3\) was lost \(.+ on rank [23]\) at \d\d:\d\d:\d\d; "
                     r"1 other replica group keeps stepping, and new ranks start in its place", text), text
    assert re.search(rf"nbtrain: --ft: 1 replica group lost and replaced; 0 steps redone; \d+ steps? of {steps} at "
                     r"fewer than 2 groups", text), text
    for survivor in (0, 1):
        taken = [step for _, step, _ in _marks(marks, survivor)]
        assert taken[0] == 1 and taken == sorted(taken) and len(set(taken)) == steps, taken
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(4)]
    for other in finals[1:]:
        for mine, theirs in zip(finals[0], other, strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6)
    assert result.history.series("ft_groups", 0).values[0] == 2.0


@pytest.mark.slow
def test_torchft_cell_keep_batch_accumulates_while_a_group_is_out(fresh_pools, tmp_path):
    """``--ft keep-batch`` on 4 ranks: rank 3 is SIGKILLed; while 3 groups are left each accumulates 2 micro-batches a
    step (6 against the 4 of the global batch: ⌈4/3⌉ each), once all 4 are back 1 again; every committed step
    averaged at least 4, and the groups end equal."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sent = _kill_at_step(marks, rank=3, step=8)
    output = Captured()
    cell = CELL.replace("loss.backward()", "nbtrain.backward(loss)").replace(  # the new rank 3 comes 3 s later
        "model, opt, loader = ", "time.sleep(3 if os.environ.get('NBTRAIN_FT_ATTEMPT', '0') != '0' else 0)\n"
        "model, opt, loader = ")
    ns, result = run_cell(fresh_pools, cell, {"MARKS": str(marks)}, write=output, nprocs=4, ft="keep-batch",
                          out="steps", start_timeout=120)
    assert sent, output.text()
    assert re.search(r"steps? of \d+ at fewer than 4 groups \(accumulating to keep the global batch\)", output.text())
    batches = result.history.series("ft_batches", 0).values
    groups = result.history.series("ft_groups", 0).values
    assert batches == [g * (2 if g == 3 else 1) for g in groups] and min(batches) >= 4, (groups, batches)
    assert 3.0 in groups and groups[-1] == 4.0, groups  # some steps at 3 groups, and all 4 at the end
    # rank 0 read 2 batches a step while rank 3 was out: fewer optimizer steps than its 45 batches
    assert ns["steps"] == len(groups) < 45
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(4)]
    for other in finals[1:]:
        for mine, theirs in zip(finals[0], other, strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6)


@pytest.mark.slow
def test_torchft_cell_with_grad_accum_agrees_once_per_window_of_k_micro_batches(fresh_pools, tmp_path):
    """``--ft --grad-accum 2`` on 3 ranks: a quorum and an all-reduce per window of 2 micro-batches; rank 2 is
    SIGKILLed, the others go on, and all three end equal after 30 optimizer steps (60 micro-batches), or 29 when a
    window was cut by the loss."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sent = _kill_at_step(marks, rank=2, step=6)
    output = Captured()
    cell = CELL.replace("loss.backward()", "nbtrain.backward(loss)")
    ns, result = run_cell(fresh_pools, cell, {"MARKS": str(marks)}, write=output, nprocs=3, ft="on", grad_accum=2,
                          out="steps", start_timeout=120)
    assert sent and re.search(r"nbtrain: --ft: 1 replica group lost and replaced; 0 steps redone", output.text()), \
        output.text()
    assert ns["steps"] in (29, 30) and result.history.series("ft_groups", 0).steps == list(range(ns["steps"]))
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(3)]
    for other in finals[1:]:
        for mine, theirs in zip(finals[0], other, strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6)


def test_torchft_cell_keep_batch_needs_nbtrain_backward(fresh_pools):
    source = """
import torch, nbtrain
net = torch.nn.Linear(4, 2)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
opt.zero_grad()
model(torch.randn(8, 4)).sum().backward()
opt.step()
"""
    with pytest.raises(RankFailedError, match=re.escape("--ft keep-batch accumulates micro-batches while a group is "
                                                        "out, so it needs nbtrain.backward(loss)")):
        run_cell(fresh_pools, source, nprocs=2, ft="keep-batch")


def waiting_for_the_new(cell: str, lost: tuple[int, ...], at: int, indent: str = "        ") -> str:
    """``cell`` (one of this file's) whose other ranks wait at step ``at`` until the new ranks in place of ``lost``
    have started the cell, so they rejoin before the others finish however long a new rank takes to start (a
    spawned one: seconds). One that comes later is stopped (tests/test_torchft_late.py)."""
    wait = (f"{indent}if rank not in {lost!r} and nbtrain.training_state().step == {at}:\n"
            f"{indent}    while any(len(open(os.path.join(MARKS, f'started{{r}}')).read().split()) < 2 for r in {lost!r}):\n"
            f"{indent}        time.sleep(0.05)\n")
    started = "open(os.path.join(MARKS, f'started{rank}'), 'a').write(f'{os.getpid()}\\n')\n"
    cell = cell.replace("torch.manual_seed(rank)", started + "torch.manual_seed(rank)", 1)
    return re.sub(rf"^{indent}time\.sleep\([0-9.]+\)\n", lambda found: found.group(0) + wait, cell, count=1,
                  flags=re.MULTILINE)


# the lost group (ranks 2 and 3) is killed at step 15 of 45; the others wait for its new ranks at step 30
HSDP_CELL = waiting_for_the_new(CELL.replace(
    "torch.save([p.detach() for p in model.module.parameters()]",
    "torch.save([p.to_local().detach().clone() for p in model.parameters()]").replace(
    "        opt.step()", "        nbtrain.log(grad_norm=nbtrain.clip_grad_norm_(model, 1e9))\n        opt.step()"),
    lost=(2, 3), at=30)


@pytest.mark.slow
def test_torchft_cell_hsdp_shards_within_groups_and_a_lost_group_copies_its_peers_slices(fresh_pools, tmp_path):
    """``--shard hybrid --ft replicas=2`` on 4 ranks: FSDP2 over each group's 2 ranks, the gradient slices averaged
    across the groups. Rank 3 is SIGKILLed: its group is replaced, each new rank copies the slices (and optimizer
    state) of its peer of the same group rank, and every rank ends holding the same slices as its peer."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sent = _kill_at_step(marks, rank=3, step=15)
    output = Captured()
    ns, result = run_cell(fresh_pools, HSDP_CELL, {"MARKS": str(marks)}, write=output, nprocs=4, ft="replicas=2",
                          shard="hybrid", out="steps", start_timeout=120)
    text = output.text()
    steps = ns["steps"]
    assert sent and steps in (44, 45), text
    assert "HSDP" in text or "FSDP2" in text, text  # prepare() said how it sharded
    assert re.search(rf"nbtrain: --ft: 1 replica group lost and replaced; 0 steps redone; \d+ steps? of {steps} at "
                     r"fewer than 2 groups", text), text
    for survivor in (0, 1):
        taken = [step for _, step, _ in _marks(marks, survivor)]
        times = [when for _, step, when in _marks(marks, survivor) if step <= 30]  # then it waits for the new group
        assert taken[0] == 1 and taken == sorted(taken) and len(set(taken)) == steps, taken
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        # two groups: the survivor waits until the lost one's heartbeats are 1.5 s silent (torchft's split-brain
        # guard); the goal is a pause of at most one step and 2 s
        assert max(gaps) < 2.0 + statistics.median(gaps), gaps
    # its losses went on through the loss: one per batch it ran (a step the loss interrupted logged its loss too,
    # though the step was not committed: hence marks, not steps)
    assert len(result.history.series("loss", 0).steps) == len(_marks(marks, 0))
    # nbtrain.clip_grad_norm_ sees the gradient averaged across the groups: the same norm in both, step by step
    norms = [result.history.series("grad_norm", rank).values[:10] for rank in (0, 2)]
    assert torch.allclose(torch.tensor(norms[0]), torch.tensor(norms[1]), rtol=1e-5), norms
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(4)]
    for mine, peer in ((0, 2), (1, 3)):  # the same slices in both groups
        for a, b in zip(finals[mine], finals[peer], strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    assert not all(torch.equal(a, b) for a, b in zip(finals[0], finals[1], strict=True))  # and each rank its own


@pytest.mark.slow
def test_torchft_cell_the_benchmark_runs_whole_against_a_restart_from_a_checkpoint():
    """benchmarks/ft_cell.py at a small size: both cells end, and under --ft rank 0 took no step again while the
    restart redid the steps since its checkpoint. Its timings are not judged here (docs/benchmarks.md has them)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "ft_cell.py"), "--rounds", "1", "--steps", "100",
                           "--kill-at", "15"], capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    redone = next(line for line in done.stdout.splitlines() if line.startswith("| steps rank 0 redid"))
    assert redone.split("|")[2].strip() == "0" and int(redone.split("|")[3]) > 0, done.stdout


class _StopOn(Captured):
    """The cell's output, with the stop button pressed (KeyboardInterrupt in the kernel) once ``marker`` shows."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.pressed = marker, 0.0

    def __call__(self, stream: str, text: str) -> None:
        super().__call__(stream, text)
        if self.marker in text and not self.pressed:
            self.pressed = time.monotonic()
            raise KeyboardInterrupt


def _lighthouses() -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if "LighthouseServer" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
def test_torchft_cell_the_stop_button_ends_every_rank_and_the_lighthouse(fresh_pools, tmp_path):
    import psutil

    marks = tmp_path / "marks"
    marks.mkdir()
    cell = CELL.replace("        time.sleep(0.1)", "        time.sleep(0.1)\n        if rank == 0 and nbtrain.training_state().step == 5: print('five', flush=True)")
    output = _StopOn("five")
    with pytest.raises(KeyboardInterrupt):
        run_cell(fresh_pools, cell, {"MARKS": str(marks)}, write=output, nprocs=3, ft="on")
    assert time.monotonic() - output.pressed < 3.5
    pids = {pid for rank in range(3) for pid, _, _ in _marks(marks, rank)}
    assert pids and not [pid for pid in pids if psutil.pid_exists(pid)]
    assert not _lighthouses()


@pytest.mark.slow
@pytest.mark.slow
def test_torchft_cell_a_group_left_out_of_quorums_copies_a_peer_and_reads_as_many_batches(fresh_pools, tmp_path):
    """Rank 0 stalls 3 s after step 10 (a pause of its own, no failure): the others' quorums leave it out after the
    Lighthouse's join timeout and commit steps without it; it then copies a peer's state. Its loader moves on to the
    peer's position too, so it ends with the others — not a batch behind, stepping alone after they finished."""
    stall = ("        if rank == 0 and nbtrain.training_state().step == 10:\n"
             "            time.sleep(3.0)\n")
    cell = CELL.replace("        time.sleep(0.1)\n", "        time.sleep(0.1)\n" + stall, 1)
    marks = tmp_path / "marks"
    marks.mkdir()
    ns, result = run_cell(fresh_pools, cell, {"MARKS": str(marks)}, nprocs=3, ft="on", out="steps")
    assert ns["steps"] == STEPS  # no step failed: the others' steps without rank 0 count, and rank 0 took them over
    taken = [step for _, step, _ in _marks(marks, 0)]
    assert taken[:10] == list(range(1, 11)) and taken[10] > 11, taken  # it went on from the peer's step
    assert taken[-1] == STEPS and len(taken) == len(set(taken)), taken
    assert all(len(_marks(marks, rank)) == STEPS for rank in (1, 2))
    assert 2.0 in result.history.series("ft_groups", 1).values  # the steps taken without rank 0
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(3)]
    for other in finals[1:]:
        for mine, theirs in zip(finals[0], other, strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6)


def test_torchft_cell_runs_again_on_its_warm_ranks(fresh_pools, tmp_path):
    """A second --ft cell takes the same warm ranks, with a Lighthouse and secret of its own; none is left after."""
    source = CELL.replace("nbtrain.epochs(3)", "nbtrain.epochs(1)").replace("time.sleep(0.1)", "pass")
    marks = tmp_path / "marks"
    marks.mkdir()
    first_ns, first = run_cell(fresh_pools, source, {"MARKS": str(marks)}, nprocs=3, ft="on", out="steps")
    again_ns, again = run_cell(fresh_pools, source, {"MARKS": str(marks)}, nprocs=3, ft="on", out="steps")
    assert first_ns["steps"] == again_ns["steps"] == 20
    assert not first.warm and again.warm
    assert not _lighthouses()
