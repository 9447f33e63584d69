"""prepare() + nbtrain.log() in a %%distributed cell vs the same plain-torch DDP loop under bare torchrun.

Both runs train the same MLP (``--width`` inputs, two hidden layers of ``--hidden``, 10 classes) on the same
data with 2 ranks (``--ranks``) on gloo/CPU (or NCCL with --gpu), the same DistributedSampler and batch size,
OMP_NUM_THREADS=1 per rank; each times its own training loop after warm-up steps (process start-up is not
counted) and reports steps/s of rank 0, and the CPU time rank 0's process spends per step (all threads; much
less disturbed by other load on the machine than wall time). The two are run alternately ROUNDS times
(nbtrain first, then torchrun, …, so slow drifts in the machine's load hit both) and the medians compared.
Goal: nbtrain ≥ 0.98× torchrun.

With ranks = cores (2 ranks on 2 CPUs) every CPU-second the notebook's kernel spends while the ranks train
is taken from a rank; ``--dashboard`` attaches the live widget dashboard to the nbtrain runs, as a notebook
shows it by default (no front end here: displaying does nothing), and the kernel's CPU share while the ranks
trained is printed for each nbtrain run. ``--width 256 --hidden 512 --steps 2000`` is a small model
(hundreds of steps per second) where a fixed per-step cost shows most.

    python benchmarks/training_overhead.py [--rounds 5] [--steps 300] [--width 512] [--hidden 1024]
                                           [--dashboard] [--gpu] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torchrun_script
from torchrun_script import PREAMBLE

MODEL = """
import time, torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
WIDTH, HIDDEN, BATCH, STEPS, WARMUP = {width}, {hidden}, 64, {steps}, 20
data = TensorDataset(torch.randn(BATCH * (STEPS + WARMUP) * 2, WIDTH), torch.randint(0, 10, (BATCH * (STEPS + WARMUP) * 2,)))
net = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                          torch.nn.Linear(HIDDEN, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
loader = DataLoader(data, batch_size=BATCH, shuffle=True)
"""

# The timed loop, the same under both launchers but for the backward call and nbtrain's logging.
LOOP = """
for step, (x, y) in enumerate(loader):
    if step == WARMUP:
        started, cpu_started = time.perf_counter(), time.process_time()
    if step == WARMUP + STEPS:
        break
    x, y = x.to(device), y.to(device)
    loss = F.cross_entropy(model(x), y)
    BACKWARD
    opt.step(); opt.zero_grad()
"""

NBTRAIN_CELL = MODEL + """
import nbtrain
model, opt, loader = nbtrain.prepare(net, opt, loader)
""" + LOOP.replace("BACKWARD", "nbtrain.backward(loss)") + """    nbtrain.log(loss=loss)
steps_per_s = STEPS / (time.perf_counter() - started)
window = (started, time.perf_counter())
cpu_ms = 1000 * (time.process_time() - cpu_started) / STEPS
threads = torch.get_num_threads()
"""

TORCHRUN_SCRIPT = PREAMBLE + """
import json
from torch.utils.data.distributed import DistributedSampler
""" + MODEL + """
sampler = DistributedSampler(data, shuffle=True)
loader = DataLoader(data, batch_size=BATCH, sampler=sampler, pin_memory=device.type == "cuda")
model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None)
sampler.set_epoch(0)
""" + LOOP.replace("BACKWARD", "loss.backward()") + """if device.type == "cuda":
    torch.cuda.synchronize()
if rank == 0:
    print("RESULT " + json.dumps([STEPS / (time.perf_counter() - started), 1000 * (time.process_time() - cpu_started) / STEPS]))
dist.destroy_process_group()
"""


class KernelClock:
    """Samples this process's CPU time (all threads) against the clock the ranks time their loop with."""

    def __init__(self, period: float = 0.2) -> None:
        self.samples: list[tuple[float, float]] = []
        self._period, self._stop = period, threading.Event()
        self._thread = threading.Thread(target=self._run, name="benchmark-clock", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), time.process_time()))  # perf_counter: CLOCK_MONOTONIC, system-wide
            self._stop.wait(self._period)

    def __enter__(self) -> KernelClock:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def share(self, start: float, end: float) -> float:
        """The kernel's CPU seconds per second between ``start`` and ``end`` (1.0 = one core busy)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def run_nbtrain(steps: int, gpu: bool, ranks: int, width: int, hidden: int, dashboard: bool) -> tuple[float, float, float]:
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    namespace: dict = {}
    cell = NBTRAIN_CELL.format(steps=steps, width=width, hidden=hidden)
    if gpu:
        cell = cell.replace("steps_per_s =", "torch.cuda.synchronize()\nsteps_per_s =")
    with KernelClock() as clock:
        run_source(cell, LaunchRequest(nprocs=ranks, cpu=not gpu, keep_alive=0, amp="off"),  # fp32, as the torchrun loop
                   namespace, write=lambda stream, text: None, observers=[_dashboard()] if dashboard else [])
    return namespace["steps_per_s"], namespace["cpu_ms"], clock.share(*namespace["window"])


def _dashboard():
    """The widget dashboard a notebook shows, with nowhere to show it (no front end in a script)."""
    import IPython.display

    from nbtrain.kernel.dashboard.chart import bundle_source
    from nbtrain.kernel.dashboard.observer import DashboardObserver
    from nbtrain.kernel.dashboard.widget import RunDashboard

    bundle_source()  # an unbuilt chart would detach the dashboard at the run's start: measured without it
    IPython.display.display = lambda *args, **kwargs: None
    return DashboardObserver(RunDashboard)


def run_torchrun(steps: int, gpu: bool, ranks: int, width: int, hidden: int) -> tuple[float, float]:
    script = TORCHRUN_SCRIPT.format(steps=steps, width=width, hidden=hidden, backend="nccl" if gpu else "gloo")
    steps_per_s, cpu_ms = torchrun_script.run(script, ranks, timeout=600)  # rank 0 printed [steps/s, CPU ms]
    return steps_per_s, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=512, help="inputs of the MLP")
    parser.add_argument("--hidden", type=int, default=1024, help="width of its two hidden layers")
    parser.add_argument("--dashboard", action="store_true", help="the nbtrain runs show the live widget dashboard")
    parser.add_argument("--gpu", action="store_true", help="NCCL, a GPU per rank (bf16 by default), instead of gloo on CPU")
    parser.add_argument("--ranks", type=int, default=2, help="ranks of both runs (with --gpu: at most the GPUs there are)")
    args = parser.parse_args()
    model = dict(width=args.width, hidden=args.hidden)
    nbtrain_runs, torchrun_runs = [], []
    for round_number in range(args.rounds):
        nbtrain_runs.append(run_nbtrain(args.steps, args.gpu, args.ranks, dashboard=args.dashboard, **model))
        torchrun_runs.append(run_torchrun(args.steps, args.gpu, args.ranks, **model))
        print(f"round {round_number + 1}: nbtrain prepare()+log() {nbtrain_runs[-1][0]:.1f} steps/s "
              f"({nbtrain_runs[-1][1]:.2f} CPU ms/step, kernel {100 * nbtrain_runs[-1][2]:.1f} % of a core), "
              f"torchrun {torchrun_runs[-1][0]:.1f} steps/s ({torchrun_runs[-1][1]:.2f} CPU ms/step)", flush=True)
    ratios = sorted(n[0] / t[0] for n, t in zip(nbtrain_runs, torchrun_runs, strict=True))
    print(f"per-round steps/s ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    a, b = statistics.median(r[0] for r in nbtrain_runs), statistics.median(r[0] for r in torchrun_runs)
    ca, cb = statistics.median(r[1] for r in nbtrain_runs), statistics.median(r[1] for r in torchrun_runs)
    kernel = statistics.median(r[2] for r in nbtrain_runs)
    print(f"median: nbtrain {a:.1f} steps/s, torchrun {b:.1f} steps/s, ratio {a / b:.3f}x; "
          f"CPU per step: nbtrain {ca:.2f} ms, torchrun {cb:.2f} ms, speed ratio by CPU time {cb / ca:.3f}x; "
          f"kernel while training {100 * kernel:.1f} % of a core{' (dashboard on)' if args.dashboard else ''} "
          f"({args.ranks} ranks, MLP {args.width}-{args.hidden}-{args.hidden}-10, {time.strftime('%Y-%m-%d')}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
