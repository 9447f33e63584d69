"""Check the GPU health fields nbtrain reads through NVML against ``nvidia-smi -q`` on a machine with an NVIDIA GPU.

    python scripts/verify_gpu_health.py [--out DIR] [--load-seconds 10]

1. Each health field of :class:`~nbtrain.gpu.devices.DeviceReader` — SM clock and its maximum, the clock event
   reasons, the PCIe generation and width and their maxima, the volatile ECC counts, MIG mode, the NVLink links
   up — against the same field of ``nvidia-smi -q -x`` (and ``nvidia-smi nvlink -s``), read one after the other
   on an idle GPU (the SM clock may move between the two reads: it is compared within 15 %).
2. The Xid watcher registers for the GPU's events (or says why not) and counts 0 on a healthy GPU.
3. What one sample costs, as the live sampler reads it (no PCIe throughput; NVLink, Xid and GPM included).
4. A 1-rank run under a bf16 matrix-product load, observed by the dashboard: the advisor's hints, the device
   panel's HTML while the GPU was busy (written to ``DIR/device_panel.html``: docs/device-panel.png is
   rendered from it) and the heartbeat a node agent sends now (``DIR/heartbeat.json``); GPM's SM active (Hopper
   and later) above 0 while the GPU was busy and near 0 once it is idle, or why the GPU has no GPM.

Prints PASS / FAIL / INFO lines and the raw ``nvidia-smi -q`` to ``DIR``; exits non-zero on a FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

from nbtrain.gpu.devices import DeviceReader
from nbtrain.gpu.health import describe_activity
from nbtrain.gpu.health import GpuHealth

# nvidia-smi's clocks event reason tags (…_reason_<name>) -> nbtrain's words (nbtrain.gpu.health.CLOCK_EVENT_REASONS)
SMI_REASONS = {"gpu_idle": "idle", "applications_clocks_setting": "application clocks", "sw_power_cap": "power cap",
               "hw_slowdown": "hardware slowdown", "sync_boost": "sync boost", "sw_thermal_slowdown": "thermal (software)",
               "hw_thermal_slowdown": "thermal (hardware)", "hw_power_brake_slowdown": "power brake",
               "display_clocks_setting": "display clocks"}
failures: list[str] = []


def report(kind: str, name: str, detail: str = "") -> None:
    if kind == "FAIL":
        failures.append(name)
    print(f"{kind:<4}  {name}" + (f" — {detail}" if detail else ""), flush=True)


def compare(name: str, ours, theirs, close: float = 0.0) -> None:
    if theirs is None:
        report("INFO", name, f"nbtrain {ours!r}; nvidia-smi does not show it")
    elif isinstance(ours, (int, float)) and isinstance(theirs, (int, float)) and close:
        report("PASS" if abs(ours - theirs) <= close * max(abs(theirs), 1) else "FAIL", name,
               f"nbtrain {ours}, nvidia-smi {theirs}")
    else:
        report("PASS" if ours == theirs else "FAIL", name, f"nbtrain {ours!r}, nvidia-smi {theirs!r}")


def number(text: str | None) -> int | None:
    found = re.match(r"\s*(\d+)", text or "")
    return int(found.group(1)) if found else None


def smi_fields(gpu: ET.Element) -> dict:
    """The fields nbtrain reads, as nvidia-smi -q -x gives them for one GPU (None where it has no such element)."""
    def text(path: str) -> str | None:
        node = gpu.find(path)
        return None if node is None else (node.text or "").strip()

    reasons_node = next((n for n in gpu if n.tag.startswith("clocks_") and n.tag.endswith("_reasons")), None)
    reasons = None if reasons_node is None else tuple(
        word for tag, word in SMI_REASONS.items()
        if any(child.tag.endswith("_" + tag) and (child.text or "").strip() == "Active" for child in reasons_node))
    volatile = gpu.find("ecc_errors/volatile")
    counts = {} if volatile is None else {n.tag: number(n.text) for n in volatile.iter() if n is not volatile}
    corrected = [v for k, v in counts.items() if "correctable" in k and "uncorrectable" not in k and v is not None]
    uncorrected = [v for k, v in counts.items() if "uncorrectable" in k and v is not None]
    return {"sm_clock": number(text("clocks/sm_clock")), "sm_clock_max": number(text("max_clocks/sm_clock")),
            "clock_reasons": reasons,
            "pcie_gen": number(text("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "pcie_gen_max": number(text("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "pcie_width": number(text("pci/pci_gpu_link_info/link_widths/current_link_width")),
            "pcie_width_max": number(text("pci/pci_gpu_link_info/link_widths/max_link_width")),
            "ecc_corrected": sum(corrected) if corrected else None,
            "ecc_uncorrected": sum(uncorrected) if uncorrected else None,
            "mig": None if text("mig_mode/current_mig") is None else text("mig_mode/current_mig") == "Enabled"}


def nvlinks_up(index: int) -> int:
    """Links nvidia-smi calls up (``Link N: <speed>``, not ``<inactive>``); 0 where it shows none."""
    shown = subprocess.run(["nvidia-smi", "nvlink", "-s", "-i", str(index)], capture_output=True, text=True)
    return sum(1 for line in shown.stdout.splitlines() if re.match(r"\s*Link \d+:", line) and "inactive" not in line)


def compare_fields(reader: DeviceReader, out: str) -> None:
    raw = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, check=True).stdout
    for name, args in (("nvidia-smi-q.xml", None), ("nvidia-smi-q.txt", ["nvidia-smi", "-q"])):
        with open(os.path.join(out, name), "w") as f:
            f.write(raw if args is None else subprocess.run(args, capture_output=True, text=True).stdout)
    smi = ET.fromstring(raw).findall("gpu")
    for status, gpu in zip(reader.read(), smi, strict=True):  # both in PCI bus order
        theirs, h = smi_fields(gpu), status.health or GpuHealth()
        print(f"GPU {status.index} {status.name}: {h}")
        compare(f"GPU {status.index} SM clock (MHz)", h.sm_clock, theirs["sm_clock"], close=0.15)
        for field in ("sm_clock_max", "clock_reasons", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max",
                      "ecc_corrected", "ecc_uncorrected"):
            compare(f"GPU {status.index} {field}", getattr(h, field), theirs[field])
        compare(f"GPU {status.index} MIG mode on", status.mig, theirs["mig"])
        compare(f"GPU {status.index} NVLink links up", h.nvlinks or 0, nvlinks_up(status.index))
        report("INFO", f"GPU {status.index} fields read N/A, and why", "; ".join(h.unread) or "none")
        xid_why = [r for r in h.unread if r.startswith("Xid")]
        report("PASS" if h.xid_errors == 0 or xid_why else "FAIL", f"GPU {status.index} Xid watcher",
               f"{h.xid_errors} Xid errors since it started" if not xid_why else xid_why[0])
        for device in status.mig_devices:
            report("INFO", f"GPU {status.index} MIG {device.index}", f"{device}")


def sample_cost(reader: DeviceReader) -> None:
    reader.read()
    n, started = 50, time.perf_counter()
    for _ in range(n):
        reader.read()
    each = (time.perf_counter() - started) / n
    report("PASS" if each < 0.05 else "FAIL", "one live sample (all GPUs, NVLink and Xid, no PCIe throughput)",
           f"{each * 1000:.2f} ms")


LOAD_CELL = """
import time
import nbtrain
a = torch.randn(SIZE, SIZE, device=device, dtype=torch.bfloat16)
end, step = time.time() + SECONDS, 0
while time.time() < end:
    for _ in range(20):
        b = a @ a
    if device.type == "cuda":
        torch.cuda.synchronize()
    nbtrain.log(norm=b.float().norm().item() / 1e6, step=step)
    step += 1
"""


def observed_run(seconds: float, out: str, cpu: bool) -> None:
    import IPython.display

    import torch
    from nbtrain.kernel.cluster.hub import heartbeat_gpus
    from nbtrain.kernel.dashboard.devices_view import devices_html
    from nbtrain.kernel.dashboard.observer import DashboardObserver
    from nbtrain.kernel.dashboard.widget import RunDashboard
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest
    from nbtrain.node.main import telemetry

    shown: list = []
    IPython.display.display = lambda obj, **kw: shown.append(obj)  # no frontend: keep what the cell would show
    dashboard = DashboardObserver(RunDashboard, interval=0.25)
    model = dashboard.model
    busy_panel: list[str] = []
    busy_sm: list[int] = []  # GPM's SM active in the samples where NVML called the GPU busy
    done = threading.Event()

    def keep_busy_panel() -> None:  # the panel as the cell showed it while the GPU worked (the ranks alive)
        while not done.wait(0.5):
            latest = model.telemetry.latest
            if latest is not None and latest.ranks and any((g.utilization or 0) >= 50 for g in latest.gpus):
                busy_panel[:] = [devices_html(latest, model.telemetry.sparks())]
                busy_sm.extend(g.health.sm_active for g in latest.gpus
                               if g.health is not None and g.health.sm_active is not None)

    watcher = threading.Thread(target=keep_busy_panel, daemon=True)
    watcher.start()
    started = time.monotonic()
    names = {"torch": torch, "SECONDS": seconds, "SIZE": 256 if cpu else 8192}
    try:
        run_source(LOAD_CELL, LaunchRequest(nprocs=1, cpu=cpu), names, observers=[dashboard])
    finally:
        done.set()
        watcher.join()
    report("PASS" if model.status == "finished" else "FAIL", "1-rank bf16 load run",
           f"{model.status} in {time.monotonic() - started:.1f} s, {model.telemetry.latest and len(model.telemetry.latest.gpus)} GPU(s)")
    for hint in model.hints():
        report("INFO", f"advisor: {hint.rule}", hint.text)
    report("PASS" if busy_panel or cpu else "FAIL", "the device panel drawn while the GPU was busy",
           f"written to {os.path.join(out, 'device_panel.html')}" if busy_panel else "no busy sample")
    with open(os.path.join(out, "device_panel.html"), "w") as f:
        f.write(busy_panel[0] if busy_panel else devices_html(model.telemetry.latest, model.telemetry.sparks()))
    print("summary:", getattr(shown[-1], "text", shown[-1]) if shown else "(none)")
    gpm_check(busy_sm)
    reader = DeviceReader(xid_events=True)
    try:
        beat = telemetry(reader)
    finally:
        reader.close()
    with open(os.path.join(out, "heartbeat.json"), "w") as f:
        json.dump(beat, f, indent=1)
    report("INFO", "a node agent's heartbeat now", json.dumps(beat)[:600])
    decoded = [gpu.status.to_json() for gpu in heartbeat_gpus(json.loads(json.dumps(beat)))]
    report("PASS" if decoded == beat["gpus"] else "FAIL", "the kernel reads the heartbeat's GPUs back field for field",
           f"{len(decoded)} GPU(s)")
    report("PASS" if not torch.cuda.is_initialized() else "FAIL", "this process never initialised CUDA")


def gpm_check(busy_sm: list[int]) -> None:
    """GPM's SM active: above 0 in the busy samples of the load run, near 0 on the idle GPU now (or why none)."""
    reader = DeviceReader()
    try:
        reader.read()
        time.sleep(1.0)
        idle = reader.read()
    finally:
        reader.close()
    for gpu in idle:
        why = [reason for reason in gpu.health.unread if reason.startswith("GPM")] if gpu.health else ["no health"]
        if why or gpu.health is None:
            report("INFO", f"GPU {gpu.index} GPM", why[0])
            continue
        report("PASS" if busy_sm and max(busy_sm) > 0 else "FAIL", f"GPU {gpu.index} GPM SM active under load",
               f"{len(busy_sm)} busy samples, SM active {min(busy_sm, default='N/A')}–{max(busy_sm, default='N/A')} %")
        idle_sm = gpu.health.sm_active
        report("PASS" if idle_sm is not None and idle_sm <= 5 else "FAIL", f"GPU {gpu.index} GPM SM active idle",
               f"{idle_sm} %, {describe_activity(gpu.health)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "build/gpu-health"))
    parser.add_argument("--load-seconds", type=float, default=10.0)
    parser.add_argument("--cpu", action="store_true", help="run the load on the CPU (a dry run of the script)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    reader = DeviceReader(xid_events=True)
    try:
        if not reader.read():
            report("FAIL", "NVML lists a GPU", "none found")
            return 1
        compare_fields(reader, args.out)
        sample_cost(reader)
    finally:
        reader.close()
    observed_run(args.load_seconds, args.out, args.cpu)
    print(f"{len(failures)} failed" + (f": {', '.join(failures)}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
