"""The NVML path of the telemetry, against a stand-in ``pynvml`` (this machine has no NVIDIA GPU).

What is checked is nbtrain's handling of NVML's answers: fields, caching of the slow ones, per-rank
memory over a process tree, MIG, PID namespaces, unsupported fields. The real driver path is verified
separately on GPU machines (docs/gpu-verification.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers.fake_nvml import FakeGpu, install
from helpers.workers import parent_and_child

from nbtrain.gpu import nvml
from nbtrain.gpu.devices import DeviceReader
from nbtrain.gpu.telemetry import Telemetry


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a stand-in pynvml with the given boards; NVML state starts afresh and is restored after."""
    return lambda gpus: install(monkeypatch, gpus)


@pytest.fixture
def process_tree():
    """A real process with a real child (as a rank with a DataLoader worker)."""
    with parent_and_child("import time; time.sleep(60)") as pids:
        yield pids


def test_importing_telemetry_does_not_initialise_nvml(fake_nvml):
    module = fake_nvml([FakeGpu()])
    code = "import nbtrain.gpu.telemetry, nbtrain.kernel.dashboard, sys; print('pynvml' in sys.modules, 'ipywidgets' in sys.modules, 'matplotlib' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
    assert out.stdout.split() == ["False"] * 4
    Telemetry()  # constructing does not touch NVML either
    assert module.calls["nvmlInit"] == 0


def test_gpu_fields_and_cached_slow_fields(fake_nvml):
    module = fake_nvml([FakeGpu(used=10 * 2**30, util=87, temperature=61, power_mw=350_500),
                        FakeGpu(name="NVIDIA A100-SXM4-40GB", total=40 * 2**30, util=3)])
    tel = Telemetry()
    snaps = [tel.snapshot() for _ in range(3)]
    snap = snaps[-1]
    assert snap.nvml_error is None and snap.has_gpus
    first, second = snap.gpus
    assert (first.index, first.name, first.utilization, first.temperature) == (0, "NVIDIA H100 80GB HBM3", 87, 61)
    assert first.memory_used == 10 * 2**30 and first.memory_total == 80 * 2**30
    assert first.power == pytest.approx(350.5) and first.power_limit == pytest.approx(700.0)
    assert first.memory_fraction == pytest.approx(0.125)
    assert second.name == "NVIDIA A100-SXM4-40GB" and second.memory_total == 40 * 2**30
    # name, UUID, power limit and MIG mode are read once per GPU, however many snapshots are taken
    for slow in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMigMode"):
        assert module.calls[slow] == 2, slow
    assert module.calls["nvmlDeviceGetUtilizationRates"] == 6
    assert module.calls["nvmlInit"] == 1


def test_memory_used_leaves_out_the_drivers_reserve_as_nvidia_smi_does(fake_nvml):
    """Seen on an H200: the first memory call counted 615 MiB more than nvidia-smi, idle and busy alike."""
    fake_nvml([FakeGpu(used=3 * 2**30, reserved=615 * 2**20)])
    assert Telemetry().snapshot().gpus[0].memory_used == 3 * 2**30


def test_the_launcher_and_the_telemetry_share_one_enumeration(fake_nvml):
    module = fake_nvml([FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-40GB")])
    assert [g.index for g in nvml.visible_gpus({"CUDA_VISIBLE_DEVICES": "1"})] == [1]  # what the launcher asks
    snap = Telemetry().snapshot()
    assert [g.name for g in snap.gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    assert [g.name for g in nvml.all_gpus()] == [g.name for g in snap.gpus]
    for once in ("nvmlDeviceGetCount", "nvmlDeviceGetName", "nvmlDeviceGetUUID"):
        assert module.calls[once] == (1 if once == "nvmlDeviceGetCount" else 2), once


def test_rank_memory_is_its_process_tree(fake_nvml, process_tree):
    parent, child = process_tree
    other = 999_999  # another user's process on the same GPU
    fake_nvml([FakeGpu(used=7 * 2**30, processes=[(parent, 2 * 2**30), (child, 2**29), (other, 3 * 2**30)])])
    tel = Telemetry([(0, parent, "cuda:0", 0)])
    deadline = time.monotonic() + 5
    snap = tel.snapshot()
    while snap.ranks[0].gpu_memory != 2 * 2**30 + 2**29 and time.monotonic() < deadline:
        time.sleep(0.1)  # the child may not be listed as one until it has started
        snap = tel.snapshot()
    usage = snap.ranks[0]
    assert usage.gpu_memory == 2 * 2**30 + 2**29
    assert usage.rss > 0 and usage.alive
    assert {p.pid for p in snap.gpus[0].processes} == {parent, child, other}
    assert snap.notes == ()


def test_pid_namespace_mismatch_is_said_not_guessed(fake_nvml, process_tree):
    parent, _ = process_tree
    fake_nvml([FakeGpu(used=2**30, processes=[(123456, 2**30)])])  # the host's PID of our rank, unknown here
    snap = Telemetry([(0, parent, "cuda:0", 0)]).snapshot()
    assert snap.ranks[0].gpu_memory is None
    assert any("PID namespace" in note for note in snap.notes)
    assert snap.gpus[0].memory_used == 2**30  # the GPU's own numbers are still there


def test_mig_and_unsupported_fields_degrade_to_none(fake_nvml, process_tree, capsys):
    parent, _ = process_tree
    fake_nvml([FakeGpu(mig=True, processes=None), FakeGpu(util=None, power_mw=None)])
    snap = Telemetry([(0, parent, "cuda:0", 0)]).snapshot()
    mig, plain = snap.gpus
    assert mig.mig and mig.utilization is None and mig.processes is None
    assert plain.utilization is None and plain.power is None and plain.power_limit == 700.0
    assert snap.ranks[0].gpu_memory is None
    assert any("MIG mode" in n for n in snap.notes)
    assert any("does not list its processes" in n for n in snap.notes)
    assert any("GPU 1: utilisation not reported" in n for n in snap.notes)
    assert "NVML could not read" not in capsys.readouterr().err  # polled fields are reported in notes, not warned


def test_a_driver_that_lists_no_process_makes_rank_memory_unknown_not_zero(fake_nvml, process_tree):
    """As on a VM: NVML's process list is empty while a rank holds 8 GiB. The rank's memory is unknown
    (N/A), said once in the notes (two ranks, one note), and the GPU's memory.used is what is in use."""
    parent, child = process_tree
    fake_nvml([FakeGpu(used=8 * 2**30 + 480 * 2**20, processes=[])])
    snap = Telemetry([(0, parent, "cuda:0", 0), (1, child, "cuda:0", 0)]).snapshot()
    assert [r.gpu_memory for r in snap.ranks] == [None, None]
    hidden = [n for n in snap.notes if "lists no processes" in n]
    assert len(hidden) == 1 and "memory.used (8.5 GiB)" in hidden[0]
    assert snap.gpus[0].processes_hidden and snap.gpus[0].memory_used == 8 * 2**30 + 480 * 2**20


def test_an_idle_gpu_with_no_process_is_not_flagged(fake_nvml):
    fake_nvml([FakeGpu(used=480 * 2**20, processes=[])])  # the driver's own reservation, nothing running
    snap = Telemetry().snapshot()
    assert snap.gpus[0].processes == () and not snap.gpus[0].processes_hidden and snap.notes == ()


def test_broken_driver_is_a_reason_not_an_exception(monkeypatch):
    import types

    broken = types.ModuleType("pynvml")

    def nvmlInit():
        raise RuntimeError("Driver Not Loaded")

    broken.nvmlInit = nvmlInit
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setattr(nvml, "_state", {"module": None, "error": None, "tried": False})
    snap = Telemetry().snapshot()
    assert snap.gpus == () and "no NVIDIA driver was found" in snap.nvml_error and "Driver Not Loaded" in snap.nvml_error
    assert snap.host.memory_total > 0


def test_gpu_health_clocks_held_down_a_narrow_link_and_ecc_errors_are_read_and_shown(fake_nvml):
    from nbtrain.kernel.dashboard.devices_view import devices_html
    from nbtrain.kernel.dashboard.monitor import gpus_table

    module = fake_nvml([FakeGpu(sm_clock=1410, clock_reasons=0x4 | 0x1, pcie=(4, 5, 4, 16), pcie_kb=(2_000_000, 10),
                                ecc=(3, 2)),
                        FakeGpu(name="NVIDIA GeForce RTX 4090", ecc=None, pcie_kb=None, clock_reasons=None)])
    tel = Telemetry(reader=DeviceReader(pcie_throughput=True))  # as %gpus --once reads
    first, consumer = tel.snapshot().gpus
    health = first.health
    assert (health.sm_clock, health.sm_clock_max, health.slowed_by) == (1410, 1980, ("power cap",))
    assert health.pcie_degraded and (health.pcie_gen, health.pcie_width, health.pcie_width_max) == (4, 4, 16)
    assert (health.pcie_rx, health.ecc_corrected, health.ecc_uncorrected) == (2_000_000 * 1024, 3, 2)
    # a board without ECC or PCIe counters: N/A, never an error
    assert consumer.health.ecc_uncorrected is None and consumer.health.pcie_rx is None
    assert consumer.health.clock_reasons is None and consumer.health.slowed_by == ()
    table = gpus_table(tel.snapshot())
    assert "PCIe 4 x4/16 (narrower than the board's)" in table and "slowed by power cap" in table
    assert "ECC 3 corrected, 2 uncorrected" in table and "ECC N/A corrected, N/A uncorrected" in table
    assert "slowed by power cap" in devices_html(tel.snapshot())
    # the maxima are read once per GPU; the PCIe throughput (62 ms a call on an H200) at most every 10 s, and
    # never by the live sampler
    assert module.calls["nvmlDeviceGetMaxPcieLinkWidth"] == 2
    assert module.calls["nvmlDeviceGetPcieThroughput"] == 4  # rx and tx of two GPUs, in the first sample only
    Telemetry().snapshot()
    assert module.calls["nvmlDeviceGetPcieThroughput"] == 4
