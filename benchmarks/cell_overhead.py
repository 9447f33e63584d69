"""What the live dashboard adds to each cell: a warm trivial cell with the dashboard against ``--no-dashboard``.

A Jupyter kernel (jupyter_client) loads nbtrain and warms its ranks; then, for ``--rounds`` rounds, the same trivial
``%%distributed`` cell runs with the dashboard and with ``--no-dashboard``, alternately (so the machine's load is
shared alike), each timed from its execute request to its reply — what the user waits for. On a machine with GPUs
the cell runs on them (one rank per GPU), and the dashboard reads them through NVML: the device panel, the Xid
watcher, the final picture. Printed: the median of each, and their ratio.

Goal: with the dashboard ≤ 1.2× without (an H200 once took 0.61 s with it against 0.11 s without: closing the
run's Xid watcher waited for NVML's event wait).

    python benchmarks/cell_overhead.py [--rounds 10] [--ranks 2] [--cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from background_cell import drain, execute
from jupyter_client.manager import start_new_kernel

CELL = "%%distributed {ranks} {where} {dashboard}\nx = rank + 1\n"


def cell(ranks: int, cpu: bool, dashboard: bool) -> str:
    return CELL.format(ranks=ranks, where="--cpu" if cpu else "", dashboard="" if dashboard else "--no-dashboard")


def measure(client, ranks: int, cpu: bool, rounds: int) -> tuple[list[float], list[float]]:
    """(seconds with the dashboard, seconds without), one of each per round, alternately."""
    for dashboard in (True, False):  # warm ranks, and the first picture's imports, before anything is timed
        execute(client, cell(ranks, cpu, dashboard))
    with_dashboard, without = [], []
    for _ in range(rounds):
        drain(client)
        with_dashboard.append(execute(client, cell(ranks, cpu, True)))
        drain(client)
        without.append(execute(client, cell(ranks, cpu, False)))
    return with_dashboard, without


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=None, help="default: one per GPU, or 2 on the CPU")
    parser.add_argument("--cpu", action="store_true", help="CPU ranks even where there are GPUs")
    args = parser.parse_args()
    from nbtrain.gpu import nvml

    gpus = 0 if args.cpu else len(nvml.visible_gpus())
    ranks = args.ranks or gpus or 2
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        execute(client, "%load_ext nbtrain")
        with_dashboard, without = measure(client, ranks, not gpus, args.rounds)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    on, off = statistics.median(with_dashboard), statistics.median(without)
    where = f"{ranks} rank{'s' if ranks != 1 else ''} on {'GPUs' if gpus else 'the CPU'}"
    print(f"warm trivial cell, {where} (median of {args.rounds}, alternately):")
    print(f"  with the dashboard {on:.3f} s  --no-dashboard {off:.3f} s  ratio {on / off:.2f}x (goal <= 1.2x)")
    print(f"  with the dashboard, each: {' '.join(f'{s:.3f}' for s in with_dashboard)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
