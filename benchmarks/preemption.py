"""A spot reclaim on emulated nodes: notice → checkpoint → re-formed group → first step, and the steps lost.

    python benchmarks/preemption.py [--rounds 3] [--width 1024]

Three node agents (127.0.0.2–4, loopback, 1 rank each, gloo, one intra-op thread per rank), joined once, and a
cell ``--nodes 2:3 --max-restarts 1 --checkpoint DIR`` training an MLP (``--width``, 4 layers, SGD with
momentum: a checkpoint of a few tens of MB). Each round starts the missing agents, runs the cell on a fresh
pool, and once rank 0 has logged step ``--notice-step`` sends SIGTERM to the last node's agent — a cloud's
reclaim, Slurm's or Kubernetes' SIGTERM. Measured, from the cell's own lines (rank 0 prints each step's time):

* **notice → checkpoint written**: from the SIGTERM to the cell's "checkpoint at step N saved" line, beside
  the step time and the write time the rank reports (goal: one step plus the write);
* **re-form → first step**: from that line (the node leaves) to rank 0's first step of the re-formed group,
  against the same cell's cold start on a fresh pool, from the call to its first step (goal ≤ 1.5×);
* **steps lost**: steps the first group took after the checkpoint (the re-formed group takes them again; goal 0).

Nothing is paid while nothing happens: before a notice no rank asks anything at a step boundary (the step is
agreed over the ranks' channels once a notice has come, never read from the store).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch  # noqa: F401  (a notebook that trains has torch imported already)

from nbtrain.kernel.cluster import Cluster
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.request.config import LaunchRequest

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")

CELL = """
import os, time
import torch, nbtrain
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(64 * {steps}, {width}), torch.randn(64 * {steps}, {width}))
net = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range(4)])
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9),
                                     DataLoader(data, batch_size=32))
with open(os.path.join({marks!r}, f"rank{{rank}}"), "w") as mark:
    mark.write(str(os.getppid()))  # this rank's node agent
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
    nbtrain.log(loss=loss)
    if rank == 0:
        print("@step", nbtrain.training_state().step, time.time(), os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
nbtrain.save_checkpoint()
"""


class Lines:
    """The cell's lines with the time each arrived; rank 0's step marks by attempt."""

    def __init__(self) -> None:
        self.saved_at: float | None = None
        self.restarting_at = 0.0  # the old group is stopped: the restart begins
        self.saved = ""
        self.steps: dict[int, list[tuple[int, float]]] = {0: [], 1: []}
        self.step_reached = threading.Event()
        self.notice_step = 0

    def __call__(self, stream: str, text: str) -> None:
        now = time.time()
        for line in text.splitlines():
            mark = re.search(r"@step (\d+) ([\d.]+) (\d+)", line)
            if mark:
                step, attempt = int(mark.group(1)), int(mark.group(3))
                self.steps.setdefault(attempt, []).append((step, float(mark.group(2))))
                if attempt == 0 and step >= self.notice_step:
                    self.step_reached.set()
            elif "saved in" in line and self.saved_at is None:
                self.saved_at, self.saved = now, line
            elif "restarting the ranks" in line:
                self.restarting_at = now


def one_round(manager: PoolManager, hub, agents: dict, args, workdir: str) -> dict:
    marks = tempfile.mkdtemp(dir=workdir)
    lines = Lines()
    lines.notice_step = args.notice_step
    cell = CELL.format(steps=args.steps, width=args.width, marks=marks)
    request = LaunchRequest(nodes="2:3", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, last_call=0.5,
                            start_timeout=120, checkpoint=os.path.join(marks, "ckpt"), max_restarts=1, fresh=True,
                            env=("OMP_NUM_THREADS=1",))
    sent: dict[str, float] = {}

    def reclaim() -> None:
        if lines.step_reached.wait(300):
            with open(os.path.join(marks, "rank2")) as fh:
                agent = int(fh.read())
            sent["at"] = time.time()
            os.kill(agent, signal.SIGTERM)

    threading.Thread(target=reclaim, daemon=True).start()
    started = time.time()
    with contextlib.redirect_stdout(io.StringIO()):  # the pool's own lines (the group forms, …): not the report's
        run_source(cell, request, {}, manager=manager, write=lines)
    first, second = lines.steps[0], lines.steps[1]
    saved = re.search(r"checkpoint at step (\d+) saved in ([\d.]+) s", lines.saved)
    assert saved is not None, "no checkpoint was saved after the notice"
    saved_step, write_s = int(saved.group(1)), float(saved.group(2))
    step_s = statistics.median(b[1] - a[1] for a, b in zip(first[1:-1], first[2:], strict=True))
    assert lines.saved_at is not None
    return {"cold": first[0][1] - started, "notice_to_saved": lines.saved_at - sent["at"], "write": write_s,
            "step": step_s, "reform": second[0][1] - lines.saved_at, "stop": lines.restarting_at - lines.saved_at,
            "lost": max(s for s, _ in first) - saved_step, "notice_step": args.notice_step, "saved_step": saved_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--notice-step", type=int, default=40)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    cluster = Cluster()
    hub = cluster.hub("127.0.0.1")
    manager = PoolManager(cluster.make_pool)
    agents: dict[str, subprocess.Popen] = {}
    results = []
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for _ in range(args.rounds):
                for address in ADDRESSES:  # the reclaimed one's replacement (and, first, all three)
                    if address not in agents or agents[address].poll() is not None:
                        agents[address] = subprocess.Popen([sys.executable, *hub.join_command().split()[1:],
                                                            "--address", address], stdout=subprocess.DEVNULL)
                while len(hub.idle_nodes()) < len(ADDRESSES):
                    time.sleep(0.1)
                results.append(one_round(manager, hub, agents, args, workdir))
                manager.shutdown()
                for address, agent in list(agents.items()):  # the reclaimed agent has left: start it again
                    if agent.poll() is not None:
                        del agents[address]
    finally:
        manager.shutdown()
        cluster.close()
        for agent in agents.values():
            agent.wait(10)
    _report(results, args)


def _report(results: list[dict], args) -> None:
    med = lambda key: statistics.median(r[key] for r in results)  # noqa: E731
    mb = 4 * 4 * args.width * (args.width + 1) * 2 / 2**20  # parameters + momentum, float32
    print(f"3 emulated nodes x 1 rank -> 2 after a SIGTERM to one agent at step {args.notice_step} "
          f"(median of {len(results)}; MLP 4 x {args.width}, ~{mb:.0f} MB of state):\n"
          f"  notice -> checkpoint written {med('notice_to_saved'):.2f} s  (a step {med('step'):.3f} s, the write "
          f"{med('write'):.2f} s; goal <= one step + the write + the notice's way)\n"
          f"  checkpoint at step            {', '.join(str(r['saved_step']) for r in results)} "
          f"(notice sent after step {args.notice_step})\n"
          f"  re-form -> first step         {med('reform'):.2f} s  cold start -> first step {med('cold'):.2f} s  "
          f"ratio {med('reform') / med('cold'):.2f}x (goal <= 1.5x); of it, stopping the old group {med('stop'):.2f} s\n"
          f"  steps lost per reclaim        {max(r['lost'] for r in results)} (goal 0)")


if __name__ == "__main__":
    main()
