"""NVLink traffic, Xid errors and MIG instances, read through (stand-in) NVML by the dashboard's real sampler
thread into the run's model, and shown in the device panel; the advisor's Xid hint."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from helpers.fake_nvml import FakeGpu, install
from nbtrain.kernel.dashboard.devices_view import devices_html
from nbtrain.kernel.dashboard.model import RunModel
from nbtrain.kernel.dashboard.observer import DashboardObserver
from nbtrain.kernel.dashboard.threads import Sampler

GIB = 2**30


def sampled(model: RunModel, until, timeout: float = 10.0):
    """Run the dashboard's sampler on ``model`` until ``until(snapshot)`` holds; the last snapshot."""
    sampler = Sampler(model.telemetry_source, model.add_sample, 0.25).start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = model.telemetry.latest
            if snap is not None and until(snap):
                return snap
            time.sleep(0.05)
        raise AssertionError(f"not sampled in {timeout} s: {model.telemetry.latest}")
    finally:
        sampler.stop()


@pytest.fixture
def model():
    """A run's model; its telemetry's background watcher is stopped afterwards."""
    run = RunModel()
    yield run
    run.telemetry_source.close()


def test_nvlink_links_and_their_traffic(monkeypatch, model):
    up = (1,) * 16 + (0, 0)  # two of 18 links down
    module = install(monkeypatch, [FakeGpu(nvlinks=up, nvlink_kib_s=(1_000_000, 500_000)),
                                   FakeGpu(nvlinks=(1, 1), nvlink_kib_s=None), FakeGpu()])
    snap = sampled(model, lambda s: s.gpus[0].health.nvlink_rx is not None)
    busy, uncounted, pcie_only = (g.health for g in snap.gpus)
    assert busy.nvlinks == 16 and busy.nvlink_rx == pytest.approx(1.024e9, rel=0.01)
    assert busy.nvlink_tx == pytest.approx(0.512e9, rel=0.01)
    assert (uncounted.nvlinks, uncounted.nvlink_rx) == (2, None) and pcie_only.nvlinks is None
    shown = devices_html(snap)
    assert "NVLink 16 up, in 1.02 GB/s out 0.51 GB/s" in shown and "NVLink 2 up, in N/A out N/A" in shown
    assert "no NVLink" in shown  # a PCIe board: nothing is missing, there is none
    assert shown.count("NVLink traffic N/A") == 1
    assert "GPU 1: NVLink traffic N/A — the driver does not count NVLink traffic" in shown
    assert module.calls["nvmlDeviceGetNvLinkState"] == 18 + 3 + 1  # each link once per GPU, to the first it lacks
    assert snap.gpus[2].health.unread == ()


def test_xid_errors_since_the_run_started_are_counted_off_the_main_thread_and_hinted(monkeypatch):
    module = install(monkeypatch, [FakeGpu(), FakeGpu(xid_events=False)])
    observer = DashboardObserver(lambda model: None)  # the run's model; its sampler is driven here
    model = observer.model
    before = set(threading.enumerate())
    sampled(model, lambda s: s.gpus[0].health.xid_errors == 0)  # watching from the first sample
    [watcher] = [t for t in set(threading.enumerate()) - before if t.name == "nbtrain-xid-events"]
    assert watcher is not threading.main_thread() and watcher.daemon
    module.xid(module.gpus[0], 48)
    module.xid(module.gpus[0], 79)
    snap = sampled(model, lambda s: s.gpus[0].health.xid_errors == 2)
    assert snap.gpus[0].health.xid_last == 79 and snap.gpus[1].health.xid_errors is None
    shown = devices_html(snap)
    assert "Xid 2 (last 79)" in shown and "Xid N/A" in shown
    assert "GPU 1: Xid N/A — Xid events not reported (Not Supported)" in shown
    [hint] = [h for h in model.hints() if h.rule == "xid"]
    assert hint.text.startswith("GPU 0 reported 2 Xid errors during the run (the last: Xid 79)")
    observer.stop()
    watcher.join(timeout=2)
    assert not watcher.is_alive() and module.calls["nvmlEventSetFree"] == 1


def test_a_runs_end_does_not_wait_for_the_xid_watchers_wait(monkeypatch):
    """NVML's event wait blocks its thread for up to half a second: the run's end (the dashboard's stop) returns at
    once all the same, and the thread frees the event set when its wait ends."""
    module = install(monkeypatch, [FakeGpu()])
    module.nvmlEventSetWait_v2 = lambda event_set, timeout_ms: time.sleep(2) or (_ for _ in ()).throw(
        module.NVMLError_Timeout())
    observer = DashboardObserver(lambda model: None)
    before = set(threading.enumerate())
    sampled(observer.model, lambda s: s.gpus[0].health.xid_errors == 0)
    [watcher] = [t for t in set(threading.enumerate()) - before if t.name == "nbtrain-xid-events"]
    started = time.monotonic()
    observer.stop()
    assert time.monotonic() - started < 0.3
    assert module.calls["nvmlEventSetFree"] == 0  # not under the wait still using it
    watcher.join(timeout=5)
    assert not watcher.is_alive() and module.calls["nvmlEventSetFree"] == 1


def test_each_mig_instance_is_a_device_with_its_memory_and_its_ranks(monkeypatch, model):
    instances = [FakeGpu(uuid="MIG-1c9e-a", total=10 * GIB, used=3 * GIB, processes=[(os.getpid(), None)]),
                 FakeGpu(uuid="MIG-1c9e-b", total=20 * GIB, used=GIB)]
    install(monkeypatch, [FakeGpu(mig=True, processes=None, mig_devices=instances)])
    model.telemetry_source.set_ranks([(0, os.getpid(), "cuda:0", 0)])
    snap = sampled(model, lambda s: s.ranks and s.ranks[0].cpu_percent is not None)
    first, second = snap.gpus[0].mig_devices
    assert (first.uuid, first.memory_used, first.memory_total) == ("MIG-1c9e-a", 3 * GIB, 10 * GIB)
    assert (second.uuid, second.memory_total) == ("MIG-1c9e-b", 20 * GIB) and snap.ranks[0].mig_uuid == "MIG-1c9e-a"
    shown = devices_html(snap)
    assert "MIG 0 MIG-1c9e-a · mem" in shown and "3.0 GiB / 10.0 GiB" in shown and "20.0 GiB" in shown
    rows = re.split(r'class="nbt-(?:row|note)"', shown)
    assert "rank 0" in next(r for r in rows if "MIG-1c9e-a" in r) and "rank" not in next(r for r in rows if "MIG-1c9e-b" in r)


def test_heartbeats_carry_each_gpu_as_plain_json_and_the_panel_draws_node_gpus_as_local_ones(monkeypatch):
    from nbtrain.kernel.cluster.hub import heartbeat_gpus
    from nbtrain.gpu.devices import DeviceReader
    from nbtrain.kernel.observers.events import NodeInfo
    from nbtrain.node.main import telemetry

    instance = FakeGpu(uuid="MIG-1c9e-a", total=10 * GIB, used=3 * GIB)
    module = install(monkeypatch, [FakeGpu(nvlinks=(1,) * 18, clock_reasons=0x4, util=95),
                                   FakeGpu(mig=True, processes=None, mig_devices=[instance])])
    reader = DeviceReader(xid_events=True)  # as the node agent's heartbeat thread reads
    try:
        telemetry(reader)
        module.xid(module.gpus[1], 79)
        deadline = time.monotonic() + 5
        while "'xid_errors': 1" not in str(sample := telemetry(reader)) and time.monotonic() < deadline:
            time.sleep(0.05)
        local = reader.read()
    finally:
        reader.close()
    first, second = heartbeat_gpus(json.loads(json.dumps(sample, allow_nan=False)))  # plain JSON values only
    assert first.status.health.nvlinks == 18 and first.status.health.clock_reasons == ("power cap",)
    assert (first.status.power, first.status.power_limit, first.status.utilization) == (200.0, 700.0, 95)
    assert second.status.health.xid_errors == 1 and second.status.health.xid_last == 79 and second.status.mig
    assert second.status.mig_devices == local[1].mig_devices and first.status.health.unread == ()
    assert first.status.health == local[0].health  # every field, as the node read it
    nodes = (NodeInfo("a", "gpu1", "10.0.0.7", (0, 1), "running", time.time(), 35.0, 41.0, (first, second), 64),
             NodeInfo("b", "gpu2", "10.0.0.8", (2, 3), "lost", time.time() - 6, None, None, ()))
    shown = devices_html(None, None, nodes)
    node_a, node_b = shown.index("<b>node a</b> gpu1 · running · CPU 35%"), shown.index("<b>node b</b> gpu2 · lost")
    assert node_a < shown.index("Xid 1 (last 79)") < node_b and "no GPU" in shown[node_b:]
    assert "NVLink 18 up" in shown and "slowed by power cap" in shown and "50°C · 200/700 W" in shown
    assert "MIG 0 MIG-1c9e-a · mem" in shown and "3.0 GiB / 10.0 GiB" in shown and " · MIG" in shown
    assert "node a, GPU 1 is in MIG mode" in shown  # the notes a local GPU gets, named by node
    assert shown.count("<b>GPU 0</b> NVIDIA H100") == 1 and "<b>GPU 1</b>" in shown
