"""``%%distributed N --ft --checkpoint DIR``: one replica group writes each checkpoint, and every group resumes from it.

Real ranks (gloo on the CPU), a real Lighthouse and torchft Managers. Every group holds the same state, so the first
group of the step's quorum writes the checkpoint and the others' ``save_checkpoint()`` returns at once. Run again,
the cell resumes in every group from that checkpoint. A group that loses a rank is still replaced by new ranks
that copy a peer's state (not the older checkpoint), and the saves go on from whichever group comes first.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from helpers.runhelp import Captured, run_cell
from test_torchft_cell import _marks

pytestmark = pytest.mark.timeout(300)

CELL = """
import os, signal, time, torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(rank)
data = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)),
                     torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(1)))
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                                     DataLoader(data, batch_size=4, shuffle=True))
for epoch in nbtrain.epochs(EPOCHS):
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        nbtrain.log(loss=loss)
        step = nbtrain.training_state().step
        with open(os.path.join(MARKS, f"rank{rank}"), "a") as mark:
            mark.write(f"{os.getpid()} {step} {time.time():.3f}\\n")
        if step == KILL_AT and rank == 0 and os.environ.get("NBTRAIN_FT_ATTEMPT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
    nbtrain.save_checkpoint()
torch.save([p.detach() for p in model.module.parameters()], os.path.join(MARKS, f"final{rank}.pt"))
steps = nbtrain.training_state().step
"""
STEPS_PER_EPOCH = 8  # 64 samples, 2 groups, batches of 4


def _run(pools, tmp_path, epochs: int, kill_at: int = -1):
    marks = tmp_path / f"marks{epochs}"
    marks.mkdir()
    output = Captured()
    ns, result = run_cell(pools, CELL, {"MARKS": str(marks), "EPOCHS": epochs, "KILL_AT": kill_at}, write=output,
                          nprocs=2, ft="on", checkpoint=str(tmp_path / "ckpt"), out="steps", start_timeout=120)
    return ns, result, output.text(), marks


def _saved(tmp_path) -> dict:
    return torch.load(tmp_path / "ckpt" / "checkpoint.pt", weights_only=True)


@pytest.mark.slow
def test_torchft_checkpoint_one_group_writes_and_every_group_resumes(fresh_pools, tmp_path):
    ns, _, text, marks = _run(fresh_pools, tmp_path, epochs=2)
    assert ns["steps"] == 2 * STEPS_PER_EPOCH, text
    saved = _saved(tmp_path)
    assert saved["step"] == 2 * STEPS_PER_EPOCH and saved["epoch"] == 2
    assert [entry["rank"] for entry in saved["ranks"]] == [0], saved["ranks"]  # the first group's one rank wrote it
    ns, result, text, marks = _run(fresh_pools, tmp_path, epochs=3)
    assert f"resuming from {tmp_path / 'ckpt' / 'checkpoint.pt'}" in text, text
    assert ns["steps"] == 3 * STEPS_PER_EPOCH, text
    for rank in (0, 1):  # both groups went on from the checkpoint's step: none started over
        steps = [step for _, step, _ in _marks(marks, rank)]
        assert steps == list(range(2 * STEPS_PER_EPOCH + 1, 3 * STEPS_PER_EPOCH + 1)), (rank, steps, text)
    final0, final1 = (torch.load(marks / f"final{rank}.pt") for rank in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(final0, final1, strict=True)), text
    assert result.history.series("loss", 0).steps[-1] == 3 * STEPS_PER_EPOCH - 1  # rank 0's curve continued


@pytest.mark.slow
def test_torchft_checkpoint_the_writer_lost_the_other_group_saves_and_a_rerun_resumes(fresh_pools, tmp_path):
    ns, _, text, marks = _run(fresh_pools, tmp_path, epochs=3, kill_at=STEPS_PER_EPOCH + 3)
    assert "1 replica group lost and replaced" in text, text
    assert ns["steps"] == 3 * STEPS_PER_EPOCH, text
    assert len({pid for pid, _, _ in _marks(marks, 0)}) == 2, text  # rank 0 was replaced and finished the cell
    saved = _saved(tmp_path)
    assert saved["step"] == 3 * STEPS_PER_EPOCH, text
    final0, final1 = (torch.load(marks / f"final{rank}.pt") for rank in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(final0, final1, strict=True)), text
    ns, _, text, marks = _run(fresh_pools, tmp_path, epochs=4)
    assert re.search(r"resuming from .*checkpoint\.pt \(epoch 3", text), text
    assert ns["steps"] == 4 * STEPS_PER_EPOCH, text
    assert not os.listdir(tmp_path / "ckpt") == [], text
