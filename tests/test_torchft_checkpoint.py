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
from test_torchft_cell import _marks, waiting_for_the_new

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


def _run(pools, tmp_path, epochs: int, kill_at: int = -1, cell: str = CELL):
    marks = tmp_path / f"marks{epochs}"
    marks.mkdir()
    output = Captured()
    ns, result = run_cell(pools, cell, {"MARKS": str(marks), "EPOCHS": epochs, "KILL_AT": kill_at}, write=output,
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
    # rank 1 waits at step 20 until the new rank 0 has started: it rejoins however long it takes to start
    cell = waiting_for_the_new(CELL, lost=(0,), at=20)
    ns, _, text, marks = _run(fresh_pools, tmp_path, epochs=3, kill_at=STEPS_PER_EPOCH + 3, cell=cell)
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


HSDP_CELL = CELL.replace("torch.save([p.detach() for p in model.module.parameters()]",
                         "torch.save([p.to_local().detach().clone() for p in model.parameters()]")


@pytest.mark.slow
@pytest.mark.parametrize("in_background", [False, True], ids=["sync", "checkpoint-async"])
def test_torchft_checkpoint_hsdp_one_group_writes_the_shards_and_both_groups_resume_them(fresh_pools, tmp_path,
                                                                                        in_background):
    """``--shard hybrid --ft replicas=2`` on 4 ranks: one group's 2 ranks write the DCP folder (also in the
    background, with ``--checkpoint-async``), and on the rerun each group's ranks read their slices from it."""
    def run(epochs: int):
        marks = tmp_path / f"marks{epochs}"
        marks.mkdir()
        output = Captured()
        ns, _ = run_cell(fresh_pools, HSDP_CELL, {"MARKS": str(marks), "EPOCHS": epochs, "KILL_AT": -1},
                         write=output, nprocs=4, ft="replicas=2", shard="hybrid", checkpoint=str(tmp_path / "ckpt"),
                         checkpoint_async=in_background, out="steps", start_timeout=120)
        return ns, output.text(), marks

    steps_per_epoch = 64 // 4 // 4  # each rank reads a quarter, in batches of 4
    ns, text, _ = run(1)
    saved = _saved(tmp_path)
    assert [entry["rank"] for entry in saved["ranks"]] == [0, 1], saved["ranks"]  # the first group's two ranks
    assert len([f for f in os.listdir(tmp_path / "ckpt") if ".shards-" in f]) == 1, os.listdir(tmp_path / "ckpt")
    ns, text, marks = run(2)
    assert "resuming from" in text and ns["steps"] == 2 * steps_per_epoch, text
    for rank in range(4):
        assert [step for _, step, _ in _marks(marks, rank)][0] == steps_per_epoch + 1, (rank, text)
    finals = [torch.load(marks / f"final{rank}.pt") for rank in range(4)]
    for mine, peer in ((0, 2), (1, 3)):  # the same slices in both groups
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(finals[mine], finals[peer], strict=True)), text


@pytest.mark.slow
def test_torchft_checkpoint_every_group_lost_restarts_from_the_checkpoint_with_max_restarts(fresh_pools, tmp_path):
    """With no group left to copy from, --ft gives the run up, and --max-restarts starts it again from the last
    checkpoint, as without --ft."""
    marks = tmp_path / "marks"
    marks.mkdir()
    kill_all = ('if step == KILL_AT and rank == 0 and os.environ.get("NBTRAIN_FT_ATTEMPT", "0") == "0":\n'
                '            os.kill(os.getpid(), signal.SIGKILL)')
    assert kill_all in CELL
    cell = CELL.replace(kill_all, 'if step == KILL_AT and not os.path.exists(os.path.join(MARKS, "killed")):\n'
                                  '            open(os.path.join(MARKS, "killed"), "w").close()\n'
                                  '            os.kill(int(open(os.path.join(MARKS, f"rank{1 - rank}")).readline().split()[0]), '
                                  'signal.SIGKILL)\n'
                                  '            os.kill(os.getpid(), signal.SIGKILL)')
    output = Captured()
    ns, _ = run_cell(fresh_pools, cell, {"MARKS": str(marks), "EPOCHS": 3, "KILL_AT": STEPS_PER_EPOCH + 4},
                     write=output, nprocs=2, ft="on", checkpoint=str(tmp_path / "ckpt"), max_restarts=1, out="steps",
                     start_timeout=120)
    text = output.text()
    assert "no other replica group is left to copy the state from, so the run fails" in text, text
    assert re.search(r"restarting the ranks from .*checkpoint\.pt \(epoch 1, step 8\) \(restart 1 of 1\)", text), text
    assert ns["steps"] == 3 * STEPS_PER_EPOCH, text
    assert _saved(tmp_path)["step"] == 3 * STEPS_PER_EPOCH


@pytest.mark.slow
def test_torchft_checkpoint_a_preemption_notice_is_saved_by_one_group_at_the_agreed_step(fresh_pools, tmp_path):
    from helpers.preempt_cells import progress, signal_at_step, training_cell

    from nbtrain.kernel.diagnostics.failures import RankFailedError

    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    cell = training_cell(marks, epochs=3, samples=64, step_s=0.2)  # 8 steps an epoch per rank
    sent = signal_at_step(marks, rank=1, step=11)
    output = Captured()
    with pytest.raises(RankFailedError, match="checkpoint at step \\d+ saved"):
        run_cell(fresh_pools, cell, write=output, checkpoint=str(ckpt), ft="on", start_timeout=120)
    saved = torch.load(ckpt / "checkpoint.pt", weights_only=True)
    assert sent["step"] <= saved["step"] <= sent["after"] + 2, (sent, saved["step"], output.text())
    assert progress(marks, 0)[1] == saved["step"] == progress(marks, 1)[1]  # no group stepped past it
    assert [entry["rank"] for entry in saved["ranks"]] == [0]  # written by one group
    assert "lost" not in output.text(), output.text()  # the ranks the kernel stopped were no replica group's loss
