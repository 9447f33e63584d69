"""What GPU leases add to a run on a shared server: the cost of taking them in a cold start, and how soon a
queued cell gets the GPUs another run gives back.

* ``take``: :func:`nbtrain.kernel.lifecycle.gpulease.lease_gpus` and the release, as a cold start does them —
  a place in the queue, the leases held (``/proc/locks``), the lease files made and locked — for GPUs named by
  number (the default, every visible GPU) and for ``--gpus auto`` (which reads NVML's processes too). The median
  and the 95th percentile over REPEATS.
* ``queue``: a holder process leases all four GPUs; this process waits for two with ``--gpus auto``; the holder
  gives them back and says when; the time until the waiter holds its lease, over ROUNDS.

Without a GPU the stand-in NVML of the tests (``tests/helpers/fake_nvml.py``) answers with four idle boards.

    python benchmarks/gpu_leases.py [--repeats 200] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HOLDER = """
import sys, time
from nbtrain.gpu import leases
lease = leases.take([0, 1, 2, 3], directory=sys.argv[1])
print("held", flush=True)
sys.stdin.readline()
lease.release()
print(time.monotonic(), flush=True)
"""


def _stand_in_nvml() -> None:
    """Four idle stand-in boards where this machine has no NVIDIA driver (before nbtrain first loads NVML)."""
    if os.path.exists("/dev/nvidiactl"):
        return
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from helpers import fake_nvml

    sys.modules["pynvml"] = fake_nvml.make_module([fake_nvml.FakeGpu(uuid=f"GPU-{i}", processes=[]) for i in range(4)])


def _spec(auto: bool):
    from nbtrain.kernel.ranks.spec import PoolSpec

    return PoolSpec(nprocs=2, backend="gloo", device_type="cpu", gpu_ids=() if auto else (0, 1), timeout_s=60.0,
                    gpu_count=2 if auto else 0)


def time_take(auto: bool, repeats: int) -> list[float]:
    from nbtrain.kernel.lifecycle import gpulease

    spec, seconds = _spec(auto), []
    for _ in range(repeats):
        began = time.perf_counter()
        _, lease = gpulease.lease_gpus(spec, 0, print)
        lease.release()
        seconds.append(time.perf_counter() - began)
    return seconds


def time_queue(directory: str, rounds: int) -> list[float]:
    from nbtrain.kernel.lifecycle import gpulease

    env = {**os.environ, "PYTHONPATH": ROOT}
    delays = []
    for _ in range(rounds):
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, directory], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        got: list[float] = []
        waiting = threading.Event()

        def wait(got=got, waiting=waiting) -> None:
            _, lease = gpulease.lease_gpus(_spec(True), None, lambda _text: waiting.set())
            got.append(time.monotonic())
            lease.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        waiting.wait(30)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        released = float(holder.stdout.readline())
        waiter.join(30)
        holder.wait()
        delays.append(got[0] - released)
    return delays


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{statistics.median(ordered) * 1000:8.2f} {ordered[int(len(ordered) * 0.95) - 1] * 1000:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="nbtrain-leases-bench-")
    os.chmod(directory, 0o1777)
    os.environ["NBTRAIN_LEASE_DIR"] = directory
    try:
        _stand_in_nvml()
        print(f"what                                          median ms   p95 ms   ({args.repeats} takes, "
              f"{args.rounds} queue rounds)")
        print(f"take + release, GPUs by number (2)            {_ms(time_take(False, args.repeats))}")
        print(f"take + release, --gpus auto (2 of 4, NVML)    {_ms(time_take(True, args.repeats))}")
        print(f"release -> the queued cell's lease            {_ms(time_queue(directory, args.rounds))}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
