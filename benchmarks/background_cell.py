"""A ``%%distributed --background`` cell in a real kernel: how fast it returns, and the kernel's CPU while it trains.

A Jupyter kernel (jupyter_client) loads nbtrain; then, for ``--repeats`` rounds, a ``--background`` cell of 2 CPU
ranks that train until stopped is run and timed from its execute request to its reply (the cell's return); while
the run trains, a plain cell runs every half second for ``--seconds`` and the kernel process's CPU is sampled
(psutil, percent of one core), the dashboard on. Each run is stopped with ``run.stop()`` from another cell.

    python benchmarks/background_cell.py [--repeats 5] [--seconds 10]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time

import psutil
from jupyter_client.manager import start_new_kernel

TRAINING = """%%distributed 2 --cpu --background
import time, nbtrain
step = 0
while True:
    nbtrain.log(loss=1.0 / (step + 1))
    step += 1
    time.sleep(0.02)
"""


def execute(client, code: str, timeout: float = 120.0) -> float:
    """Run ``code``; the seconds until its reply."""
    began = time.perf_counter()
    msg_id = client.execute(code)
    while True:
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return time.perf_counter() - began


def drain(client) -> None:
    while True:
        try:
            client.get_iopub_msg(timeout=0.01)
        except queue.Empty:
            return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        execute(client, "%load_ext nbtrain")
        pid = getattr(manager.provisioner, "pid", None)  # a local kernel's process
        assert isinstance(pid, int), "the kernel runs on this machine"
        kernel = psutil.Process(pid)
        returns, cpu = [], []
        for _ in range(args.repeats):
            returns.append(execute(client, TRAINING))
            time.sleep(1.0)  # the ranks start
            kernel.cpu_percent(None)
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                execute(client, "x = sum(range(1000))")
                drain(client)
                time.sleep(0.5)
            cpu.append(kernel.cpu_percent(None))
            execute(client, "import nbtrain; nbtrain.last_run.stop()")
            drain(client)
        execute(client, "%distributed_shutdown")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    print(f"background cell's return: median {statistics.median(returns):.3f} s (min {min(returns):.3f}, "
          f"max {max(returns):.3f}) over {args.repeats} runs; goal < 1 s")
    print(f"kernel CPU while a background run trains (2 ranks, dashboard, a cell every 0.5 s): median "
          f"{statistics.median(cpu):.1f} % of one core (max {max(cpu):.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
