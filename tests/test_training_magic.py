"""The training options through a real IPython shell, and their checks before any process starts."""

from __future__ import annotations

import pytest
from helpers.workers import nbtrain_workers
from IPython.core.error import UsageError

from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("options, message", [
    (dict(amp="fp8"), "--amp is bf16, fp16, off or auto"),
    (dict(grad_accum=0), "--grad-accum takes a whole number"),
    (dict(max_restarts=-1), "--max-restarts takes 0 or more"),
    (dict(max_restarts=2), "needs --checkpoint DIR"),
    (dict(checkpoint="  "), "--checkpoint needs a directory"),
])
def test_bad_training_options_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        resolve(LaunchRequest(nprocs=2, cpu=True, **options))


def test_checkpoint_file_instead_of_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file; give a directory"):
        resolve(LaunchRequest(nprocs=2, cpu=True, checkpoint=str(tmp_path / "file")))


def test_relative_checkpoint_resolves_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = resolve(LaunchRequest(nprocs=2, cpu=True, amp="BF16", grad_accum=4, checkpoint="runs/exp1")).train
    assert (train.amp, train.grad_accum, train.checkpoint_dir) == ("bf16", 4, str(tmp_path / "runs" / "exp1"))
    assert train.checkpoint_path == str(tmp_path / "runs" / "exp1" / "checkpoint.pt")


def test_bad_option_through_the_magic_starts_nothing(shell):
    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match="--grad-accum takes a whole number"):
        shell.run_cell_magic("distributed", "2 --cpu --grad-accum 0", "x = 1\n")
    with pytest.raises(UsageError, match="--amp is bf16, fp16, off or auto"):
        shell.run_cell_magic("distributed", "2 --cpu --amp int8", "x = 1\n")
    assert {p.pid for p in nbtrain_workers()} == before


def test_training_cell_through_the_magic(shell, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shell.user_ns.update(features=__import__("torch").randn(32, 5))
    cell = """
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
targets = (features.sum(dim=1) > 0).long()
net = torch.nn.Linear(5, 2)
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.5), DataLoader(TensorDataset(features, targets), batch_size=4, shuffle=True))
for epoch in nbtrain.epochs(2):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        nbtrain.log(loss=loss, reduce="mean")
    nbtrain.save_checkpoint()
hidden_dtype = str(torch.nn.functional.linear(features[:1], net.weight).dtype)
with nbtrain.autocast():
    inside = str(torch.nn.functional.linear(features[:1], net.weight).dtype)
steps = nbtrain.training_state().step
"""
    shell.run_cell_magic("distributed", "2 --cpu --amp bf16 --grad-accum 2 --checkpoint runs/exp1 --out steps,inside,net", cell)
    assert shell.user_ns["steps"] == 4  # 32 samples / 2 ranks / 4 per batch = 4 micro-steps → 2 steps an epoch
    assert shell.user_ns["inside"] == "torch.bfloat16"
    assert isinstance(shell.user_ns["net"], __import__("torch").nn.Linear)
    assert (tmp_path / "runs" / "exp1" / "checkpoint.pt").exists()
    assert len(shell.user_ns["history"].series("loss")) == 8

    shell.run_cell_magic("distributed", "2 --cpu --amp bf16 --grad-accum 2 --checkpoint runs/exp1 --out steps", cell)
    assert "resuming from" in capsys.readouterr().out
    assert shell.user_ns["steps"] == 4  # nothing left to train: epochs(2) were done
