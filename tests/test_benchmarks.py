"""benchmarks/run_all.py picks one rank per GPU for the GPU benchmarks, counted through (stand-in) NVML."""

from __future__ import annotations

import importlib.util
import os
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
