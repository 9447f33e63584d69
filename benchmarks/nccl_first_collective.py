"""NCCL's communicator built at start (``init_process_group(device_id=…)``, as nbtrain's ranks do) against built
at the first collective (torch's default without ``device_id``): the time to ``init_process_group``, the first
all-reduce's latency, and the two together — what the first step of a cell waits for.

    python benchmarks/nccl_first_collective.py [--ranks N] [--repeats 3]     # one process per GPU, NCCL
    python benchmarks/nccl_first_collective.py --cpu                          # gloo: checks the script only

Each repeat starts fresh processes (a new communicator each time); medians over the repeats. A later
all-reduce's latency is printed too, as the floor both modes reach.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

RANK_SCRIPT = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
rank, eager, cpu = int(os.environ["RANK"]), os.environ["EAGER"] == "1", os.environ["CPU"] == "1"
device = torch.device("cpu") if cpu else torch.device("cuda", rank)
if not cpu:
    torch.cuda.set_device(device)
    torch.cuda.init()
x = torch.ones(1 << 10, device=device)
started = time.perf_counter()
dist.init_process_group("gloo" if cpu else "nccl", **({"device_id": device} if eager and not cpu else {}))
inited = time.perf_counter()
def reduce():
    dist.all_reduce(x)
    if not cpu:
        torch.cuda.synchronize()
reduce()
first = time.perf_counter()
reduce()
later = time.perf_counter()
if rank == 0:
    print(json.dumps({"init_s": inited - started, "first_ms": (first - inited) * 1e3, "later_ms": (later - first) * 1e3}))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(ranks: int, eager: bool, cpu: bool) -> dict:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks),
               EAGER="1" if eager else "0", CPU="1" if cpu else "0")
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed (exit codes {[p.returncode for p in procs]})")
    return json.loads(outputs[0].strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=None, help="processes, one per GPU (default: every GPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU: runs the script, measures nothing of NCCL")
    args = parser.parse_args()
    if args.cpu:
        ranks = args.ranks or 2
    else:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA GPU here: this compares NCCL's communicator set-up; use --cpu to check the script")
        ranks = args.ranks or torch.cuda.device_count()
    rows = {}
    for eager in (True, False):
        runs = [one_start(ranks, eager, args.cpu) for _ in range(args.repeats)]
        rows[eager] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"{'communicator':<22} {'init s':>8} {'first all-reduce ms':>20} {'init + first s':>15} {'later ms':>9}"
          f"   ({ranks} ranks, {'gloo' if args.cpu else 'nccl'}, median of {args.repeats})")
    for eager, row in rows.items():
        name = "at start (device_id)" if eager else "at first collective"
        total = row["init_s"] + row["first_ms"] / 1e3
        print(f"{name:<22} {row['init_s']:>8.3f} {row['first_ms']:>20.2f} {total:>15.3f} {row['later_ms']:>9.3f}")
    eager_total = rows[True]["init_s"] + rows[True]["first_ms"] / 1e3
    lazy_total = rows[False]["init_s"] + rows[False]["first_ms"] / 1e3
    print(f"first all-reduce: {rows[True]['first_ms']:.2f} ms at start vs {rows[False]['first_ms']:.2f} ms lazily; "
          f"init + first all-reduce {eager_total / lazy_total:.2f}x the lazy one's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
