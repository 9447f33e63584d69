"""--max-restarts: a rank killed mid-training is restarted from the last checkpoint (2 ranks, gloo, CPU).

Each test starts from a pool of its own (``fresh_pools``), with no rank left over from the one before.
"""

from __future__ import annotations

import time

import pytest
from helpers.restart_cells import killed_rank_cell
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.observers.events import RunObserver

pytestmark = pytest.mark.timeout(240)


class Endings(RunObserver):
    def __init__(self) -> None:
        self.started, self.endings, self.setups = 0, [], []

    def setup(self, rank: int, facts: dict) -> None:
        self.setups.append(rank)

    def run_started(self, info) -> None:
        self.started += 1

    def run_finished(self, status: str, summary: str) -> None:
        self.endings.append(status)


def test_a_killed_rank_is_restarted_from_the_checkpoint(fresh_pools, tmp_path):
    cell = killed_rank_cell(tmp_path / "killed-once", epoch=1)
    output = Captured()
    restarted_after: list = []
    started = time.monotonic()

    def write(stream: str, text: str) -> None:
        output(stream, text)
        if "restarting the ranks" in text:
            restarted_after.append(time.monotonic() - started)

    observer = Endings()
    ns, result = run_cell(fresh_pools, cell, write=write, observers=[observer], checkpoint=str(tmp_path / "ckpt"),
                          max_restarts=1, out="steps,restart_count")
    text = output.text()
    assert "rank 1 was killed by SIGKILL" in text
    assert f"restarting the ranks from {tmp_path / 'ckpt' / 'checkpoint.pt'} (epoch 1, step 4) (restart 1 of 1)" in text
    assert "resuming from" in text
    assert ns["steps"] == 12  # 3 epochs × 4 steps, as if nothing had happened
    assert ns["restart_count"] == 1  # TORCHELASTIC_RESTART_COUNT, as torchrun's agent sets it
    for rank in (0, 1):  # the whole curve: the first attempt's saved steps, then the restart's
        assert result.history.series("loss", rank=rank).steps == list(range(12))
    assert any("1 restart" in note for note in result.notes)
    assert result.seconds >= restarted_after[0]  # the summary's time covers the first attempt too
    assert observer.started == 2 and observer.endings == ["finished"]  # no "failed" ending for the restarted attempt
    assert sorted(set(observer.setups)) == [0, 1]  # what prepare() set up reaches the observers through restarts


def test_without_a_checkpoint_it_says_why_it_cannot_resume(fresh_pools, tmp_path):
    cell = killed_rank_cell(tmp_path / "killed-once", epoch=0)
    output = Captured()
    with pytest.raises(RankFailedError, match="rank 1 was killed by SIGKILL"):
        run_cell(fresh_pools, cell, write=output, checkpoint=str(tmp_path / "ckpt"), max_restarts=2)
    assert "not restarting: the cell cannot resume" in output.text()
    assert "holds no checkpoint yet" in output.text()


def test_a_python_error_is_not_restarted(fresh_pools, tmp_path):
    output = Captured()
    with pytest.raises(RankFailedError, match="ZeroDivisionError"):
        run_cell(fresh_pools, "import nbtrain\nnbtrain.save_checkpoint() if False else None\n1 / 0\n", write=output,
                 checkpoint=str(tmp_path), max_restarts=3)
    assert "which a restart would raise again" in output.text()
