"""Cost of logging the loss every step: nothing vs ``nbtrain.log(loss=loss)`` vs ``loss.item()`` vs reduced.

One %%distributed run (2 ranks; gloo/CPU, or NCCL with --gpu) times the same DDP training loop four ways,
interleaved in blocks so that load changes on the machine hit every variant alike:

* ``none``: no logging;
* ``nbtrain.log``: ``nbtrain.log(loss=loss)`` — the tensor is buffered, no host sync;
* ``item``: ``losses.append(loss.item())`` — the naive way, a host sync per step on GPU;
* ``log reduce``: ``nbtrain.log(loss=loss, reduce="mean")`` — one asynchronous all-reduce per call.

Printed: steps/s of each (median over blocks) and the ratio to ``none``. On CPU ``item()`` costs little
(there is no device to wait for); the GPU numbers are what this is for.

    python benchmarks/log_overhead.py [--blocks 5] [--steps 100] [--gpu]
"""

from __future__ import annotations

import argparse
import os
import time

CELL = """
import statistics, time, torch, nbtrain
import torch.nn.functional as F
torch.manual_seed(rank)
WIDTH, BATCH = 512, 64
net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
x = torch.randn(BATCH, WIDTH, device=device)
y = torch.randint(0, 10, (BATCH,), device=device)
losses = []
def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()
def block(kind, steps):
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        if kind == "nbtrain.log":
            nbtrain.log(loss=loss)
        elif kind == "item":
            losses.append(loss.item())
        elif kind == "log reduce":
            nbtrain.log(loss_mean=loss, reduce="mean")
    sync()
    return steps / (time.perf_counter() - started)
KINDS = ["none", "nbtrain.log", "item", "log reduce"]
block("none", 20)
rates = {k: [] for k in KINDS}
for b in range(BLOCKS):
    for kind in KINDS[b % 4:] + KINDS[:b % 4]:
        rates[kind].append(block(kind, STEPS))
medians = {k: statistics.median(v) for k, v in rates.items()}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    from nbtrain.launch.api import run_source
    from nbtrain.launch.config import LaunchRequest

    namespace: dict = {"BLOCKS": args.blocks, "STEPS": args.steps}
    run_source(CELL, LaunchRequest(nprocs=2, cpu=not args.gpu, keep_alive=0, out="medians"), namespace,
               write=lambda stream, text: None)
    medians = namespace["medians"]
    base = medians["none"]
    print(f"{'variant':<12} {'steps/s':>9} {'vs none':>8}   ({'GPU' if args.gpu else 'CPU'}, 2 ranks, "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)")
    for kind, rate in medians.items():
        print(f"{kind:<12} {rate:9.1f} {rate / base:8.3f}x")


if __name__ == "__main__":
    main()
