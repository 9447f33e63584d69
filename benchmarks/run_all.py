"""Run every benchmark and rewrite docs/benchmarks.md with what they printed, the machine and the date.

    python benchmarks/run_all.py [--quick] [--only NAME ...] [--gpu]

Each benchmark measures nbtrain against its reference (bare torchrun, no logging, no dashboard, ...) in
the same run and prints ratios; this script only runs them one after the other — never in parallel, so
they do not disturb each other — and records the output. ``--quick`` uses smaller sizes (minutes, not
tens of minutes) for a first look; ``--gpu`` adds the GPU variants (NCCL, AMP) on a machine with GPUs,
with one rank per GPU there is (counted through NVML, as ``%%distributed`` counts them — this process
never initialises CUDA): 1 on a one-GPU machine, where 2 NCCL ranks cannot run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    goal: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    gpu: bool = False


BENCHMARKS = (
    Benchmark("launch", "Launch and throughput against torchrun and accelerate (CPU, gloo)",
              "cold start ≤ 1.0× accelerate's notebook_launcher and ≤ 0.5× torchrun; warm re-run ≤ 0.5 s; "
              "steps/s ≥ 0.98× torchrun",
              ("launch_vs_torchrun.py", "--ranks", "2", "4", "--repeats", "5"),
              ("launch_vs_torchrun.py", "--ranks", "2", "--repeats", "1", "--steps", "100")),
    Benchmark("nodes", "Two nodes against torchrun --nnodes 2 (emulated nodes, CPU, gloo)",
              "cold start ≤ 1.1× torchrun; warm re-run ≤ 0.5 s; steps/s ≥ 0.98× torchrun",
              ("nodes_vs_torchrun.py", "--repeats", "3"), ("nodes_vs_torchrun.py", "--repeats", "1", "--steps", "30")),
    Benchmark("training", "prepare() + log() in a cell against the same loop under torchrun",
              "≥ 0.98× torchrun steps/s",
              ("training_overhead.py", "--rounds", "5"), ("training_overhead.py", "--rounds", "1", "--steps", "100")),
    Benchmark("training-cores", "Ranks = cores with the dashboard: a small model against torchrun",
              "≥ 0.98× torchrun steps/s (the kernel's CPU while the ranks train is printed too)",
              ("training_overhead.py", "--rounds", "5", "--steps", "2000", "--width", "256", "--hidden", "512", "--dashboard"),
              ("training_overhead.py", "--rounds", "1", "--steps", "500", "--width", "256", "--hidden", "512", "--dashboard")),
    Benchmark("helpers", "Per-call cost of the training helpers (µs)", "tens of µs per step",
              ("helper_overhead_us.py",), ("helper_overhead_us.py", "--repeats", "3")),
    Benchmark("logging", "Logging every step: nothing vs nbtrain.log vs loss.item()", "nbtrain.log ≤ 1 % cost (GPU)",
              ("log_overhead.py",), ("log_overhead.py", "--blocks", "3")),
    Benchmark("integrations", "A Hugging Face Trainer logging every step: alone vs with nbtrain's integration",
              "≤ 1.02× the Trainer's time per step", ("integration_overhead.py",),
              ("integration_overhead.py", "--blocks", "2")),
    Benchmark("dashboard", "Kernel cost of the live dashboard", "≤ 2 % of one core; ≤ 4 widget messages/s; flat memory",
              ("dashboard_cost.py", "--seconds", "30"), ("dashboard_cost.py", "--seconds", "10")),
    Benchmark("cell", "What the live dashboard adds to a warm trivial cell, against --no-dashboard (CPU)",
              "with the dashboard ≤ 1.2× without", ("cell_overhead.py", "--rounds", "10", "--cpu"),
              ("cell_overhead.py", "--rounds", "4", "--cpu")),
    Benchmark("leases", "GPU leases on a shared server: taking them in a cold start, and a release to the next "
              "queued cell", "taking the leases < 5 ms of the cold start; the next queued cell holds the GPUs within "
              "2 s of their release", ("gpu_leases.py", "--repeats", "200", "--rounds", "10"),
              ("gpu_leases.py", "--repeats", "50", "--rounds", "3")),
    Benchmark("results", "Large results back into the notebook (shared memory)",
              "1 GiB back in ≤ 1.5 s; peak extra memory ≤ 1.3× the tensor",
              ("results_transfer.py", "--mib", "1024", "--repeats", "3"), ("results_transfer.py", "--repeats", "1")),
    Benchmark("sharded", "--shard (FSDP2) against DDP and the same FSDP2 loop under torchrun: memory per rank, steps/s",
              "training state per rank ≤ 1/N of DDP's + 10 %; steps/s ≥ 0.98× torchrun FSDP2",
              ("sharded_memory.py", "--rounds", "5"), ("sharded_memory.py", "--rounds", "1", "--layers", "2", "--steps", "3")),
    Benchmark("background", "A --background cell in a real kernel: its return, the kernel's CPU while it trains",
              "the cell returns in < 1 s; the kernel stays light while other cells run",
              ("background_cell.py", "--repeats", "5"), ("background_cell.py", "--repeats", "2", "--seconds", "5")),
    Benchmark("detach", "A --detach run: the cell's return, and %distributed_attach over a 10^5-step record",
              "the cell returns in < 1 s; the attach catches up with 10^5 logged steps within seconds",
              ("detach_attach.py", "--steps", "100000"), ("detach_attach.py", "--steps", "5000")),
    Benchmark("checkpoint", "save_checkpoint() under --shard against DCP by hand: sync, async, resume (CPU, gloo)",
              "nbtrain ≤ 1.05× raw dcp.save / dcp.async_save / dcp.load for each",
              ("checkpoint_speed.py", "--rounds", "6"), ("checkpoint_speed.py", "--rounds", "2", "--layers", "4")),
    Benchmark("preemption", "A spot reclaim on emulated nodes: notice → checkpoint → re-formed group (CPU, gloo)",
              "checkpoint within one step plus the write; re-form to first step ≤ 1.5× a cold start; 0 steps lost",
              ("preemption.py", "--rounds", "3"), ("preemption.py", "--rounds", "1")),
    Benchmark("fault-tolerance", "A worker lost mid-run: torchft replica groups against torch elastic's restart (CPU, gloo)",
              "the others' pause ≤ one step + 2 s; 0 steps redone",
              ("fault_tolerance.py", "--rounds", "3"), ("fault_tolerance.py", "--rounds", "1")),
    Benchmark("ft-cell", "A rank lost in a cell: %%distributed 3 --ft against --checkpoint --max-restarts 1 (CPU, gloo)",
              "--ft: the others' pause ≤ one step + 2 s; 0 steps redone",
              ("ft_cell.py", "--rounds", "3"), ("ft_cell.py", "--rounds", "1")),
    Benchmark("soak", "Soak: runs in one kernel (warm, cold, failing, interrupted)", "no growth beyond the stated bounds",
              ("soak.py", "--runs", "200"), ("soak.py", "--runs", "16")),
    Benchmark("training-gpu", "prepare() + log() on GPUs (NCCL, bf16)", "≥ 0.98× torchrun; AMP bf16 ≥ 2× fp32",
              ("training_overhead.py", "--gpu"), ("training_overhead.py", "--gpu", "--rounds", "1"), gpu=True),
    Benchmark("speed-gpu", "Speed settings on GPUs: fp32 / bf16 / bf16+channels_last / +compile, ResNet-50 and a "
              "transformer, against torchrun", "bf16 with nbtrain's defaults ≥ 2× fp32 (ResNet-50); every figure ≥ 0.98× "
              "torchrun with the same settings; logging every step ≤ 1 %",
              ("gpu_speed.py", "--rounds", "3"), ("gpu_speed.py", "--rounds", "1", "--steps", "10"), gpu=True),
    Benchmark("sharded-gpu", "--shard (FSDP2) on GPUs against DDP and the FSDP2 loop under torchrun",
              "training state per rank ≤ 1/N of DDP's + 10 %; steps/s ≥ 0.98× torchrun FSDP2",
              ("sharded_memory.py", "--gpu", "--rounds", "3", "--steps", "20"),
              ("sharded_memory.py", "--gpu", "--rounds", "1", "--steps", "10"), gpu=True),
    Benchmark("nccl-eager", "NCCL's communicator built at start (device_id) against at the first collective",
              "init + first all-reduce no slower than the lazy communicator's",
              ("nccl_first_collective.py", "--repeats", "5"), ("nccl_first_collective.py", "--repeats", "3"), gpu=True),
    Benchmark("cell-gpu", "What the live dashboard adds to a warm trivial cell on GPUs (NVML read, the Xid watcher)",
              "with the dashboard ≤ 1.2× without", ("cell_overhead.py", "--rounds", "10"),
              ("cell_overhead.py", "--rounds", "4"), gpu=True),
    Benchmark("logging-gpu", "Logging every step on GPUs", "nbtrain.log ≤ 1 % cost",
              ("log_overhead.py", "--gpu"), ("log_overhead.py", "--gpu", "--blocks", "3"), gpu=True),
)


def machine() -> str:
    import psutil
    import torch

    from nbtrain.gpu import nvml

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpus = ", ".join(g.name for g in nvml.all_gpus()) or "no GPU"
    return (f"{cpu}, {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, {gpus}; "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def gpu_ranks() -> int:
    """Ranks for the GPU benchmarks: one per GPU this process may use (NVML, ``CUDA_VISIBLE_DEVICES``)."""
    from nbtrain.gpu import nvml

    return len(nvml.visible_gpus())


def command(bench: Benchmark, quick: bool, ranks: int | None = None) -> tuple[str, ...]:
    """The benchmark's script and arguments; GPU ones get ``--ranks`` (:func:`gpu_ranks` unless given)."""
    args = bench.quick_args if quick else bench.args
    if bench.gpu:
        args += ("--ranks", str(gpu_ranks() if ranks is None else ranks))
    return args


def run(args: tuple[str, ...]) -> tuple[str, float, int]:
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, os.path.join(HERE, args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    output = proc.stdout.strip() or proc.stderr.strip()[-3000:]
    return output, time.monotonic() - started, proc.returncode


def _existing_sections(path: str) -> dict[str, str]:
    """The sections of an earlier docs/benchmarks.md, so that ``--only`` refreshes some and keeps the rest.
    Sections are found by their known titles (a benchmark's own output may hold "## " lines)."""
    try:
        text = open(path).read()
    except OSError:
        return {}
    found = sorted((text.find(f"\n## {b.title}\n"), b.title) for b in BENCHMARKS if f"\n## {b.title}\n" in text)
    sections = {}
    for i, (at, title) in enumerate(found):
        stop = found[i + 1][0] if i + 1 < len(found) else len(text)
        sections[title] = text[at + 1:stop].rstrip() + "\n"
    return sections


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHMARKS])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if (args.only is None or b.name in args.only) and (args.gpu or not b.gpu)]
    ranks = gpu_ranks() if any(b.gpu for b in chosen) else 0
    if any(b.gpu for b in chosen) and ranks == 0:
        from nbtrain.gpu import nvml

        parser.error(f"--gpu: no usable GPU ({nvml.unavailable_reason() or 'CUDA_VISIBLE_DEVICES hides them all'}); "
                     "run without --gpu")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = machine()
    load = os.getloadavg()[0]
    sections: dict[str, str] = _existing_sections(args.out) if args.only else {}
    for bench in chosen:
        print(f"running {bench.name} ...", flush=True)
        bench_args = command(bench, args.quick, ranks)
        output, seconds, code = run(bench_args)
        print(output, flush=True)
        shown = "python benchmarks/" + " ".join(bench_args)
        status = "" if code == 0 else f"\n\n**The benchmark exited with code {code}.**"
        sections[bench.title] = (f"## {bench.title}\n\nGoal: {bench.goal}. Command: `{shown}` ({seconds:.0f} s, "
                                 f"{when}).\n\n```\n{output}\n```{status}\n")
    with open(args.out, "w") as fh:
        fh.write(
            "# Benchmarks\n\n"
            f"Refreshed by `python benchmarks/run_all.py{' --quick' if args.quick else ''}{' --gpu' if args.gpu else ''}` "
            f"(each section says when it was measured; `--only NAME` refreshes one).\n\n"
            f"Machine: {where}. Load average at the last start: {load:.1f}.\n\n"
            "Each benchmark measures nbtrain and its reference in the same run and prints the ratio. How each one "
            "is measured is in its module docstring; discussions of earlier results are in "
            "[benchmarks-training.md](benchmarks-training.md) and [benchmarks-dashboard.md](benchmarks-dashboard.md).\n\n"
            + "\n".join(sections[b.title] for b in BENCHMARKS if b.title in sections))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
