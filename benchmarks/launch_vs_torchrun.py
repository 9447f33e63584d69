"""Launch latency and training throughput of ``%%distributed`` against bare torchrun and accelerate, in one run.

    python benchmarks/launch_vs_torchrun.py [--ranks 2 4] [--repeats 5] [--steps 300] [--accelerate /tmp/accel]

For each rank count it measures, on the CPU (gloo):

* **cold start to first step** — from the call to the moment rank 0 has finished its first DDP step: a new
  nbtrain pool (``--fresh``, keep-alive 0), its ranks forked from the zygote as in a notebook (started when the
  extension loaded, so ready by the first cell; idle for a moment before the cell, as between two cells, so its
  spare forks are ready: :mod:`nbtrain.rank.spares` — and again right after another pool started, back to back,
  when it forks them then), against ``torchrun --standalone`` starting the same code as a
  script, and against accelerate's ``notebook_launcher`` (which forks the calling process: a notebook that
  touched CUDA cannot use it) running the same code in a process that has torch imported — and again in one
  that has also imported what the zygote imports (``torch._dynamo``, which building an optimizer imports: a
  notebook that built one before has it), the like-for-like comparison. The notebook side has
  torch imported already, as a notebook that defines a model has. nbtrain's cold start is also split into its
  phases (:mod:`nbtrain.kernel.observers.coldstart`), the median of each phase over the repeats.
* **warm re-run** — the same, on nbtrain's warm pool (torchrun has no such thing: it pays a cold start).
* **throughput** — steps/s of a fixed DDP training loop measured inside the ranks (after warm-up), under
  nbtrain and under torchrun.

accelerate is not one of nbtrain's dependencies: install it outside the environment
(``pip install --no-deps --target /tmp/accel accelerate``) and name that folder with ``--accelerate``; it is put
on the path of the accelerate runs only (or set ``NBTRAIN_BENCH_ACCELERATE``, as ``benchmarks/run_all.py`` runs it).
Without it those columns are left out.

Prints each number and the ratios (goals: cold ≤ 1.0× accelerate and ≤ 0.5× torchrun, warm ≤ 0.5 s,
throughput ≥ 0.98×).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch  # noqa: F401  (a notebook that trains has torch imported already)

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.observers.coldstart import PHASES, latency
from nbtrain.kernel.ranks.starter import RankStarter
from nbtrain.kernel.request.config import LaunchRequest
from nbtrain.rank.spares import REFILL_AFTER_S
from nbtrain.rank.zygote import WARM_IMPORTS

BETWEEN_CELLS_S = REFILL_AFTER_S + 0.5  # the zygote idles this long before a cold cell: its spares are forked

TRAIN = """
import time, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def step():
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
step()
if dist.get_rank() == 0:
    print("FIRST_STEP", time.time(), flush=True)
for _ in range(WARMUP):
    step()
dist.barrier()
t0 = time.perf_counter()
for _ in range(STEPS):
    step()
dist.barrier()
rate = STEPS / (time.perf_counter() - t0)
if dist.get_rank() == 0:
    print("RATE", rate, flush=True)
"""

SCRIPT_WRAPPER = """
import torch.distributed as dist
dist.init_process_group("gloo")
{body}
dist.barrier()
dist.destroy_process_group()
"""


def cell_source(steps: int) -> str:
    return TRAIN.replace("WARMUP", "20").replace("STEPS", str(steps))


def marks_reader(seen: dict[str, float]):
    """A ``write`` for run_source that puts the cell's ``FIRST_STEP t`` and ``RATE r`` lines into ``seen``."""

    def write(stream: str, text: str) -> None:
        for line in text.splitlines():
            if line.startswith("FIRST_STEP"):
                seen["first"] = float(line.split()[1])
            elif line.startswith("RATE"):
                seen["rate"] = float(line.split()[1])
    return write


ACCELERATE_SCRIPT = """
import importlib, socket, sys, time
import torch  # the notebook has it imported
from accelerate import notebook_launcher
for name in {preloaded!r}:  # like-for-like: what the zygote has imported, the forked notebook has too
    importlib.import_module(name)

BODY = {body!r}

def train():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    exec(BODY, {{"__name__": "__main__"}})
    dist.barrier()
    dist.destroy_process_group()

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
print("STARTED", time.time(), flush=True)
notebook_launcher(train, num_processes={ranks}, use_port=str(port))
"""


def run_nbtrain(ranks: int, steps: int, manager: PoolManager, fresh: bool) -> tuple[float, float, dict]:
    seen: dict[str, float] = {}
    write = marks_reader(seen)
    started = time.time()
    result = run_source(cell_source(steps), LaunchRequest(nprocs=ranks, cpu=True, fresh=fresh, keep_alive=600),
                        {}, manager=manager, write=write)
    split = dict(result.cold_start.phases) if result.cold_start is not None else {}
    if result.cold_start is not None:
        split["how"] = result.cold_start.how  # type: ignore[assignment]
    return seen["first"] - started, seen["rate"], split


def run_accelerate(ranks: int, steps: int, path: str, preloaded: tuple[str, ...] = ()) -> float:
    """Cold start to first step under accelerate's notebook_launcher, in a process with torch imported (and the
    modules ``preloaded``: a notebook that built a model and an optimizer before has them)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks)),
           "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
    script = ACCELERATE_SCRIPT.format(body=cell_source(steps), ranks=ranks, preloaded=preloaded)
    out = _stdout([sys.executable, "-c", script], env)
    started = next(float(s.split()[1]) for s in out.splitlines() if s.startswith("STARTED"))
    first = next(float(s.split()[1]) for s in out.splitlines() if s.startswith("FIRST_STEP"))
    return first - started


def run_torchrun(ranks: int, steps: int, workdir: str) -> tuple[float, float]:
    path = os.path.join(workdir, "train.py")
    with open(path, "w") as fh:
        fh.write(SCRIPT_WRAPPER.format(body=cell_source(steps)))
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))}
    started = time.time()
    out = _stdout([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", path], env)
    first = next(float(s.split()[1]) for s in out.splitlines() if s.startswith("FIRST_STEP"))
    rate = next(float(s.split()[1]) for s in out.splitlines() if s.startswith("RATE"))
    return first - started, rate


EXIT_ABORT = "terminate called without an active exception"  # a C++ thread torch left running, at the ranks' exit


def _stdout(command: list[str], env: dict) -> str:
    """The command's output; when it fails, its stderr's end is in the error, which says why. torchrun's ranks
    sometimes abort in torch's C++ code as their interpreter exits, after the script printed its last mark: then
    what was measured stands, and the abort is said on stderr."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode and EXIT_ABORT in done.stderr and "\nRATE " in "\n" + done.stdout:
        print(f"note: {' '.join(command[2:4])}'s ranks aborted at exit after the measured run ({EXIT_ABORT})",
              file=sys.stderr)
    elif done.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} ... exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def measure(ranks: int, repeats: int, steps: int, starter: RankStarter, accelerate: str | None) -> dict:
    cold_nb, cold_tr, cold_acc, cold_acc_warm, warm_nb, rate_nb, rate_tr, splits = [], [], [], [], [], [], [], []
    back_to_back: list[float] = []
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(repeats):
            manager = PoolManager(starter=starter)
            try:
                time.sleep(BETWEEN_CELLS_S)
                first, rate, split = run_nbtrain(ranks, steps, manager, fresh=True)
                cold_nb.append(first)
                rate_nb.append(rate)
                splits.append(split)
                first, rate, _ = run_nbtrain(ranks, steps, manager, fresh=False)
                warm_nb.append(first)
                rate_nb.append(rate)
                back_to_back.append(run_nbtrain(ranks, steps, manager, fresh=True)[0])
            finally:
                manager.shutdown()
            first, rate = run_torchrun(ranks, steps, workdir)
            cold_tr.append(first)
            rate_tr.append(rate)
            if accelerate:
                cold_acc.append(run_accelerate(ranks, steps, accelerate))
                cold_acc_warm.append(run_accelerate(ranks, steps, accelerate, WARM_IMPORTS))
    med = statistics.median
    return {
        "ranks": ranks,
        "cold_nbtrain_s": med(cold_nb), "cold_torchrun_s": med(cold_tr), "cold_ratio": med(cold_nb) / med(cold_tr),
        "cold_accelerate_s": med(cold_acc) if cold_acc else None,
        "cold_accelerate_ratio": med(cold_nb) / med(cold_acc) if cold_acc else None,
        "cold_accelerate_preloaded_s": med(cold_acc_warm) if cold_acc_warm else None,
        "cold_accelerate_preloaded_ratio": med(cold_nb) / med(cold_acc_warm) if cold_acc_warm else None,
        "cold_split_s": {p: med(s.get(p, 0.0) for s in splits) for p in PHASES},
        "cold_how": sorted({s.get("how", "?") for s in splits}),
        "cold_back_to_back_s": med(back_to_back),
        "warm_nbtrain_s": med(warm_nb),
        "steps_per_s_nbtrain": med(rate_nb), "steps_per_s_torchrun": med(rate_tr),
        "throughput_ratio": med(rate_nb) / med(rate_tr),
    }


def report(row: dict, repeats: int) -> str:
    split = " · ".join(f"{phase} {latency(seconds)}" for phase, seconds in row["cold_split_s"].items())
    acc = (f"\n  cold start vs accelerate  nbtrain {row['cold_nbtrain_s']:.2f} s  accelerate {row['cold_accelerate_s']:.2f} s"
           f"  ratio {row['cold_accelerate_ratio']:.2f}x (goal <= 1.0x)\n"
           f"  cold start vs accelerate, its notebook with the zygote's imports  nbtrain {row['cold_nbtrain_s']:.2f} s"
           f"  accelerate {row['cold_accelerate_preloaded_s']:.2f} s  ratio {row['cold_accelerate_preloaded_ratio']:.2f}x"
           if row["cold_accelerate_s"] is not None else "")
    return (f"{row['ranks']} ranks (median of {repeats}):{acc}\n"
            f"  cold start vs torchrun    nbtrain {row['cold_nbtrain_s']:.2f} s  torchrun {row['cold_torchrun_s']:.2f} s"
            f"  ratio {row['cold_ratio']:.2f}x (goal <= 0.5x)\n"
            f"  nbtrain's cold start ({', '.join(row['cold_how'])}), median per phase: {split}\n"
            f"  cold start right after another pool started (no spare forks yet) nbtrain "
            f"{row['cold_back_to_back_s']:.2f} s\n"
            f"  warm re-run to first step nbtrain {row['warm_nbtrain_s']:.3f} s (goal <= 0.5 s)\n"
            f"  throughput                nbtrain {row['steps_per_s_nbtrain']:.1f}  torchrun {row['steps_per_s_torchrun']:.1f}"
            f" steps/s  ratio {row['throughput_ratio']:.3f}x (goal >= 0.98x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--accelerate", metavar="DIR", default=os.environ.get("NBTRAIN_BENCH_ACCELERATE"),
                        help="a folder accelerate is installed in (pip --target); default $NBTRAIN_BENCH_ACCELERATE")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    starter = RankStarter()
    starter.start_zygote()  # as %load_ext nbtrain does; a notebook's first cell comes after it is ready
    assert starter.zygote is not None and starter.zygote.wait_ready(), "the zygote did not start"
    try:
        rows = [measure(r, args.repeats, args.steps, starter, args.accelerate) for r in args.ranks]
    finally:
        starter.close()
    for row in rows:
        print(report(row, args.repeats))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
