"""Per-step cost of nbtrain's training helpers and of logging, measured inside one run, interleaved.

One %%distributed run (2 ranks, or ``--ranks``; gloo/CPU, or NCCL with --gpu) times the same training step five ways,
in blocks whose order rotates, so that load changes on the machine hit every variant alike:

* ``plain DDP``: ``DistributedDataParallel`` + ``loss.backward()`` + a plain optimizer — no nbtrain;
* ``prepare``: the same model through ``nbtrain.prepare()`` + ``nbtrain.backward()``, no logging;
* ``+ log``: ``prepare`` + ``nbtrain.log(loss=loss)`` — the tensor is buffered, no host sync;
* ``+ item``: ``prepare`` + ``losses.append(loss.item())`` — the naive way, a host sync per step on GPU;
* ``+ log reduce``: ``prepare`` + ``nbtrain.log(loss=loss, reduce="mean")`` — one async all-reduce per call.

Printed: steps/s of each (median over blocks, and the range) and the ratio to ``plain DDP``; and the CPU
time rank 0's process spends per step (all its threads: the metrics thread's work counts), which a busy
machine disturbs much less than wall time — on a shared machine, read that column. This
isolates the per-step overhead of the helpers from process start-up (which the launcher comparison in
``training_overhead.py`` also sees). On CPU ``item()`` costs little (there is no device to wait for).

    python benchmarks/log_overhead.py [--blocks 15] [--steps 50] [--gpu] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import time

CELL = """
import copy, statistics, time, torch, nbtrain
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
WIDTH, BATCH = 512, 64
net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
twin = copy.deepcopy(net).to(device)
plain = DDP(twin, device_ids=[device.index] if device.type == "cuda" else None)
plain_opt = torch.optim.SGD(twin.parameters(), lr=0.01)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
x = torch.randn(BATCH, WIDTH, device=device)
y = torch.randint(0, 10, (BATCH,), device=device)
losses = []
def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()
def block(kind, steps):
    sync()
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(steps):
        if kind == "plain DDP":
            loss = F.cross_entropy(plain(x), y)
            loss.backward()
            plain_opt.step(); plain_opt.zero_grad()
            continue
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        if kind == "+ log":
            nbtrain.log(loss=loss)
        elif kind == "+ item":
            losses.append(loss.item())
        elif kind == "+ log reduce":
            nbtrain.log(loss_mean=loss, reduce="mean")
    sync()
    cpu_ms[kind].append(1000 * (time.process_time() - cpu_started) / steps)
    return steps / (time.perf_counter() - started)
KINDS = ["plain DDP", "prepare", "+ log", "+ item", "+ log reduce"]
cpu_ms = {k: [] for k in KINDS}
block("plain DDP", 10); block("prepare", 10)
cpu_ms = {k: [] for k in KINDS}
rates = {k: [] for k in KINDS}
for b in range(BLOCKS):
    for kind in KINDS[b % len(KINDS):] + KINDS[:b % len(KINDS)]:
        rates[kind].append(block(kind, STEPS))
summary = {k: (statistics.median(v), min(v), max(v), statistics.median(cpu_ms[k])) for k, v in rates.items()}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--gpu", action="store_true", help="NCCL, a GPU per rank, instead of gloo on CPU (fp32)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (with --gpu: at most the GPUs there are)")
    args = parser.parse_args()
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    namespace: dict = {"BLOCKS": args.blocks, "STEPS": args.steps}
    run_source(CELL, LaunchRequest(nprocs=args.ranks, cpu=not args.gpu, keep_alive=0, amp="off", out="summary"), namespace,
               write=lambda stream, text: None)
    summary = namespace["summary"]
    base = summary["plain DDP"][0]
    base_cpu = summary["plain DDP"][3]
    print(f"{'variant':<13} {'steps/s':>8} {'vs plain':>9}  {'range over blocks':>17}  {'CPU ms/step':>11} {'vs plain':>9}"
          f"   ({'GPU' if args.gpu else 'CPU'}, {args.ranks} ranks, {args.blocks} blocks of {args.steps} steps, "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)")
    for kind, (rate, low, high, cpu) in summary.items():
        print(f"{kind:<13} {rate:8.1f} {rate / base:8.3f}x  {low:7.1f} – {high:6.1f}  {cpu:11.2f} {cpu / base_cpu:8.3f}x")


if __name__ == "__main__":
    main()
