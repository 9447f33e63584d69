"""Two emulated nodes × 1 rank: ``%%distributed --nodes 2`` against two ``torchrun --nnodes 2 --rdzv-backend c10d``.

    python benchmarks/nodes_vs_torchrun.py [--repeats 3] [--steps 200]

The nodes are node agents on 127.0.0.2 and 127.0.0.3 (loopback), joined once, as a cluster's agents are
started once (torch already imported by them). Each round, interleaved:

* **cold start to first step** — a new pool (``--fresh``): from the call to rank 0's first DDP step, against two
  torchrun processes started together (``--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d``) running the same
  code as a script;
* **warm re-run** — the same cell again on the warm ranks;
* **throughput** — steps/s of the same DDP loop measured inside the ranks, under both.

The training code is :mod:`launch_vs_torchrun`'s; both sides run one intra-op thread per rank (the emulated
nodes share this machine's cores). Prints the medians and the ratios nbtrain / torchrun (goals:
cold ≤ 1.1×, warm ≤ 0.5 s, throughput ≥ 0.98×).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch  # noqa: F401  (a notebook that trains has torch imported already)
from launch_vs_torchrun import SCRIPT_WRAPPER, cell_source, marks_reader

from nbtrain.kernel.cluster import Cluster
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.request.config import LaunchRequest

ADDRESSES = ("127.0.0.2", "127.0.0.3")


def run_nbtrain(steps: int, manager: PoolManager, fresh: bool) -> tuple[float, float]:
    seen: dict[str, float] = {}
    write = marks_reader(seen)
    started = time.time()
    # One intra-op thread per rank under both: the two emulated nodes share this machine's cores.
    request = LaunchRequest(nodes="2", nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, fresh=fresh, keep_alive=600,
                            env=("OMP_NUM_THREADS=1",))
    run_source(cell_source(steps), request, {}, manager=manager, write=write)
    return seen["first"] - started, seen["rate"]


def run_torchrun(steps: int, workdir: str) -> tuple[float, float]:
    path = os.path.join(workdir, "train.py")
    with open(path, "w") as fh:
        fh.write(SCRIPT_WRAPPER.format(body=cell_source(steps)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    started = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--local-addr={address}",
                               "--rdzv-id=bench", path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env) for address in ADDRESSES]
    out = "".join(p.communicate()[0] for p in procs)
    first = next(float(s.split()[1]) for s in out.splitlines() if s.startswith("FIRST_STEP"))
    rate = next(float(s.split()[1]) for s in out.splitlines() if s.startswith("RATE"))
    return first - started, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    cluster = Cluster()
    join = cluster.hub("127.0.0.1").join_command().split()[1:]
    agents = [subprocess.Popen([sys.executable, *join, "--address", a], stdout=subprocess.DEVNULL) for a in ADDRESSES]
    cold_nb, warm_nb, rate_nb, cold_tr, rate_tr = [], [], [], [], []
    manager = PoolManager(cluster.make_pool)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for _ in range(args.repeats):
                first, rate = run_nbtrain(args.steps, manager, fresh=True)
                cold_nb.append(first)
                rate_nb.append(rate)
                first, rate = run_nbtrain(args.steps, manager, fresh=False)
                warm_nb.append(first)
                rate_nb.append(rate)
                manager.shutdown()
                first, rate = run_torchrun(args.steps, workdir)
                cold_tr.append(first)
                rate_tr.append(rate)
    finally:
        manager.shutdown()
        cluster.close()
        for agent in agents:
            agent.wait(10)
    med = statistics.median
    print(f"2 nodes x 1 rank (median of {args.repeats}):\n"
          f"  cold start to first step  nbtrain {med(cold_nb):.2f} s  torchrun {med(cold_tr):.2f} s  "
          f"ratio {med(cold_nb) / med(cold_tr):.2f}x (goal <= 1.1x)\n"
          f"  warm re-run to first step nbtrain {med(warm_nb):.3f} s (goal <= 0.5 s)\n"
          f"  throughput                nbtrain {med(rate_nb):.1f}  torchrun {med(rate_tr):.1f} steps/s  "
          f"ratio {med(rate_nb) / med(rate_tr):.3f}x (goal >= 0.98x)")


if __name__ == "__main__":
    main()
