"""A worker lost mid-run: torchft's per-step fault tolerance (nbtrain's replica groups) against torch elastic's restart.

    python benchmarks/fault_tolerance.py [--rounds 3] [--width 512] [--steps 400] [--kill-at 50] [--every 10]

Three workers (CPU, gloo, one intra-op thread each) train the same MLP (benchmarks/ft_worker.py), twice per round:

* **torchft**: three replica groups of one rank through :mod:`nbtrain.rank.train.ft` (nbtrain's signed recovery
  transport, a Lighthouse from :mod:`nbtrain.kernel.lifecycle.lighthouse` on 127.0.0.1, ``min_replicas`` 2). Worker 2
  is SIGKILLed once it has committed step ``--kill-at``, and a replacement with its name is started at once.
* **torch elastic**: ``torchrun --standalone --nproc-per-node 3 --max-restarts 2``, rank 0 checkpointing every
  ``--every`` steps (a file write, as a training script does). Worker 2 is SIGKILLed at the same step; the agent
  restarts all three, which resume from the last checkpoint. One restart is what the kill needs; the second is
  there because a restarted gloo worker once aborted on its own on a loaded 2-CPU machine ("terminate called
  without an active exception", SIGABRT, 5 s after the restart), which with one restart ended the baseline.
  The pause and the steps redone are read from the first restart.

Measured from the workers' own per-step timestamps, against the moment of the kill:

* **the others' pause**: from the kill to the next step a surviving worker keeps (torchft: the next committed
  step of worker 0; elastic: worker 0's first step of the restarted group) — goal: ≤ one step time + 2 s;
* **the lost worker back**: from the kill to the replacement's first kept step (torchft: it has copied a healthy
  peer's state; elastic: the whole group restarted);
* **steps redone**: steps the survivors take again (elastic: since the checkpoint; torchft: none — the lost
  worker's batch of that step is dropped, the others' global batch is smaller until it is back).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from nbtrain.kernel.lifecycle.lighthouse import Lighthouse

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "ft_worker.py")
GROUPS = "012"  # the replica groups' names; "2" is the one lost


def lines(out: Path, worker: str) -> list[tuple[int, float]]:
    try:
        return [(int(s), float(t)) for s, t in (line.split() for line in (out / f"{worker}.steps").read_text().splitlines())]
    except FileNotFoundError:
        return []


def wait_for_step(out: Path, worker: str, step: int, alive) -> None:
    deadline = time.monotonic() + 300
    while not any(s >= step for s, _ in lines(out, worker)):
        if time.monotonic() > deadline or not alive():
            raise SystemExit(f"worker {worker} never reached step {step}; see {out}")
        time.sleep(0.005)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)}


def start_ft(replica: str, lighthouse: Lighthouse, secret: str, args, out: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, WORKER, "ft"], stdin=subprocess.PIPE, text=True, env=env(),
                               stdout=subprocess.DEVNULL, stderr=open(out / f"{replica}.log", "ab"))
    assert process.stdin is not None
    process.stdin.write(json.dumps({"lighthouse": lighthouse.address, "replica": replica, "secret": secret,
                                    "steps": args.steps, "out": str(out), "width": args.width,
                                    "groups": len(GROUPS)}) + "\n")
    process.stdin.close()
    return process


def torchft_round(args, out: Path) -> dict[str, float]:
    lighthouse, secret = Lighthouse("127.0.0.1", min_replicas=2), secrets.token_hex(32)
    workers = {r: start_ft(r, lighthouse, secret, args, out) for r in GROUPS}
    try:
        wait_for_step(out, "2", args.kill_at, lambda: all(p.poll() is None for p in workers.values()))
        workers["2"].send_signal(signal.SIGKILL)
        killed = time.time()
        workers["2"].wait()
        workers["2"] = start_ft("2", lighthouse, secret, args, out)
        for name, process in workers.items():
            if process.wait(timeout=600) != 0:
                raise SystemExit(f"torchft worker {name} failed; its log ends:\n{_tail(out / (name + '.log'))}")
    finally:
        for process in workers.values():
            process.kill()
        lighthouse.close()
    survivor, back = lines(out, "0"), lines(out, "2")
    return {"step": _step_time(survivor, killed), "pause": min(t for _, t in survivor if t > killed) - killed,
            "back": min(t for _, t in back if t > killed) - killed, "redone": 0}


def elastic_round(args, out: Path) -> dict[str, float]:
    settings = json.dumps({"steps": args.steps, "out": str(out), "width": args.width, "every": args.every})
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                              "--max-restarts", "2", WORKER, "elastic"], env={**env(), "NBTRAIN_BENCH_SETTINGS": settings,
                                                                              "OMP_NUM_THREADS": "1"},
                             stdout=subprocess.DEVNULL, stderr=open(out / "torchrun.log", "ab"))
    try:
        wait_for_step(out, "2", args.kill_at, lambda: agent.poll() is None)
        rank2 = next(p for p in psutil.Process(agent.pid).children(recursive=True) if p.environ().get("RANK") == "2")
        rank2.kill()
        killed = time.time()
        if agent.wait(timeout=600) != 0:
            raise SystemExit(f"torchrun failed; its log, {out / 'torchrun.log'}, ends:\n{_tail(out / 'torchrun.log')}")
    finally:
        agent.kill()
    survivor = lines(out, "0")
    restart = next(i for i in range(1, len(survivor)) if survivor[i][0] <= survivor[i - 1][0])
    back = lines(out, "2")
    return {"step": _step_time(survivor, killed), "pause": survivor[restart][1] - killed,
            "back": min(t for s, t in back if t > killed and s <= survivor[restart][0]) - killed,
            "redone": survivor[restart - 1][0] + 1 - survivor[restart][0]}


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]


def _step_time(steps: list[tuple[int, float]], before: float) -> float:
    times = [t for _, t in steps if t < before]
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--kill-at", type=int, default=50)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"torchft": [], "elastic": []}
    for _ in range(args.rounds):
        for name, measure in (("torchft", torchft_round), ("elastic", elastic_round)):
            out = Path(tempfile.mkdtemp(prefix=f"nbtrain-ft-bench-{name}-"))
            results[name].append(measure(args, out))
            shutil.rmtree(out, ignore_errors=True)
    med = {name: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]} for name, rounds in results.items()}
    ft, el = med["torchft"], med["elastic"]
    print(f"3 workers, MLP width {args.width}, worker 2 SIGKILLed at step {args.kill_at} of {args.steps}; "
          f"elastic checkpoints every {args.every} steps; median of {args.rounds} round(s)")
    print(f"{'':34}{'torchft (nbtrain)':>20}{'torch elastic':>16}{'ratio':>8}")
    print(f"{'step time (s)':34}{ft['step']:>20.3f}{el['step']:>16.3f}")
    print(f"{'the others pause (s)':34}{ft['pause']:>20.2f}{el['pause']:>16.2f}{ft['pause'] / el['pause']:>7.2f}×")
    print(f"{'the lost worker back (s)':34}{ft['back']:>20.2f}{el['back']:>16.2f}{ft['back'] / el['back']:>7.2f}×")
    print(f"{'steps redone':34}{ft['redone']:>20.0f}{el['redone']:>16.0f}")
    goal = ft["step"] + 2.0
    print(f"goal: the others' pause ≤ one step + 2 s = {goal:.2f} s: {'met' if ft['pause'] <= goal else 'NOT met'}")


if __name__ == "__main__":
    main()
