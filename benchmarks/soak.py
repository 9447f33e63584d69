"""Soak: many consecutive runs in one process; nothing may grow.

    python benchmarks/soak.py [--runs 200] [--ranks 2]

Cycles through warm runs, cold runs (``--fresh``), runs where a rank raises, and runs interrupted as the
stop button does (SIGINT to this process). Before and after, it counts: child processes, open file
descriptors, listening/connected sockets, threads, nbtrain files in /dev/shm, and this process's RSS.
Prints the figures and exits non-zero when a bound is exceeded (see :data:`BOUNDS`).
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time

import psutil
import torch

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.request.config import LaunchRequest

BOUNDS = {"children": 0, "fds": 8, "sockets": 2, "threads": 4, "shm_files": 0, "rss_mib": 150}


def snapshot() -> dict:
    me = psutil.Process()
    shm = [f for f in os.listdir("/dev/shm") if f.startswith(f"nbtrain-{os.getpid()}-")] if os.path.isdir("/dev/shm") else []
    return {
        "children": len([c for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]),
        "fds": me.num_fds(),
        "sockets": len(me.net_connections(kind="all")),
        "threads": me.num_threads(),
        "shm_files": len(shm),
        "rss_mib": me.memory_info().rss / 2**20,
    }


def one_run(kind: str, manager: PoolManager, ranks: int) -> str:
    request = LaunchRequest(nprocs=ranks, cpu=True, fresh=(kind == "cold"))
    quiet = lambda stream, text: None  # noqa: E731
    if kind == "fail":
        try:
            run_source("import torch.distributed as dist\nif rank == 1:\n    raise ValueError('x')\ndist.barrier()\n",
                       request, {}, manager=manager, write=quiet)
        except RankFailedError:
            return "failed as expected"
        return "UNEXPECTED: no failure"
    if kind == "interrupt":
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            run_source("import time\nwhile True:\n    time.sleep(0.01)\n", request, {}, manager=manager, write=quiet)
        except KeyboardInterrupt:
            return "interrupted"
        finally:
            timer.cancel()
        return "UNEXPECTED: not interrupted"
    big = {"data": torch.randn(200_000)}  # exercises shared memory
    run_source("s = float(data.sum()) + rank", request, big, manager=manager, write=quiet)
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    kinds = ["warm", "warm", "warm", "cold", "warm", "fail", "warm", "interrupt"]
    manager = PoolManager()
    # One warm-up run so that lazily created state (imports, the first pool) is in the baseline.
    one_run("warm", manager, args.ranks)
    manager.shutdown()
    gc.collect()
    before = snapshot()
    started = time.monotonic()
    outcomes: dict[str, int] = {}
    for i in range(args.runs):
        outcome = one_run(kinds[i % len(kinds)], manager, args.ranks)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    manager.shutdown()
    gc.collect()
    time.sleep(0.5)
    after = snapshot()
    print(f"{args.runs} runs in {time.monotonic() - started:.0f} s: {outcomes}")
    failed = False
    for key, bound in BOUNDS.items():
        growth = after[key] - before[key]
        ok = growth <= bound
        failed |= not ok
        print(f"  {key:10s} before {before[key]:8.1f}  after {after[key]:8.1f}  growth {growth:+8.1f}  bound {bound}  {'ok' if ok else 'EXCEEDED'}")
    failed |= any(k.startswith("UNEXPECTED") for k in outcomes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
