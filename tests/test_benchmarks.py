"""benchmarks/run_all.py picks one rank per GPU for the GPU benchmarks, counted through (stand-in) NVML."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from helpers import fake_nvml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run_all(monkeypatch):
    spec = importlib.util.spec_from_file_location("run_all", os.path.join(ROOT, "benchmarks", "run_all.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_all", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("boards, visible, ranks", [(1, None, 1), (2, None, 2), (4, "1,3", 2), (4, None, 4)])
def test_gpu_benchmarks_ask_for_the_gpus_there_are(run_all, monkeypatch, boards, visible, ranks):
    fake_nvml.install(monkeypatch, [fake_nvml.FakeGpu(uuid=f"GPU-{i}") for i in range(boards)])
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    by_name = {b.name: b for b in run_all.BENCHMARKS}
    for name in ("training-gpu", "logging-gpu"):
        for quick in (False, True):
            args = run_all.command(by_name[name], quick)
            assert args[-2:] == ("--ranks", str(ranks)), args
    assert "--ranks" not in run_all.command(by_name["training"], False)  # CPU benchmarks keep their 2
    import torch

    assert not torch.cuda.is_initialized()


def test_gpu_benchmarks_take_the_rank_count_they_are_given():
    for script in ("training_overhead.py", "log_overhead.py"):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--help"],
                             capture_output=True, text=True, check=True).stdout
        assert "--ranks" in out


def test_gpu_benchmarks_without_a_gpu_stop_before_running(run_all, monkeypatch, capsys, tmp_path):
    fake_nvml.install(monkeypatch, [])
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--gpu", "--only", "training-gpu", "--out", str(tmp_path / "b.md")])
    monkeypatch.setattr(run_all, "run", lambda args: pytest.fail(f"ran {args}"))
    with pytest.raises(SystemExit):
        run_all.main()
    assert "--gpu: no usable GPU" in capsys.readouterr().err


def gpu_speed(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_speed.py"), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_the_gpu_speed_table_is_registered_with_one_rank_per_gpu(run_all, monkeypatch):
    fake_nvml.install(monkeypatch, [fake_nvml.FakeGpu(uuid=f"GPU-{i}") for i in range(8)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    speed = next(b for b in run_all.BENCHMARKS if b.name == "speed-gpu")
    assert speed.gpu and run_all.command(speed, False) == ("gpu_speed.py", "--rounds", "3", "--ranks", "8")


def test_gpu_speed_builds_every_cell_and_script_and_refuses_without_a_gpu():
    dry = gpu_speed("--dry-run")
    assert dry.returncode == 0, dry.stderr
    for workload in ("resnet50", "transformer"):
        for setting in ("fp32", "bf16", "bf16+channels_last", "bf16+channels_last+compile"):
            assert f"{workload:<12}{setting:<28}%%distributed" in dry.stdout
    refused = gpu_speed()  # no NVIDIA driver on the test machines
    assert refused.returncode == 2 and "gpu_speed.py: error: no usable GPU" in refused.stderr
    assert "--cpu runs a smoke test on CPU ranks" in refused.stderr


@pytest.mark.timeout(300)
@pytest.mark.slow  # real ranks under nbtrain and torchrun
def test_gpu_speed_runs_its_whole_path_on_cpu_ranks():
    done = gpu_speed("--cpu", "--rounds", "1", "--only", "transformer", "--settings", "bf16", timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("transformer bf16 "))
    nbtrain, torchrun = (float(v) for v in row.split()[2:4])
    assert nbtrain > 0 and torchrun > 0
    assert "CPU smoke run, not a measurement" in done.stdout


@pytest.mark.slow
def test_the_nccl_comparison_runs_on_gloo_and_refuses_without_a_gpu():
    script = os.path.join(ROOT, "benchmarks", "nccl_first_collective.py")
    done = subprocess.run([sys.executable, script, "--cpu", "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line[:22].strip(): line.split()[-4:] for line in done.stdout.splitlines()[1:3]}
    assert set(rows) == {"at start (device_id)", "at first collective"}
    assert all(float(value) > 0 for row in rows.values() for value in row)
    refused = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "no CUDA GPU here" in refused.stderr


@pytest.mark.timeout(300)
@pytest.mark.slow  # real ranks, and a real kernel for the per-cell cost
def test_the_gpu_speed_verification_runs_its_whole_path_on_cpu_ranks():
    """scripts/verify_gpu_speed.py on a GPU compares MFU and FLOP/s with a hand count; on the CPU its path runs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "verify_gpu_speed.py"), "--cpu"],
                          capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS  no MFU without a known peak — the CPU has no peak" in done.stdout
    assert re.search(r"PASS  the step split sums to 100 % and holds comm under DDP — .* % comm", done.stdout)
    # the timed checks ran (their numbers, on two shared cores, are the GPU run's to judge: docs/gpu-verification.md)
    assert re.search(r"(PASS|FAIL)  achieved FLOP/s against samples/s .* TFLOP/s per rank said", done.stdout)
    assert re.search(r"(PASS|FAIL)  the dashboard's per-cell cost — [0-9.]+ s with it", done.stdout), done.stdout
    assert "PASS  a compiled model's FLOPs (counted on a meta-device copy) against the eager count" in done.stdout
    assert re.search(r"[3-5] of 5 checks passed", done.stdout)
