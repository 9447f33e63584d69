"""The training helpers in one process without a process group (a plain script), and their small parts."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import nbtrain
from nbtrain.rank.train import state
from nbtrain.rank.train.accumulate import Accumulation
from nbtrain.rank.train.amp import outputs_to_fp32


@pytest.fixture(autouse=True)
def fresh_context(monkeypatch):
    for name in ("NBTRAIN_AMP", "NBTRAIN_GRAD_ACCUM", "NBTRAIN_CHECKPOINT"):
        monkeypatch.delenv(name, raising=False)
    state.reset()
    yield
    state.reset()


def test_prepare_without_a_process_group_trains_and_accumulates(monkeypatch):
    monkeypatch.setenv("NBTRAIN_GRAD_ACCUM", "2")
    monkeypatch.setenv("NBTRAIN_AMP", "bf16")
    net = torch.nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(torch.randn(10, 3), torch.randn(10, 1)), batch_size=2, shuffle=True)
    model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), loader)
    assert type(model).__name__ == "PreparedModule" and model.module is net
    steps = []
    for x, y in loader:
        out = model(x)
        assert out.dtype == torch.float32
        nbtrain.backward(torch.nn.functional.mse_loss(out, y))
        opt.step()
        opt.zero_grad()
        steps.append(nbtrain.training_state().step)
    assert steps == [0, 1, 1, 2, 3]  # 5 batches, K=2: the last batch closes a short window
    assert loader.epoch == 1 and len(list(loader)) == 5 and loader.epoch == 2


def test_accumulation_windows():
    accum = Accumulation(3)
    with pytest.raises(RuntimeError, match="needs nbtrain.backward"):
        accum.at_boundary()
    pattern = []
    for _ in range(6):
        sync = accum.sync_next()
        accum.before_backward()
        boundary = accum.at_boundary()
        if boundary:
            accum.on_step()
        pattern.append((sync, boundary))
    assert pattern == [(False, False), (False, False), (True, True)] * 2
    assert Accumulation(1).at_boundary()  # plain loss.backward() with K=1 steps every time
    first = Accumulation(2)
    assert first.zeroes_now()  # a loop that zeroes before its first backward: nothing to check yet
    with pytest.raises(RuntimeError, match="needs nbtrain.backward"):
        first.at_boundary()  # its step without a nbtrain.backward: loss.backward() was used
    first.before_backward()
    assert not first.zeroes_now()  # inside a window: the gradients accumulate


def test_outputs_to_fp32_keeps_structure():
    half = torch.ones(2, dtype=torch.bfloat16)
    out = outputs_to_fp32({"logits": half, "aux": (half, torch.ones(1, dtype=torch.int64)), "n": 3})
    assert out["logits"].dtype == torch.float32 and out["aux"][0].dtype == torch.float32
    assert out["aux"][1].dtype == torch.int64 and out["n"] == 3


def test_importing_nbtrain_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, nbtrain, nbtrain.kernel.magics; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_optimizer_of_another_model_instance_is_refused():
    with pytest.raises(nbtrain.rank.train.prepare.PreparedError,
                       match=r"holds none of the parameters of the Linear given with it.*model = Net\(\)"):
        nbtrain.prepare(torch.nn.Linear(3, 1), torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.1))
    net, extra = torch.nn.Linear(3, 1), torch.nn.Parameter(torch.ones(1))
    # an optimizer of the model plus other tensors, or prepared in a call of its own, is fine
    nbtrain.prepare(net, torch.optim.SGD([*net.parameters(), extra], lr=0.1))
    nbtrain.prepare(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))


def test_each_optimizer_step_counts_without_nbtrain_backward():
    """``loss.backward()`` and a prepared optimizer (no --grad-accum): every step() is one step — the step a
    checkpoint records and a preemption notice's checkpoint is agreed on (nbtrain.rank.train.preempt_checkpoint)."""
    net = torch.nn.Linear(3, 1)
    model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    steps = []
    for _ in range(3):
        torch.nn.functional.mse_loss(model(torch.randn(2, 3)), torch.randn(2, 1)).backward()
        opt.step()
        opt.zero_grad()
        steps.append(nbtrain.training_state().step)
    assert steps == [1, 2, 3]
