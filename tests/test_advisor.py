"""The bottleneck advisor, rule by rule, on recorded telemetry (tests/data/telemetry/: the cpu-* files were
recorded from real ranks here; the gpu-* files are built in the same format, see make_gpu_fixtures.py), and
its hints where users see them: the summary after a run, the dashboard while it runs."""

from __future__ import annotations

import pytest
from helpers.runhelp import run_cell
from helpers.telemetry_record import load, replay

from nbtrain.kernel.dashboard.model import RunModel
from nbtrain.kernel.dashboard.run_view import run_html
from nbtrain.kernel.diagnostics.advisor import advise
from nbtrain.kernel.lifecycle.entry import format_summary

pytestmark = pytest.mark.timeout(120)


def rules(name: str) -> list[str]:
    return [hint.rule for hint in advise(replay(load(name)))]


def texts(name: str) -> str:
    return "\n".join(hint.text for hint in advise(replay(load(name))))


def test_an_idle_gpu_beside_a_busy_cpu_points_at_the_input_pipeline_and_spare_memory_at_the_batch():
    assert rules("gpu-input-bound") == ["input-pipeline", "batch-headroom"]
    said = texts("gpu-input-bound")
    assert "GPU 0 was busy 9 % of the time on average while rank 0's processes used 120 % of a CPU core" in said
    assert "num_workers" in said and "pin_memory=True" in said
    assert "GPU memory peaked at 6.0 GiB of 80 GiB (8 %, GPU 0)" in said


def test_fp32_on_a_gpu_that_computes_bf16_suggests_amp_bf16():
    assert rules("gpu-fp32") == ["precision"]
    assert "rank 0 trained in fp32 on cuda:0, which computes bf16: --amp bf16" in texts("gpu-fp32")


def test_a_rank_whose_gpu_the_others_wait_for_is_named_as_the_straggler():
    assert rules("gpu-straggler") == ["straggler"]
    assert "rank 0 is a straggler: its GPU 0 was busy 97 % against 55 %" in texts("gpu-straggler")


def test_a_slower_rank_on_real_cpu_ranks_is_named_by_its_steps_per_second():
    assert rules("cpu-straggler") == ["straggler"]
    assert texts("cpu-straggler").startswith("rank 1 is a straggler: ")
    assert rules("cpu-even") == []


def test_a_healthy_run_gets_no_hint_and_start_up_is_not_counted_as_idle():
    assert rules("gpu-healthy") == []
    untimed = load("gpu-healthy")
    untimed["metrics"] = {}  # without logged steps the idle start-up counts, and looks like a starved GPU
    assert [h.rule for h in advise(replay(untimed))] == ["input-pipeline"]


def test_too_little_evidence_says_nothing():
    short = load("gpu-input-bound")
    short["samples"] = short["samples"][-2:]
    short["metrics"] = {"0": short["metrics"]["0"][:3]}
    assert [h.rule for h in advise(replay(short))] == ["batch-headroom"]  # memory needs one sample; busy % needs 3


def test_the_dashboard_shows_the_hints_live_and_the_summary_after_the_run():
    model = RunModel()
    record = load("gpu-fp32")
    for rank, facts in record["setup"].items():
        for f in facts:
            model.add_setup(int(rank), f)
    assert [h.rule for h in model.hints()] == ["precision"]
    shown = run_html(model.store, None, (), 1.0, None, model.setup_words(), model.hints())
    assert "prepared: fp32" in shown and "trained in fp32 on cuda:0, which computes bf16" in shown


def test_the_summary_names_a_straggler_from_what_real_ranks_logged(fresh_pools):
    _, result = run_cell(fresh_pools, """
        import time, nbtrain
        for step in range(12):
            time.sleep(0.05 if rank == 1 else 0.005)
            nbtrain.log(loss=1.0)
        """)
    lines = format_summary(result)
    assert any(line.startswith("nbtrain: hint: rank 1 is a straggler: ") for line in lines), lines


def test_the_magic_prints_what_prepare_set_up_and_the_dashboards_hints(shell, capsys, monkeypatch):
    monkeypatch.setenv("NBTRAIN_DASHBOARD", "text")  # the dashboard's observer samples telemetry and gives the hints
    shell.run_cell("""%%distributed 2 --cpu --channels-last --out -
import time, torch, nbtrain
model = nbtrain.prepare(torch.nn.Conv2d(3, 4, 1))
model(torch.randn(2, 3, 4, 4))
for step in range(12):
    time.sleep(0.05 if rank == 1 else 0.005)
    nbtrain.log(loss=1.0)
""").raise_error()
    lines = capsys.readouterr().out.splitlines()
    first = next(line for line in lines if line.startswith("nbtrain: 2 ranks · gloo · cpu · "))
    assert first.endswith(" · fp32 · channels_last"), first
    assert any(line.startswith("nbtrain: hint: rank 1 is a straggler: ") for line in lines), lines


def test_gpu_health_hints_quote_the_power_cap_a_narrow_link_and_new_ecc_errors():
    """Snapshots as the telemetry takes them (NVML's health fields through gpu/health.py's GpuHealth)."""
    from nbtrain.gpu.devices import GpuStatus
    from nbtrain.gpu.health import GpuHealth
    from nbtrain.gpu.telemetry import Snapshot
    from nbtrain.kernel.diagnostics.advisor import Evidence

    def gpu(index, slowed, ecc, width=16):
        health = GpuHealth(clock_reasons=("power cap",) if slowed else (), pcie_width=width, pcie_width_max=16,
                           ecc_uncorrected=ecc)
        return GpuStatus(index, "NVIDIA H100", "", 95, 1, 2, 60, 310.0, 350.0, (), health=health)

    evidence = Evidence()
    for t in range(10):  # GPU 0: slowed 4 samples in 10; GPU 1: a x4 link, 2 uncorrected errors during the run
        evidence.add_snapshot(Snapshot(float(t), (gpu(0, t < 4, 0), gpu(1, False, 5 if t < 5 else 7, 4)), (), None, None))
    hints = {hint.rule: hint.text for hint in advise(evidence)}
    assert hints["gpu-slowed"] == "GPU 0 spent 40 % of the run slowed by its power cap (310 of 350 W)."
    assert hints["pcie"].startswith("GPU 1's PCIe link runs at x4 (x16 possible)")
    assert hints["ecc"].startswith("GPU 1 reported 2 uncorrected ECC errors during the run — results")


def test_a_nodes_gpus_are_judged_from_its_heartbeats_and_named_with_the_node():
    """NodeInfo as the run loop reports it once a second; a lost node's last report, and a report last heard before
    the first logged step, are not counted."""
    from nbtrain.gpu.devices import GpuStatus
    from nbtrain.gpu.health import GpuHealth
    from nbtrain.kernel.diagnostics.advisor import Evidence
    from nbtrain.kernel.observers.events import NodeGpu, NodeInfo, NodeState

    def node(name, when, slowed, state=NodeState.RUNNING):
        health = GpuHealth(clock_reasons=("power cap",) if slowed else ())
        gpus = (NodeGpu(GpuStatus(1, "NVIDIA H100", "", 95, 1, 2, 60, 395.0, 400.0, None, health=health)),)
        return NodeInfo(name, name, "10.0.0.7", (2, 3), state, when, 10.0, 20.0, gpus)

    evidence = Evidence()
    evidence.add_metrics(0, [(0, 10.0, {"loss": 1.0})])
    evidence.add_nodes((node("b", 5.0, True),))  # heard during start-up
    for t in range(10):  # node b's GPU 1: slowed in 4 of 10 reports; node c lost all along
        evidence.add_nodes((node("b", 10.0 + t, t < 4), node("c", 10.0 + t, True, state=NodeState.LOST)))
    [hint] = advise(evidence)
    assert hint.text == "node b GPU 1 spent 40 % of the run slowed by its power cap (395 of 400 W)."
