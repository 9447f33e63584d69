"""Check nbtrain's GPU paths on a machine with an NVIDIA GPU; print one line per check and exit non-zero on failure.

    python scripts/verify_gpu.py

Checks, through a real IPython shell with ``%load_ext nbtrain``:

1. NVML sees the GPUs (name, memory) without initialising CUDA in this process;
2. ``%%distributed 1`` defaults to NCCL on ``cuda:0`` and an all-reduce works;
3. a model trained on the GPU comes back on the CPU, with the note that says so;
4. the notebook process never initialised CUDA;
5. after ``%distributed_shutdown`` no GPU memory is held by any rank (NVML's process list).

Record the command and its output in docs/gpu-verification.md.
"""

from __future__ import annotations

import os
import sys
import time

from IPython.core.interactiveshell import InteractiveShell


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f" — {detail}" if detail else ""), flush=True)
    return ok


def main() -> int:
    from nbtrain.gpu import nvml

    results = []
    gpus = nvml.visible_gpus()
    results.append(check("NVML lists the GPUs", bool(gpus), ", ".join(f"{g.index}: {g.name}, {g.memory_total / 2**30:.0f} GiB" for g in gpus)
                         or str(nvml.unavailable_reason())))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtrain")
    shell.run_cell("import torch\nfrom torch import nn\nX = torch.randn(4096, 32)\nY = X.sum(1, keepdim=True)")
    started = time.monotonic()
    result = shell.run_cell(
        "%%distributed 1\n"
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "backend, where = dist.get_backend(), str(device)\n"
        "t = torch.ones(1, device=device); dist.all_reduce(t); reduced = t.item()\n"
        "net = DDP(nn.Linear(32, 1).to(device))\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.01)\n"
        "x, y = X.to(device), Y.to(device)\n"
        "for _ in range(50):\n"
        "    loss = (net(x) - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
        "peak_mib = torch.cuda.max_memory_allocated() / 2**20\n")
    ns = shell.user_ns
    results.append(check("%%distributed 1 ran", result.success, f"{time.monotonic() - started:.1f} s cold"))
    if result.success:
        results.append(check("NCCL on cuda:0", ns["backend"] == "nccl" and ns["where"] == "cuda:0", f"{ns['backend']} on {ns['where']}"))
        results.append(check("all_reduce on NCCL", ns["reduced"] == 1.0))
        weight = ns["net"].weight
        results.append(check("model came back on the CPU", type(ns["net"]).__name__ == "Linear" and weight.device.type == "cpu",
                             f"{type(ns['net']).__name__} on {weight.device}, peak {ns['peak_mib']:.0f} MiB in the rank"))
    import torch

    results.append(check("kernel never initialised CUDA", not torch.cuda.is_initialized()))
    pids = list(shell._nbtrain_magics.pools.pool.pids()) if shell._nbtrain_magics.pools.pool else []
    shell.run_line_magic("distributed_shutdown", "")
    time.sleep(1.0)
    lib = nvml.library()
    held = []
    for g in nvml.all_gpus():
        handle = lib.nvmlDeviceGetHandleByIndex(g.index)
        held += [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids]
    results.append(check("no GPU memory held after shutdown", not held, f"rank pids {pids}, still on a GPU: {held}"))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
