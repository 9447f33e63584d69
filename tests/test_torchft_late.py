"""``--ft``: a new replica group that comes after the others finished the cell is stopped, and never trains alone.

Real ranks (gloo on the CPU), a real Lighthouse and torchft Managers. Past the last step's quorum rank 0 SIGKILLs
rank 1, waits until the new rank 1 has started the cell, and finishes it. The new rank 1 has its job but no group is
left to copy the state from: its first quorum forms with it alone, at step 0. Training from there would start the
model over, alone, while the cell waits for it; it waits instead, and the kernel stops it once the others have
finished and it has not rejoined (``nbtrain/kernel/lifecycle/ft_run.py``, ``nbtrain/rank/train/ft_cell.py``).
"""

from __future__ import annotations

import re
import time

import pytest
from helpers.runhelp import Captured, run_cell
from test_torchft_cell import _marks

pytestmark = pytest.mark.timeout(300)

CELL = """
import os, signal, time, torch, nbtrain

def started(r):
    return [int(pid) for pid in open(os.path.join(MARKS, f"started{r}")).read().split()]

open(os.path.join(MARKS, f"started{rank}"), "a").write(f"{os.getpid()}\\n")
net = torch.nn.Linear(4, 2)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))
for i in range(10):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    nbtrain.log(loss=loss)
    with open(os.path.join(MARKS, f"rank{rank}"), "a") as mark:
        mark.write(f"{os.getpid()} {nbtrain.training_state().step} {time.time():.3f}\\n")
    if i == 9 and rank == LOST and len(started(LOST)) == 1:
        time.sleep(3600)  # past its last step: the other rank ends it
    if i == 9 and rank != LOST:  # past its last quorum: LOST is lost, and the other ends once the new one has started
        os.kill(started(LOST)[0], signal.SIGKILL)
        while len(started(LOST)) < 2:
            time.sleep(0.05)
steps = nbtrain.training_state().step
"""


@pytest.mark.slow
def test_torchft_late_a_new_group_that_finds_no_peer_is_stopped_without_training_alone(fresh_pools, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    output = Captured()
    began = time.monotonic()
    ns, result = run_cell(fresh_pools, CELL, {"MARKS": str(marks), "LOST": 1}, write=output, nprocs=2, ft="on",
                          out="steps", start_timeout=120)
    took = time.monotonic() - began
    text = output.text()
    assert ns["steps"] == 10, text  # rank 0 finished, its names came back
    assert re.search(r"the other ranks finished the cell before the new rank 1 could copy their state; stopped", text), text
    assert "1 replica group lost;" in text and "lost and replaced" not in text, text
    first, new = [int(pid) for pid in (marks / "started1").read_text().split()]
    assert {pid for pid, _, _ in _marks(marks, 1)} == {first}, text  # the new rank 1 never trained alone
    logged = result.history.series("loss", 1).steps if 1 in result.history.ranks("loss") else []  # lost unsent
    assert len(logged) <= 10, text  # nor logged anything
    assert took < 60, took


@pytest.mark.slow
def test_torchft_late_a_new_group_not_stopped_in_time_fails_the_cell_instead_of_hanging(fresh_pools, tmp_path,
                                                                                        monkeypatch):
    from nbtrain.kernel.lifecycle.ft_run import ReplicaWatch

    monkeypatch.setattr(ReplicaWatch, "too_late", lambda self, finished, say, now=None: False)  # the kernel's stop lost
    marks = tmp_path / "marks"
    marks.mkdir()
    cell = "import nbtrain.rank.train.ft_cell as ft_cell\nft_cell.ALONE_WAIT_S = 1.0\n" + CELL
    output = Captured()
    with pytest.raises(Exception, match="did not stop it within 1 s; it ends here rather than train alone"):
        run_cell(fresh_pools, cell, {"MARKS": str(marks), "LOST": 1}, write=output, nprocs=2, ft="on", out="steps",
                 start_timeout=120)
    first, new = [int(pid) for pid in (marks / "started1").read_text().split()]
    assert {pid for pid, _, _ in _marks(marks, 1)} == {first}, output.text()  # the new rank 1 never trained


@pytest.mark.slow
def test_torchft_late_rank_0_lost_at_the_end_its_names_come_back_from_the_group_that_finished(fresh_pools, tmp_path):
    """Rank 0's group is lost past the last quorum and its new rank is stopped: every group held the same state, so
    the cell's names come back from the first rank of the group that finished — not lost with rank 0."""
    marks = tmp_path / "marks"
    marks.mkdir()
    output = Captured()
    ns, _ = run_cell(fresh_pools, CELL + "final = [p.detach().clone() for p in model.module.parameters()]\n",
                     {"MARKS": str(marks), "LOST": 0}, write=output, nprocs=2, ft="on", out="steps, final",
                     start_timeout=120)
    text = output.text()
    assert "before the new rank 0 could copy their state; stopped" in text, text
    assert ns["steps"] == 10 and len(ns["final"]) == 2, text
