"""How fast a large tensor assigned on rank 0 comes back into the notebook, and what memory it costs.

    python benchmarks/results_transfer.py [--mib 256] [--repeats 3]     # --mib 1024 for the 1 GiB case

A warm pool of 2 CPU ranks runs ``big2 = torch.full((N,), 2.0)`` twice per repeat: once with ``--out -``
(nothing comes back) and once with ``--out big2``; the difference is the cost of bringing the tensor
back. Meanwhile a thread samples, every 5 ms, the kernel's (this process's) RSS, rank 0's RSS and the
bytes of this kernel's files in ``/dev/shm``; "extra memory" is the peak of their sum above the value
before the cell, minus the tensor itself (which rank 0 has to hold anyway), in units of the tensor's size.
The kernel touches every page of the result (``big2.sum()``) inside the measured time, so lazily mapped
pages are counted.

Reference, in the same run: what a torchrun user does to get a tensor out of the ranks — rank 0
``torch.save``\\ s it to a file in ``/dev/shm`` and the notebook ``torch.load``\\ s it (a spawned process
saves; the time counts save + load; memory is sampled the same way).

Goals: 1 GiB back in ≤ 1.5 s, extra memory ≤ 1.3× the tensor's size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import torch

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.request.config import LaunchRequest
from nbtrain.wire.shm import owner_prefix


class Sampler:
    """Peak of (RSS of the given processes + bytes of this kernel's /dev/shm files) while it runs."""

    def __init__(self, pids: list[int], extra_prefix: str | None = None) -> None:
        self.procs = [psutil.Process(p) for p in pids]
        self.prefixes = [owner_prefix()] + ([extra_prefix] if extra_prefix else [])
        self.base = self.total()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def total(self) -> int:
        rss = 0
        for proc in self.procs:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        folder = os.path.dirname(self.prefixes[0])
        shm = 0
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if any(path.startswith(p) for p in self.prefixes):
                try:
                    shm += os.stat(path).st_blocks * 512
                except FileNotFoundError:
                    pass
        return rss + shm

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.total())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.total())


def nbtrain_round(manager: PoolManager, numel: int) -> tuple[float, float, float]:
    """(seconds without bringing back, seconds with, extra memory in tensor sizes)."""
    source = f"import torch\nbig2 = torch.full(({numel},), 2.0)\n"
    ns: dict = {}
    started = time.perf_counter()
    run_source(source, LaunchRequest(nprocs=2, cpu=True, out="-"), ns, manager=manager)
    without = time.perf_counter() - started
    assert manager.pool is not None  # kept warm by the run above
    rank0 = manager.pool.pids()[0]
    with Sampler([os.getpid(), rank0]) as sampler:
        started = time.perf_counter()
        run_source(source, LaunchRequest(nprocs=2, cpu=True, out="big2"), ns, manager=manager)
        float(ns["big2"].sum())  # every page in the kernel's memory
        with_out = time.perf_counter() - started
    nbytes = numel * 4
    assert ns["big2"].numel() == numel
    del ns
    return without, with_out, (sampler.peak - sampler.base - nbytes) / nbytes


SAVER = """
import sys, torch
torch.save(torch.full((int(sys.argv[1]),), 2.0), sys.argv[2])
print("saved", flush=True)
sys.stdin.read()
"""


def torch_save_round(numel: int) -> tuple[float, float]:
    """(seconds for save + load, extra memory in tensor sizes), the way a torchrun script hands a tensor over."""
    path = f"{owner_prefix()}bench.pt"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SAVER), str(numel), path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the saver's interpreter and torch import are not part of the transfer
        with Sampler([os.getpid(), proc.pid]) as sampler:
            started = time.perf_counter()
            assert proc.stdout is not None and proc.stdin is not None  # both PIPE
            proc.stdout.readline()
            loaded = torch.load(path)
            float(loaded.sum())
            seconds = time.perf_counter() - started
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait()
        if os.path.exists(path):
            os.unlink(path)
    nbytes = numel * 4
    del loaded
    return seconds, (sampler.peak - sampler.base - nbytes) / nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the result tensor in MiB (1024: the 1 GiB case)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    numel = args.mib * 2**20 // 4
    manager = PoolManager()
    try:
        run_source("x = 1", LaunchRequest(nprocs=2, cpu=True, out="-"), {}, manager=manager)  # warm pool
        rounds = [nbtrain_round(manager, numel) for _ in range(args.repeats)]
    finally:
        manager.shutdown()
    saves = [torch_save_round(numel) for _ in range(args.repeats)]
    back = statistics.median(w - wo for wo, w, _ in rounds)
    cell = statistics.median(w for _, w, _ in rounds)
    extra = max(x for _, _, x in rounds)
    ref_s = statistics.median(s for s, _ in saves)
    ref_extra = max(x for _, x in saves)
    print(f"{args.mib} MiB float32 result, 2 CPU ranks, warm pool, median of {args.repeats} "
          f"({time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} CPUs)")
    print(f"  nbtrain --out big2   cell {cell:.2f} s, bringing it back {back:.2f} s, peak extra memory "
          f"{extra:.2f}x the tensor (goal <= 1.3x)")
    print(f"  torch.save + load    {ref_s:.2f} s, peak extra memory {ref_extra:.2f}x the tensor")
    print(f"  ratio nbtrain / torch.save+load: {back / ref_s:.2f}x time")


if __name__ == "__main__":
    main()
