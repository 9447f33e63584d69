"""What the ranks logged reaches the notebook's ``history`` however they stop.

* A preemption notice (SIGTERM to a rank) in a cell that loops over ``nbtrain.epochs()`` without a prepared loader:
  the notice's checkpoint ends an epoch, so it is saved at the epoch's end, with everything the epoch logged after
  its last step; run again, the cell resumes and ``history`` holds every epoch's value once (through a real kernel).
* Another rank fails while a rank logs: the kernel's SIGTERM makes the rank send what it had buffered before it
  goes, so its series ends where its logging ended — also when many of its messages wait unread as it is stopped
  (the kernel reads a stopped rank's channel to its end, not only its pipes).
"""

from __future__ import annotations

import re

import pytest
from helpers.kernelhelp import nbtrain_kernel
from helpers.preempt_cells import progress, signal_at_step
from helpers.runhelp import run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.observers.history import RunOutcome

pytestmark = pytest.mark.timeout(300)

_EPOCHS_CELL = """%%distributed 2 --cpu --checkpoint {ckpt}
import os, time, torch, nbtrain
net = torch.nn.Linear(4, 2)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
x = torch.randn(8, 4)
for epoch in nbtrain.epochs(30):
    loss = model(x).pow(2).mean()
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
    nbtrain.log(epoch=epoch)
    with open(os.path.join({marks!r}, f"rank{{rank}}"), "w") as mark:
        mark.write(f"{{os.getpid()}} {{nbtrain.training_state().step}} {{os.getppid()}}")
    time.sleep({sleep})
"""


@pytest.mark.slow  # a real kernel
def test_a_preempted_epoch_loop_without_a_loader_keeps_every_epochs_value_through_the_rerun(tmp_path):
    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    marks.mkdir()
    cell = _EPOCHS_CELL.format(ckpt=ckpt, marks=str(marks), sleep=0.2)
    with nbtrain_kernel() as kernel:
        sent = signal_at_step(marks, rank=1, step=10)
        reply, out = kernel.execute(cell, timeout=120)
        assert reply["status"] == "error" and sent, out
        saved = int(re.search(r"checkpoint at step (\d+) saved", out).group(1))
        assert sent["step"] <= saved <= sent["after"] + 2, (sent, out)
        assert progress(marks, 0)[1] == saved  # no step after the checkpoint
        before = kernel.run("print(len(history['epoch']), list(history['epoch'])[-1])").split()
        assert before == [str(saved), f"{saved - 1}.0"], before  # the stopped run: each epoch up to the checkpoint's
        out = kernel.run(cell.replace("time.sleep(0.2)", "time.sleep(0.01)"), timeout=120)
        assert f"resuming from {ckpt / 'checkpoint.pt'}" in out, out
        shown = kernel.run("print([int(v) for v in history['epoch']])")
    assert shown.strip() == str(list(range(30)))  # every epoch once: none lost at the notice, none repeated


# rank 0 logs until rank 1 fails; with ``each_sent``, every value in a message of its own, so that many wait unread
# while the kernel stops the ranks (it must read a stopped rank's channel to its end, not only its pipes)
@pytest.mark.parametrize("each_sent", [False, True], ids=["buffered", "a-message-a-value"])
def test_a_rank_stopped_after_another_ranks_failure_sends_what_it_logged_last(fresh_pools, tmp_path, each_sent):
    last = tmp_path / "last"
    send = "metrics._sink.flush()" if each_sent else "pass"
    cell = f"""
        import os, time, nbtrain
        from nbtrain.rank.train import metrics
        if rank == 1:
            time.sleep(1.5)
            raise RuntimeError("rank 1 fails")
        mark = os.open({str(last)!r}, os.O_WRONLY | os.O_CREAT)
        for i in range(100000):
            nbtrain.log(i=i)
            {send}
            os.pwrite(mark, f"{{i:12d}}".encode(), 0)  # one write: never seen half-done
            time.sleep(0.002)
    """
    outcome = RunOutcome()
    with pytest.raises(RankFailedError, match="rank 1 fails"):
        run_cell(fresh_pools, cell, outcome=outcome)
    logged = outcome.history.series("i", rank=0)
    assert logged.values[-1] >= int(last.read_text()), (logged.values[-1], last.read_text())
    assert logged.steps == list(range(len(logged.steps)))  # in order, none missing
