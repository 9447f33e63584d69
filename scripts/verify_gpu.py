"""Check nbtrain's GPU paths on a machine with an NVIDIA GPU; print one line per check and exit non-zero on failure.

    python scripts/verify_gpu.py

Checks, through a real IPython shell with ``%load_ext nbtrain``:

1. NVML sees the GPUs (name, memory) without initialising CUDA in this process;
2. ``%%distributed 1`` defaults to NCCL on ``cuda:0`` and an all-reduce works;
3. a model trained on the GPU comes back on the CPU, with the note that says so;
4. the notebook process never initialised CUDA;
5. memory a cell freed is given back to the driver before the cell returns (the GPU's memory.used right
   after a cell that allocated and deleted 4 GiB, against the level before it);
6. after ``%distributed_shutdown`` no GPU memory is held by any rank: NVML's process list, *and* the GPU's
   memory.used back at the baseline read before the ranks started — in VMs and some containers the driver
   lists no processes at all, so the list alone would pass however much was still held;
7. ``nbtrain.prepare`` on a GPU with its defaults: a convolutional model runs under bf16 autocast (fp16
   where the GPU has no bf16) in channels_last, and its output comes back in float32;
8. the dashboard chart's load panels read the GPUs: titles "GPU utilisation %" and "GPU memory %", a
   line per GPU, numbers (not NaN) from NVML;
9. the ranks were forked from the kernel's zygote, which stays CUDA-clean on a GPU machine (no driver library
   mapped, no context on any GPU) while the forked rank initialised CUDA on its own device; the first
   all-reduce's latency is printed (NCCL's communicator is built at start, ``init_process_group(device_id=…)``);
10. in a fresh process with the zygote's imports, neither torch nor the driver is initialised (the driver library
   may be mapped), and the zygote's check before a fork refuses once CUDA is initialised through torch or
   through the driver's ``cuInit`` directly, as CuPy and JAX do;
11. ``%%distributed 2 --ft`` on the GPU: rank 1 is SIGKILLed at step 10, a new rank 1 copies rank 0's state, and
   both end with the same weights.

Record the command and its output in docs/gpu-verification.md.
"""

from __future__ import annotations

import os
import sys
import time

from IPython.core.interactiveshell import InteractiveShell

from nbtrain.kernel.dashboard.chart_feed import unpack


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f" — {detail}" if detail else ""), flush=True)
    return ok


MiB = 2**20
TOLERANCE = 256 * MiB  # memory.used moves a little by itself (driver bookkeeping, other tenants)


def memory_used() -> dict[int, int]:
    """memory.used of every GPU, by NVML index: what is in use whether or not the driver lists processes."""
    from nbtrain.gpu import nvml

    lib = nvml.library()
    return {g.index: nvml.memory_info(lib, lib.nvmlDeviceGetHandleByIndex(g.index)).used for g in nvml.all_gpus()}


def above(baseline: dict[int, int]) -> dict[int, int]:
    """MiB above ``baseline`` per GPU, now."""
    return {i: (used - baseline.get(i, 0)) // MiB for i, used in memory_used().items()}


def wait_for_baseline(baseline: dict[int, int], seconds: float = 10.0) -> dict[int, int]:
    deadline = time.monotonic() + seconds
    while max(above(baseline).values(), default=0) * MiB > TOLERANCE and time.monotonic() < deadline:
        time.sleep(0.1)
    return above(baseline)


def prepared_defaults(shell) -> list[bool]:
    """Check 7: prepare()'s defaults on a GPU for a convolutional model."""
    result = shell.run_cell(
        "%%distributed 1\n"
        "import nbtrain\n"
        "conv = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2))\n"
        "prepared = nbtrain.prepare(conv)\n"
        "out = prepared(torch.randn(8, 3, 32, 32, device=device))\n"
        "kernel_weight = next(p for p in prepared.parameters() if p.dim() == 4)\n"
        "layout = kernel_weight.is_contiguous(memory_format=torch.channels_last)\n"
        "wanted = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16\n"
        "with nbtrain.autocast():\n"
        "    inside = nn.functional.conv2d(torch.randn(1, 3, 8, 8, device=device), kernel_weight).dtype\n"
        "speed = (layout, str(inside), str(wanted), str(out.dtype))\n"
        "del conv, prepared, kernel_weight\n")
    if not result.success:
        return [check("prepare() defaults on a GPU ran", False, str(result.error_in_exec))]
    layout, inside, wanted, out = shell.user_ns["speed"]
    return [check("prepare(): channels_last for a conv model on a GPU", layout),
            check("prepare(): autocast in the GPU's half precision, output float32", inside == wanted and out == "torch.float32",
                  f"inside {inside} (wanted {wanted}), output {out}")]


def forked_ranks(shell) -> list[bool]:
    """Check 9: the rank's parent is the zygote, which holds no context on a GPU although its child used one."""
    from nbtrain.gpu import nvml

    zygote = shell._nbtrain_magics.pools.starter.zygote  # set by nbtrain.load_ipython_extension
    pid = zygote.pid if zygote is not None else None
    if pid is None:
        return [check("the rank was forked from the kernel's zygote", False, "no zygote")]
    with open(f"/proc/{pid}/maps") as f:
        mapped = "libcuda.so" in f.read()
    lib = nvml.library()
    on_gpu = [g.index for g in nvml.all_gpus()
              if pid in [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(g.index))]]
    return [check("the rank was forked from the kernel's zygote", shell.user_ns["parent"] == pid,
                  f"rank's parent {shell.user_ns['parent']}, zygote {pid}; the driver library is "
                  f"{'mapped' if mapped else 'not mapped'} in the zygote"),
            check("the zygote holds no context on a GPU", not on_gpu, f"listed on GPUs {on_gpu or 'none'}")]


FT_CELL = """%%distributed 2 --ft {extra}
import os, signal, time, torch, nbtrain
torch.manual_seed(rank)
net = torch.nn.Linear(32, 1)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
x, y = X.to(device), Y.to(device)
while nbtrain.training_state().step < 40:
    opt.zero_grad()
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    opt.step()
    if rank == 1 and nbtrain.training_state().step == 10 and os.environ.get("NBTRAIN_FT_ATTEMPT", "0") == "0":
        os.kill(os.getpid(), signal.SIGKILL)  # the first rank 1 dies; a new one copies rank 0's state
    time.sleep(0.05)
ft_device = str(next(model.parameters()).device)
torch.save([p.detach().cpu() for p in model.module.parameters()], os.path.join(FT_DIR, f"rank{{rank}}.pt"))
"""


def fault_tolerant(shell, extra: str = "") -> list[bool]:
    """Check 11: ``%%distributed 2 --ft`` on the GPU — two replica groups; rank 1 is SIGKILLed at step 10, rank 0
    keeps stepping, a new rank 1 copies its state (CUDA tensors over the sealed transport), both end equal."""
    import tempfile

    import torch
    from IPython.utils.capture import capture_output

    with tempfile.TemporaryDirectory() as folder:
        shell.user_ns["FT_DIR"] = folder
        started = time.monotonic()
        with capture_output() as said:
            result = shell.run_cell(FT_CELL.format(extra=extra))
        text = said.stdout + said.stderr
        finals = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in (0, 1)] if result.success else []
    equal = len(finals) == 2 and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*finals, strict=True))
    return [check("--ft: a killed replica group is replaced and copies its peer",
                  result.success and "rank 1 was lost" in text and "1 replica group lost and replaced" in text,
                  f"{time.monotonic() - started:.1f} s; " + (text.strip().splitlines() or ["no output"])[-1][:200]),
            check("--ft: both groups end with the same weights, on the GPU",
                  equal and shell.user_ns.get("ft_device", "").startswith("cuda" if not extra else "cpu"),
                  f"trained on {shell.user_ns.get('ft_device')}, equal: {equal}")]


DRIVER_PROBE = """
import ctypes, importlib, json, sys
from nbtrain.rank.zygote import WARM_IMPORTS, cuda_driver_initialised, unsafe_to_fork
def mapped():
    with open("/proc/self/maps") as f:
        return "libcuda.so" in f.read()
seen = {}
for name in ("torch", "nbtrain.rank.main", *WARM_IMPORTS):
    importlib.import_module(name)
    seen[name] = mapped()
import torch
seen["ready"] = [torch.cuda.is_initialized(), cuda_driver_initialised(), unsafe_to_fork()]
if sys.argv[1] == "torch":
    torch.cuda.init()
else:
    ctypes.CDLL("libcuda.so.1").cuInit(0)
seen["after"] = [torch.cuda.is_initialized(), cuda_driver_initialised(), unsafe_to_fork()]
print(json.dumps(seen))
"""


def zygote_driver_checks() -> list[bool]:
    """Check 10: the zygote's imports leave the driver uninitialised, and its check before each fork catches CUDA
    initialised through torch or through the driver's cuInit directly (as CuPy and JAX do)."""
    import json
    import subprocess

    results = []
    for how in ("torch", "cuInit"):
        done = subprocess.run([sys.executable, "-c", DRIVER_PROBE, how], capture_output=True, text=True, timeout=120)
        if done.returncode:
            results.append(check(f"zygote's imports, then CUDA initialised through {how}", False, done.stderr[-500:]))
            continue
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        first_mapped = next((name for name, on in seen.items() if on is True), None)
        results.append(check(f"zygote's imports leave CUDA uninitialised ({how} run)", seen["ready"] == [False, False, ""],
                             f"torch initialised, driver initialised, refusal: {seen['ready']}; the driver library "
                             f"is first mapped after importing {first_mapped}"))
        results.append(check(f"the zygote refuses to fork once CUDA is initialised through {how}",
                             bool(seen["after"][2]) and seen["after"][1], f"{seen['after']}"))
    return results


def load_panels() -> list[bool]:
    """Check 8: the chart's load panels from two real telemetry samples."""
    from nbtrain.kernel.dashboard.load_feed import GPU_TITLES, LoadFeed
    from nbtrain.kernel.dashboard.telemetry_series import TelemetrySeries
    from nbtrain.gpu.telemetry import Telemetry

    telemetry, series = Telemetry(), TelemetrySeries()
    feed = LoadFeed(series)
    series.add(telemetry.snapshot())
    time.sleep(0.5)
    series.add(telemetry.snapshot())
    load = feed.poll() or {}
    devices = load.get("devices", [])
    numbers = {d: (unpack(load["busy"][d])[-1], unpack(load["memory"][d])[-1]) for d in devices}
    known = all(v == v for pair in numbers.values() for v in pair)  # NaN != NaN
    return [check("load panels: a line per GPU, in the GPU titles",
                  load.get("titles") == GPU_TITLES and bool(devices) and all(d.startswith("GPU ") for d in devices),
                  f"{load.get('titles')}: {devices}"),
            check("load panels: utilisation and memory % known", known, f"{numbers}")]


def main() -> int:
    from nbtrain.gpu import nvml

    results = []
    gpus = nvml.visible_gpus()
    results.append(check("NVML lists the GPUs", bool(gpus), ", ".join(f"{g.index}: {g.name}, {(g.memory_total or 0) / 2**30:.0f} GiB" for g in gpus)
                         or str(nvml.unavailable_reason())))
    baseline = memory_used() if gpus else {}  # before any rank exists
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtrain")
    shell.run_cell("import torch\nfrom torch import nn\nX = torch.randn(4096, 32)\nY = X.sum(1, keepdim=True)")
    started = time.monotonic()
    result = shell.run_cell(
        "%%distributed 1\n"
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "import os, time\n"
        "backend, where, parent = dist.get_backend(), str(device), os.getppid()\n"
        "t = torch.ones(1, device=device); started = time.perf_counter(); dist.all_reduce(t); torch.cuda.synchronize()\n"
        "first_ms = (time.perf_counter() - started) * 1000; reduced = t.item()\n"
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
        results.append(check("all_reduce on NCCL", ns["reduced"] == 1.0, f"the first took {ns['first_ms']:.2f} ms"))
        weight = ns["net"].weight
        results.append(check("model came back on the CPU", type(ns["net"]).__name__ == "Linear" and weight.device.type == "cpu",
                             f"{type(ns['net']).__name__} on {weight.device}, peak {ns['peak_mib']:.0f} MiB in the rank"))
    if result.success:
        warm = memory_used()
        freed = shell.run_cell("%%distributed 1\nbig = torch.empty(4 * 2**30, dtype=torch.uint8, device=device)\n"
                               "big.fill_(1); del big\n")
        grown = {i: (used - warm.get(i, 0)) // MiB for i, used in memory_used().items()}
        results.append(check("freed memory released before the cell returned",
                             freed.success and max(grown.values(), default=0) * MiB <= TOLERANCE,
                             f"memory.used right after the cell, MiB above the level before it: {grown}"))
    if result.success:
        results += prepared_defaults(shell)
        results += forked_ranks(shell)
        results += zygote_driver_checks()
        results += fault_tolerant(shell)
    results += load_panels()
    import torch

    results.append(check("kernel never initialised CUDA", not torch.cuda.is_initialized()))
    pool = shell._nbtrain_magics.pools.pool  # type: ignore[attr-defined]  # set by nbtrain.load_ipython_extension
    pids = list(pool.pids()) if pool else []
    shell.run_line_magic("distributed_shutdown", "")
    time.sleep(1.0)
    lib = nvml.library()
    held = []
    for g in nvml.all_gpus():
        handle = lib.nvmlDeviceGetHandleByIndex(g.index)
        held += [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids]
    results.append(check("no rank listed on a GPU after shutdown", not held, f"rank pids {pids}, still on a GPU: {held}"))
    left = wait_for_baseline(baseline)
    results.append(check("memory.used back at the baseline after shutdown", max(left.values(), default=0) * MiB <= TOLERANCE,
                         f"MiB above the baseline taken before the ranks started: {left}"))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
