"""--shard against DDP and against the same FSDP2 loop under bare torchrun: memory per rank and steps/s.

A transformer of ``--layers`` blocks of width ``--width`` (about 100M parameters by default) trains with AdamW
on ``--ranks`` ranks (gloo on the CPU, or NCCL with ``--gpu``), in three ways, alternately for ``--rounds``:

* a ``%%distributed`` cell, DDP (``prepare()`` without ``--shard``);
* the same cell with ``--shard`` (FSDP2 through ``prepare()``);
* the same FSDP2 loop written by hand (``fully_shard`` per block, then the root) under bare torchrun.

Each rank measures, after its timed steps: its *training state* — the bytes of the parameters, gradients and
optimizer state it holds (a DTensor's local shard only) — and its resident memory's growth over the run
(peak RSS, or peak CUDA memory on a GPU). Goals: ``--shard``'s training state ≤ 1/N of DDP's + 10 %; its
steps/s ≥ 0.98× the hand-written FSDP2 loop under torchrun (median of the rounds).

    python benchmarks/sharded_memory.py [--ranks 2] [--rounds 3] [--steps 5] [--layers 8] [--width 1024] [--gpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torchrun_script
from torchrun_script import PREAMBLE

MODEL = """
import time, resource, torch
import torch.nn.functional as F
from torch import nn

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 8, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))

class Net(nn.Module):
    def __init__(self, width, layers):
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, 16)
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

WIDTH, LAYERS, STEPS = {width}, {layers}, {steps}
torch.manual_seed(0)
x = torch.randn(4, 64, WIDTH, device=device)
y = torch.randint(0, 16, (4, 64), device=device)
def peak():
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start_peak = peak()
"""

# Timed the same way under both launchers: a warm-up step, then STEPS steps; the training state and the growth
# of the peak memory afterwards.
LOOP = """
def local_bytes(tensor):
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()
for step in range(STEPS + 1):
    if step == 1:
        started = time.perf_counter()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=False)
if device.type == "cuda":
    torch.cuda.synchronize()
steps_per_s = STEPS / (time.perf_counter() - started)
state = sum(local_bytes(p) * 2 for p in model.parameters())  # parameters and their gradients
state += sum(local_bytes(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
grown = peak() - start_peak
"""

NBTRAIN_CELL = MODEL + """
import nbtrain
model = Net(WIDTH, LAYERS)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt = nbtrain.prepare(model, opt)
""" + LOOP.replace("loss.backward()", "nbtrain.backward(loss)") + """
everyone = [None] * world_size
torch.distributed.all_gather_object(everyone, (state, grown))
"""

TORCHRUN_SCRIPT = PREAMBLE + MODEL + """
from torch.distributed.fsdp import fully_shard
model = Net(WIDTH, LAYERS).to(device)
for block in model.layers:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
""" + LOOP + """
everyone = [None] * world_size
dist.all_gather_object(everyone, (state, grown))
if rank == 0:
    import json
    print("RESULT " + json.dumps([steps_per_s, everyone]), flush=True)
dist.destroy_process_group()
"""


def run_nbtrain(args, shard: bool) -> tuple[float, list]:
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    namespace: dict = {}
    cell = NBTRAIN_CELL.format(width=args.width, layers=args.layers, steps=args.steps)
    run_source(cell, LaunchRequest(nprocs=args.ranks, cpu=not args.gpu, keep_alive=0, amp="off", fresh=True,
                                   shard="full" if shard else None, out="steps_per_s,everyone"),
               namespace, write=lambda stream, text: None)
    return namespace["steps_per_s"], namespace["everyone"]


def run_torchrun(args) -> tuple[float, list]:
    script = TORCHRUN_SCRIPT.format(width=args.width, layers=args.layers, steps=args.steps,
                                    backend="nccl" if args.gpu else "gloo")
    steps_per_s, everyone = torchrun_script.run(script, args.ranks, timeout=900)
    return steps_per_s, everyone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--gpu", action="store_true", help="NCCL, a GPU per rank, instead of gloo on the CPU")
    args = parser.parse_args()
    params = args.layers * 12 * args.width ** 2 + 16 * args.width
    print(f"model: {args.layers} blocks of width {args.width}, about {params / 1e6:.0f}M parameters, AdamW, "
          f"{args.ranks} ranks, {args.steps} timed steps", flush=True)
    runs: dict[str, list] = {"ddp": [], "shard": [], "torchrun": []}
    for number in range(args.rounds):
        runs["ddp"].append(run_nbtrain(args, shard=False))
        runs["shard"].append(run_nbtrain(args, shard=True))
        runs["torchrun"].append(run_torchrun(args))
        print(f"round {number + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} steps/s" for k, v in runs.items()), flush=True)
    print(f"{'run':10} {'steps/s':>8} {'state/rank':>11} {'peak growth/rank':>17}")
    for name, results in runs.items():
        speed = statistics.median(r[0] for r in results)
        state = max(s for r in results for s, _ in r[1])
        grown = max(g for r in results for _, g in r[1])
        print(f"{name:10} {speed:8.2f} {state / 2**20:9.0f} MiB {grown / 2**20:15.0f} MiB")
    ddp_state = max(s for r in runs["ddp"] for s, _ in r[1])
    shard_state = max(s for r in runs["shard"] for s, _ in r[1])
    ratio = statistics.median(s[0] / t[0] for s, t in zip(runs["shard"], runs["torchrun"], strict=True))
    print(f"--shard training state per rank: {shard_state / ddp_state:.3f} of DDP's (goal ≤ {1 / args.ranks + 0.1:.2f}); "
          f"--shard steps/s {ratio:.3f}x the FSDP2 loop under torchrun (goal ≥ 0.98x) "
          f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
