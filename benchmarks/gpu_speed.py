"""Speed settings on GPUs: fp32 / bf16 / bf16+channels_last / bf16+channels_last+compile, nbtrain vs torchrun.

Two workloads on synthetic data made on the GPU (so the input pipeline is not what is measured): ResNet-50
(torchvision, 224×224, batch 128 per GPU) and a small transformer language model (6 layers, width 512, 256
tokens, batch 32 per GPU). For each setting, the same training step runs twice, alternately, ``--rounds``
times: as a ``%%distributed`` cell through ``nbtrain.prepare()`` with the setting's options (``--amp``,
``--channels-last``, ``--compile``), and as a plain DDP script under bare torchrun doing the same by hand
(autocast, ``model.to(memory_format=torch.channels_last)``, ``torch.compile(ddp_model)``). Each times its
own loop after warm-up steps (start-up and compilation are not counted; nbtrain's compile time is printed).
The nbtrain cell also alternates blocks with and without ``nbtrain.log(loss=loss)`` every step: the
difference is logging's cost. Printed: samples/s (all ranks), the ratio to torchrun, and logging's cost.

Goals on an H100/H200: bf16 with nbtrain's defaults (channels_last for ResNet-50) ≥ 2× fp32; every nbtrain
figure ≥ 0.98× torchrun with the same settings; logging every step ≤ 1 %.

    python benchmarks/gpu_speed.py [--ranks N] [--rounds 3] [--steps 30] [--only resnet50 transformer]
    python benchmarks/gpu_speed.py --cpu      # a smoke run on CPU ranks (gloo), tiny sizes, aot_eager
    python benchmarks/gpu_speed.py --dry-run  # build and check every cell and script; run nothing

This process never initialises CUDA: GPUs are counted through NVML, as ``%%distributed`` counts them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

import torchrun_script
from torchrun_script import PREAMBLE

SETTINGS = {  # name: (amp, channels_last, compile)
    "fp32": ("off", False, False),
    "bf16": ("bf16", False, False),
    "bf16+channels_last": ("bf16", True, False),
    "bf16+channels_last+compile": ("bf16", True, True),
}


@dataclass(frozen=True)
class Sizes:
    image: int = 224
    image_batch: int = 128
    width: int = 512
    layers: int = 6
    tokens: int = 256
    text_batch: int = 32
    vocab: int = 8192
    steps: int = 30
    blocks: int = 4
    warmup: int = 10


CPU_SIZES = Sizes(image=32, image_batch=2, width=32, layers=1, tokens=8, text_batch=2, vocab=64, steps=2, blocks=2,
                  warmup=1)

WORKLOADS = {
    "resnet50": """
import torchvision
net = torchvision.models.resnet50()
x = torch.randn({image_batch}, 3, {image}, {image}, device=device)
y = torch.randint(0, 1000, ({image_batch},), device=device)
SAMPLES = {image_batch}
def loss_of(out):
    return F.cross_entropy(out, y)
""",
    "transformer": """
class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding({vocab}, {width})
        layer = torch.nn.TransformerEncoderLayer({width}, 8, 4 * {width}, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, {layers}, enable_nested_tensor=False)
        self.head = torch.nn.Linear({width}, {vocab})
    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))
net = LM()
x = torch.randint(0, {vocab}, ({text_batch}, {tokens}), device=device)
y = torch.randint(0, {vocab}, ({text_batch}, {tokens}), device=device)
SAMPLES = {text_batch}
def loss_of(out):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
""",
}

COMMON = """
import json, statistics, time, torch
import torch.nn.functional as F
torch.manual_seed(0)
STEPS, BLOCKS, WARMUP = {steps}, {blocks}, {warmup}
def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()
"""

NBTRAIN_CELL = """
import nbtrain
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
model, opt = nbtrain.prepare(net, opt)
def step(log):
    loss = loss_of(model(x))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if log:
        nbtrain.log(loss=loss)
for _ in range(WARMUP):
    step(True)
times = {{True: [], False: []}}
for block in range(BLOCKS):
    for log in ((True, False) if block % 2 == 0 else (False, True)):
        sync(); started = time.perf_counter()
        for _ in range(STEPS):
            step(log)
        sync(); times[log].append(time.perf_counter() - started)
rates = [SAMPLES * world_size * STEPS / statistics.median(times[log]) for log in (True, False)]
"""

TORCHRUN_SCRIPT = PREAMBLE + """
import contextlib
{body}
net = net.to(device)
if {channels_last} and x.dim() == 4:  # what nbtrain does: conv models and their image batches
    net = net.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view={channels_last} or {compile})
if {compile}:
    model = torch.compile(model, {compile_how})
amp = torch.autocast(device.type, dtype=torch.bfloat16) if "{amp}" == "bf16" else contextlib.nullcontext()
def step():
    with amp:
        loss = loss_of(model(x))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(WARMUP):
    step()
times = []
for block in range(BLOCKS):
    sync(); started = time.perf_counter()
    for _ in range(STEPS):
        step()
    sync(); times.append(time.perf_counter() - started)
if rank == 0:
    print("RESULT " + json.dumps(SAMPLES * world_size * STEPS / statistics.median(times)))
dist.destroy_process_group()
"""


def sources(workload: str, setting: str, sizes: Sizes, cpu: bool) -> tuple[str, str, dict]:
    """(nbtrain cell, torchrun script, LaunchRequest options) for one workload and setting."""
    amp, channels_last, compiled = SETTINGS[setting]
    body = (COMMON + WORKLOADS[workload]).format(**vars(sizes))
    compile_choice = ("aot_eager" if cpu else "default") if compiled else None
    compile_how = "backend='aot_eager'" if cpu else "mode='default'"
    script = TORCHRUN_SCRIPT.format(backend="gloo" if cpu else "nccl", body=body, channels_last=channels_last,
                                    compile=compiled, compile_how=compile_how, amp=amp)
    options = {"amp": amp, "channels_last": channels_last, "compile": compile_choice, "keep_alive": 0, "cpu": cpu}
    return body + NBTRAIN_CELL.format(), script, options


def run_nbtrain(cell: str, options: dict, ranks: int) -> tuple[float, float, list]:
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    namespace: dict = {}
    result = run_source(cell, LaunchRequest(nprocs=ranks, **options), namespace, write=lambda stream, text: None)
    logged, unlogged = namespace["rates"]
    return logged, unlogged, result.setup.get(0, [])


def run_torchrun(script: str, ranks: int, cpu: bool) -> float:
    return torchrun_script.run(script, ranks, timeout=1200)


def measure(workload: str, setting: str, sizes: Sizes, ranks: int, rounds: int, cpu: bool) -> dict:
    cell, script, options = sources(workload, setting, sizes, cpu)
    ours: list[float] = []
    theirs: list[float] = []
    unlogged: list[float] = []
    setup: list = []
    for _ in range(rounds):  # alternate, so load changes hit both alike
        theirs.append(run_torchrun(script, ranks, cpu))
        logged, plain, setup = run_nbtrain(cell, options, ranks)
        ours.append(logged)
        unlogged.append(plain)
    compile_s = next((m.get("compile_s") for m in setup if m.get("compile_s") is not None), None)
    nb, tr, nolog = statistics.median(ours), statistics.median(theirs), statistics.median(unlogged)
    return {"workload": workload, "setting": setting, "nbtrain": nb, "torchrun": tr, "ratio": nb / tr,
            "log_cost": 1 - nb / nolog, "compile_s": compile_s}


def table(rows: list[dict]) -> str:
    lines = [f"{'workload':<12}{'setting':<28}{'nbtrain':>10}{'torchrun':>10}{'ratio':>8}{'log cost':>10}{'vs fp32':>9}"
             f"{'compile':>10}"]
    fp32 = {r["workload"]: r["nbtrain"] for r in rows if r["setting"] == "fp32"}
    for r in rows:
        vs = f"{r['nbtrain'] / fp32[r['workload']]:.2f}x" if r["workload"] in fp32 else "-"
        compiled = f"{r['compile_s']:.1f} s" if r["compile_s"] is not None else "-"
        lines.append(f"{r['workload']:<12}{r['setting']:<28}{r['nbtrain']:>10.1f}{r['torchrun']:>10.1f}"
                     f"{r['ratio']:>7.3f}x{100 * r['log_cost']:>9.2f}%{vs:>9}{compiled:>10}")
    return "\n".join(lines) + "\n(samples/s over all ranks, medians; log cost: nbtrain.log every step vs none, same run)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, help="ranks, one per GPU (default: every GPU there is; --cpu: 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, help="timed steps per block (default 30; --cpu: 2)")
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--cpu", action="store_true", help="a smoke run on CPU ranks (gloo) with tiny sizes")
    parser.add_argument("--dry-run", action="store_true", help="build and check every cell and script; run nothing")
    args = parser.parse_args(argv)
    sizes = CPU_SIZES if args.cpu or args.dry_run else Sizes()
    if args.steps:
        sizes = Sizes(**{**vars(sizes), "steps": args.steps})
    if args.dry_run:
        for workload in args.only:
            for setting in args.settings:
                cell, script, options = sources(workload, setting, sizes, cpu=True)
                compile(cell, f"<{workload} {setting} nbtrain>", "exec")
                compile(script, f"<{workload} {setting} torchrun>", "exec")
                print(f"{workload:<12}{setting:<28}%%distributed {options}")
        return 0
    if not args.cpu:
        from nbtrain.gpu import nvml

        gpus = len(nvml.visible_gpus())
        if gpus == 0:
            parser.error(f"no usable GPU ({nvml.unavailable_reason() or 'CUDA_VISIBLE_DEVICES hides them all'}); "
                         "--cpu runs a smoke test on CPU ranks, --dry-run checks the scripts")
        if args.ranks and args.ranks > gpus:
            parser.error(f"--ranks {args.ranks}: only {gpus} GPUs can be used (NCCL needs one per rank)")
    ranks = args.ranks or (2 if args.cpu else gpus)
    rows = [measure(w, s, sizes, ranks, args.rounds, args.cpu) for w in args.only for s in args.settings]
    print(table(rows))
    print(f"({ranks} ranks, {'CPU smoke run, not a measurement' if args.cpu else 'GPUs'}, {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
