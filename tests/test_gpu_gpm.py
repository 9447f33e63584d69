"""What the SMs did, from NVML's GPM metrics (stand-in NVML): read between two samples of each GPU, N/A with the
reason on a GPU without GPM or in MIG mode, carried in a node's heartbeat, and shown in the device panel."""

from __future__ import annotations

from helpers.fake_nvml import FakeGpu, install
from nbtrain.gpu.devices import DeviceReader
from nbtrain.gpu.health import GpuHealth, describe
from nbtrain.kernel.dashboard.devices_view import UTIL_MEANS, devices_html
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.telemetry import Snapshot


def test_gpm_metrics_are_read_between_two_samples_of_each_gpu(monkeypatch):
    hopper = FakeGpu(gpm=(62.4, 40.0, 41.0, 30.2))
    module = install(monkeypatch, [hopper])
    reader = DeviceReader()
    first, = reader.read()
    assert (first.health.sm_active, first.health.tensor_active) == (None, None)  # no baseline yet
    assert not [why for why in first.health.unread if why.startswith("GPM")]  # none missing: it is only early
    hopper.gpm = (99.6, None, 0.0, 120.0)
    second, = reader.read()
    health = second.health
    assert (health.sm_active, health.sm_occupancy, health.tensor_active, health.dram_bw) == (100, None, 0, 100)
    assert "SM active 100 %, tensor 0 %, DRAM 100 %" in describe(health)
    reader.close()
    assert module.gpm_samples and all(sample.freed for sample in module.gpm_samples)


def test_a_gpu_without_gpm_and_one_in_mig_mode_say_why_their_activity_reads_na(monkeypatch):
    install(monkeypatch, [FakeGpu(name="NVIDIA A100-SXM4-80GB", gpm=None), FakeGpu(mig=True)])
    reader = DeviceReader()
    for _ in range(2):
        ampere, mig = reader.read()
    assert ampere.health.sm_active is None and mig.health.sm_active is None
    assert "GPM: this GPU has none (GPM needs Hopper or later)" in ampere.health.unread
    assert "GPM: not read for a GPU in MIG mode (its instances are sampled apart)" in mig.health.unread
    assert "SM active" not in describe(ampere.health)


def test_gpm_fields_travel_in_a_heartbeat_and_a_wrong_one_reads_na():
    health = GpuHealth(sm_active=62, sm_occupancy=40, tensor_active=41, dram_bw=30)
    assert GpuHealth.from_json(health.to_json()) == health
    forged = {**health.to_json(), "sm_active": "62", "tensor_active": 10**30}
    back = GpuHealth.from_json(forged)
    assert back is not None and (back.sm_active, back.tensor_active, back.dram_bw) == (None, None, 30)


def test_the_device_panel_says_what_util_means_and_shows_the_sms_activity(monkeypatch):
    hopper = FakeGpu(gpm=(20.0, 10.0, 0.0, 5.0), util=100)
    install(monkeypatch, [hopper])
    reader = DeviceReader()
    reader.read()
    gpus = reader.read()
    html = devices_html(Snapshot(0.0, tuple(gpus), (), HostStatus(50.0, 2, 1, 4), None))
    assert f'title="{UTIL_MEANS}"' in html and "100%" in html
    assert "SM active 20 %, occupancy 10 %, tensor 0 %, DRAM 5 %" in html  # busy 100 %, yet a fifth of the SMs


def test_a_gpu_busy_with_kernels_that_leave_most_sms_idle_gets_a_hint_and_a_full_one_none():
    from nbtrain.gpu.devices import GpuStatus
    from nbtrain.kernel.diagnostics.advisor import Evidence, advise

    def gpu(index, sm_active):
        return GpuStatus(index, "NVIDIA H100", "", 100, 1, 2, 60, 310.0, 700.0, (),
                         health=GpuHealth(sm_active=sm_active))

    evidence = Evidence()
    for t in range(6):  # both GPUs 100 % "utilised"; GPU 0's SMs a fifth active, GPU 1's nearly all
        evidence.add_snapshot(Snapshot(float(t), (gpu(0, 18 + t % 3), gpu(1, 92)), (), None, None))
    hints = [hint for hint in advise(evidence) if hint.rule == "few-sms"]
    assert [hint.text.split(" ran ")[0] for hint in hints] == ["GPU 0"]
    assert "only 19 % of its SMs were active on average (GPM)" in hints[0].text
