"""--max-restarts: a rank killed mid-training is restarted from the last checkpoint (2 ranks, gloo, CPU)."""

from __future__ import annotations

import pytest

from nbtrain.launch.errors import RankFailedError
from nbtrain.launch.run import PoolManager
from training_support import assert_no_own_workers, run_cell

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def pools():
    manager = PoolManager()
    yield manager
    manager.shutdown()
    assert_no_own_workers()


CELL = """
import os, signal
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
net = torch.nn.Linear(4, 2)
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data, batch_size=4))
for epoch in nbtrain.epochs(3):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        nbtrain.log(loss=loss)
        if rank == 1 and epoch == KILL_EPOCH and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    nbtrain.save_checkpoint()
steps = nbtrain.training_state().step
"""


def test_a_killed_rank_is_restarted_from_the_checkpoint(pools, tmp_path):
    cell = CELL.replace("KILL_EPOCH", "1").replace("MARKER", repr(str(tmp_path / "killed-once")))
    output: list = []
    ns, result = run_cell(pools, cell, output, checkpoint=str(tmp_path / "ckpt"), max_restarts=1, out="steps")
    text = "".join(output)
    assert "rank 1 was killed by SIGKILL" in text
    assert f"restarting the ranks from {tmp_path / 'ckpt' / 'checkpoint.pt'} (epoch 1, step 4) (restart 1 of 1)" in text
    assert "resuming from" in text
    assert ns["steps"] == 12  # 3 epochs × 4 steps, as if nothing had happened
    assert result.history.series("loss").steps == list(range(4, 12))  # the last attempt resumed at step 4
    assert any("1 restart" in note for note in result.notes)


def test_without_a_checkpoint_it_says_why_it_cannot_resume(pools, tmp_path):
    cell = CELL.replace("KILL_EPOCH", "0").replace("MARKER", repr(str(tmp_path / "killed-once")))
    output: list = []
    with pytest.raises(RankFailedError, match="rank 1 was killed by SIGKILL"):
        run_cell(pools, cell, output, checkpoint=str(tmp_path / "ckpt"), max_restarts=2)
    assert "not restarting: the cell cannot resume" in "".join(output)
    assert "holds no checkpoint yet" in "".join(output)


def test_a_python_error_is_not_restarted(pools, tmp_path):
    output: list = []
    with pytest.raises(RankFailedError, match="ZeroDivisionError"):
        run_cell(pools, "import nbtrain\nnbtrain.save_checkpoint() if False else None\n1 / 0\n", output,
                 checkpoint=str(tmp_path), max_restarts=3)
    assert "which a restart would raise again" in "".join(output)
