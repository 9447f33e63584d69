"""A ``--detach`` run in real kernels: the cell's return, and the time from ``%distributed_attach`` to a caught-up chart.

Kernel A (jupyter_client) runs a ``--detach`` cell of 2 CPU ranks that logs ``--steps`` steps as fast as it can,
then goes on logging a step every 0.05 s; the cell is timed from its execute request to its reply. Once the run's
record holds every fast step, kernel A is SIGKILLed. Kernel B then runs ``%distributed_attach --background``
(with its dashboard, as the cell has it) and is timed: to its reply, and to the moment the run's live ``history`` — fed by the same
events as the dashboard's chart — holds the last fast step (the whole record replayed, the chart live from
there). The run is stopped with ``%distributed_shutdown --detached``.

    python benchmarks/detach_attach.py [--steps 100000]
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time

from jupyter_client.manager import start_new_kernel

TRAINING = """%%distributed 2 --cpu --detach
import time, nbtrain
for step in range({steps} + 2000):
    nbtrain.log(loss=1.0 / (step + 1))
    if step >= {steps}:
        time.sleep(0.05)
"""
CAUGHT_UP = ("import nbtrain; h = nbtrain.last_run.history\n"
             "print('loss' in h and 0 in h.ranks('loss') and h.series('loss', 0).steps[-1] >= {last})")


def execute(client, code: str, timeout: float = 300.0) -> tuple[float, str]:
    """Run ``code``; the seconds until its reply, and what it printed (read until the kernel is idle again)."""
    began = time.perf_counter()
    msg_id = client.execute(code)
    printed, seconds = [], None
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise AssertionError(f"{code!r} failed: {msg['content']['ename']}: {msg['content']['evalue']}")
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            seconds = time.perf_counter() - began
            return seconds, "".join(printed)


def wait_for_step(run_dir: str, step: int, timeout: float = 600.0) -> None:
    from nbtrain.wire.runfolder import list_runs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = list_runs(run_dir)
        if runs and runs[-1].step is not None and runs[-1].step >= step:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the run did not reach step {step}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    run_dir = tempfile.mkdtemp(prefix="nbtrain-bench-runs-")
    os.environ["NBTRAIN_RUNS_DIR"] = run_dir  # the kernels and the run's agent inherit it
    first, first_client = start_new_kernel(kernel_name="python3")
    try:
        execute(first_client, "%load_ext nbtrain")
        returned, _ = execute(first_client, TRAINING.format(steps=args.steps))
        wait_for_step(run_dir, args.steps - 1)
        pid = getattr(first.provisioner, "pid", None)  # a local kernel's process
        assert isinstance(pid, int), "the kernel runs on this machine"
        os.kill(pid, signal.SIGKILL)
    finally:
        first_client.stop_channels()
    second, client = start_new_kernel(kernel_name="python3")
    try:
        execute(client, "%load_ext nbtrain")
        began = time.perf_counter()
        attached, _ = execute(client, "%distributed_attach --background")
        while execute(client, CAUGHT_UP.format(last=args.steps - 1))[1].split()[-1:] != ["True"]:  # after any warning
            time.sleep(0.05)
        caught_up = time.perf_counter() - began
        execute(client, "%distributed_shutdown --detached")
    finally:
        client.stop_channels()
        second.shutdown_kernel(now=True)
        first.shutdown_kernel(now=True)
    print(f"--detach cell's return: {returned:.3f} s; goal < 1 s")
    print(f"%distributed_attach --background with {args.steps} logged steps recorded: returned in {attached:.3f} s, "
          f"history and chart caught up (step {args.steps - 1}) in {caught_up:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
