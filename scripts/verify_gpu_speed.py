"""Check what nbtrain says of a run's speed on a GPU against a hand computation; one line per check, non-zero exit
on failure.

    python scripts/verify_gpu_speed.py           # on a machine with NVIDIA GPUs: one rank per GPU, NCCL
    python scripts/verify_gpu_speed.py --cpu     # the same path on 2 CPU ranks, tiny sizes (no peak: no MFU)

Checks, on ResNet-50 (torchvision, 224×224, bf16 autocast, channels_last, synthetic data made on the GPU):

1. **FLOPs per step** as nbtrain counts them (``FlopCounterMode``, forward + backward, first step) against the hand
   count: ResNet-50's forward is 4.09 GMAC per image, 8.18 GFLOP, and a training step about three forwards —
   within 5 %;
2. **achieved FLOP/s** from the summary's fact against samples/s × FLOPs per image, by hand — within 5 %;
3. **MFU** against achieved / the GPU's dense bf16 peak from nbtrain's table (:mod:`nbtrain.gpu.peaks`), or "peak
   unknown" for a GPU not in it;
4. **a compiled model's FLOPs**, counted on a meta-device copy of it (the real step runs compiled), against the
   eager count of check 1 — within 1 %;
5. **the step split** sums to 100 % and, under DDP, holds *comm* (the all-reduce after the last gradient);
6. **the per-cell cost** of the dashboard: ``benchmarks/cell_overhead.py`` (a warm trivial cell with it against
   ``--no-dashboard``), goal ≤ 1.2×.

GPM's SM activity under load and idle is checked by ``scripts/verify_gpu_health.py``. Record the command and its
output in docs/gpu-verification.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.request.config import LaunchRequest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESNET50_FORWARD_FLOPS = 2 * 4.09e9  # per 224×224 image: 4.09 GMAC (torchvision's model card), 2 FLOPs each
TRAINING_PER_FORWARD = 3.0  # backward ≈ two forwards (the input's gradient and the weights')
CLOSE = 0.05
CLOSE_ON_CPU = 0.5  # --cpu checks the path, not the hardware: on 2 shared cores the cell's own clock and nbtrain's
# step timing drift apart by tens of percent under load, so only the order of magnitude must agree there

CELL = """
import torch, torchvision, nbtrain
net = torchvision.models.{model}()
{compile_line}
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
x = torch.randn({batch}, 3, {image}, {image}, device=device)
y = torch.randint(0, 1000, ({batch},), device=device)
import time
def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()
for step in range({steps}):
    if step == {warmup}:  # timed by hand from here: samples/s over every rank
        sync()
        started = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    nbtrain.backward(loss)
    opt.step()
    opt.zero_grad(set_to_none=True)
    nbtrain.log(loss=loss)
sync()
samples_per_s = ({steps} - {warmup}) * {batch} * world_size / (time.perf_counter() - started)
"""


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f" — {detail}" if detail else ""), flush=True)
    return ok


def near(ours: float, theirs: float, tolerance: float = CLOSE) -> bool:
    return theirs > 0 and abs(ours / theirs - 1.0) <= tolerance


def train(cpu: bool, compiled: bool = False) -> tuple[dict, int, int]:
    """ResNet-50 (ResNet-18 at 32×32 on the CPU) for a while, nbtrain's defaults (bf16 autocast and channels_last on
    a GPU); rank 0's step-meter fact with the samples/s the cell timed by hand, the batch, the ranks. ``compiled``:
    a few steps of the model as the cell compiled it (Dynamo's eager backend: the count, not the kernels)."""
    from nbtrain.gpu import nvml

    ranks = 2 if cpu else max(1, len(nvml.visible_gpus()))
    sizes: dict[str, int | str] = (dict(model="resnet18", batch=2, image=32, steps=12, warmup=2) if cpu else
                                   dict(model="resnet50", batch=128, image=224, steps=80, warmup=10))
    sizes["compile_line"] = 'net = torch.compile(net, backend="eager")' if compiled else ""
    if compiled:
        sizes.update(steps=3, warmup=1)
    manager = PoolManager()
    namespace: dict = {}
    try:
        result = run_source(CELL.format(**sizes), LaunchRequest(nprocs=ranks, cpu=cpu), namespace, manager=manager)
    finally:
        manager.shutdown()
    fact = next(f for f in result.setup[0] if "precision" in f)
    return {**fact, "samples_per_s": namespace["samples_per_s"]}, int(sizes["batch"]), ranks


def flop_checks(fact: dict, batch: int, ranks: int, cpu: bool) -> list[bool]:
    per_image = fact["flops_per_step"] / batch
    results = []
    if not cpu:
        by_hand = RESNET50_FORWARD_FLOPS * TRAINING_PER_FORWARD
        results.append(check("FLOPs per step against the hand count", near(per_image, by_hand),
                             f"{per_image / 1e9:.1f} GFLOP per image counted, {by_hand / 1e9:.1f} by hand"))
    achieved = fact["samples_per_s"] / ranks * per_image / 1e12  # per GPU, as the fact's tflops is
    results.append(check("achieved FLOP/s against samples/s (timed by hand) × FLOPs per image",
                         near(fact["tflops"], achieved, CLOSE_ON_CPU if cpu else CLOSE),
                         f"{fact['tflops']:.3f} TFLOP/s per rank said, {achieved:.3f} by hand "
                         f"({fact['samples_per_s']:.0f} samples/s over {ranks} rank(s))"))
    peak = fact.get("peak_tflops")
    if peak:
        results.append(check("MFU is achieved over the dense peak", abs(fact["mfu"] - 100 * fact["tflops"] / peak) < 0.5,
                             f"MFU {fact['mfu']:.1f} % of {fact['precision']}'s {peak:.0f} TFLOP/s"))
    else:
        results.append(check("no MFU without a known peak", "mfu" not in fact,
                             "the CPU has no peak" if cpu else "this GPU is not in nbtrain's peak table"))
    return results


def compiled_check(eager: dict, cpu: bool) -> bool:
    """The FLOPs of a compiled model, counted on a meta-device copy, against the same model's count in eager mode."""
    compiled, _, _ = train(cpu, compiled=True)
    counted = compiled.get("flops_per_step")
    return check("a compiled model's FLOPs (counted on a meta-device copy) against the eager count",
                 counted is not None and near(counted, eager["flops_per_step"], 0.01),
                 f"{(counted or 0) / 1e9:.2f} GFLOP per step compiled, {eager['flops_per_step'] / 1e9:.2f} eager"
                 + (f" ({compiled['flops_uncounted']})" if compiled.get("flops_uncounted") else ""))


def split_check(fact: dict, ranks: int) -> bool:
    split = fact.get("split", {})
    ddp = ranks > 1 or "comm" in split
    return check("the step split sums to 100 % and holds comm under DDP",
                 abs(sum(split.values()) - 100.0) < 0.1 and (not ddp or "comm" in split),
                 " · ".join(f"{share:.0f} % {phase}" for phase, share in split.items()))


def cell_cost(cpu: bool) -> bool:
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "cell_overhead.py"), "--rounds", "6",
               *(["--cpu"] if cpu else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=os.path.join(ROOT, "benchmarks")).stdout
    found = re.search(r"with the dashboard ([0-9.]+) s  --no-dashboard ([0-9.]+) s  ratio ([0-9.]+)x", out)
    if found is None:
        return check("the dashboard's per-cell cost", False, f"the benchmark printed: {out.strip()[-300:]}")
    ratio = float(found.group(3))
    return check("the dashboard's per-cell cost", ratio <= 1.2,
                 f"{found.group(1)} s with it, {found.group(2)} s without: {ratio:.2f}x (goal <= 1.2x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="CPU ranks and tiny sizes: the path, not the numbers")
    args = parser.parse_args()
    fact, batch, ranks = train(args.cpu)
    results = [*flop_checks(fact, batch, ranks, args.cpu), compiled_check(fact, args.cpu), split_check(fact, ranks),
               cell_cost(args.cpu)]
    print(f"{sum(results)} of {len(results)} checks passed")
    if args.cpu:  # the path, not the numbers: two shared cores time nothing the checks could judge
        return 0
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
