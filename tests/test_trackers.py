"""--tensorboard DIR and nbtrain.track(): the logged series written as TensorBoard events, read back with
TensorBoard's own EventAccumulator; a missing package is a usage error before any process starts."""

from __future__ import annotations

import os
import sys

import pytest
from helpers.outputs import cell_text
from helpers.restart_cells import killed_rank_cell
from helpers.runhelp import run_cell
from helpers.workers import nbtrain_workers
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import nbtrain
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

LOGGING_CELL = """
import nbtrain
for step in range(4):
    nbtrain.log(loss=10.0 * (rank + 1) - step)
nbtrain.log(step=100, acc=0.5 + rank)
"""


def scalars(directory: str) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(directory)
    events.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.slow
def test_the_notebook_writes_each_ranks_series_as_tensorboard_events(tmp_path):
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        "%%distributed 2 --cpu --no-dashboard --tensorboard tb/exp1 --keep-alive 0" + LOGGING_CELL,
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # a relative DIR: the notebook's folder
    assert "nbtrain: 2 ranks" in cell_text(nb.cells[1])
    assert sorted(os.listdir(tmp_path / "tb" / "exp1")) == ["rank0", "rank1"]
    for rank in (0, 1):
        assert scalars(str(tmp_path / "tb" / "exp1" / f"rank{rank}")) == {
            "loss": [(step, 10.0 * (rank + 1) - step) for step in range(4)],
            "acc": [(100, 0.5 + rank)],
        }


class Recorder(nbtrain.Tracker):
    def __init__(self) -> None:
        self.calls: list = []

    def run_started(self, info) -> None:
        self.calls.append(("started", info.nprocs))

    def metrics(self, rank, records) -> None:
        self.calls += [("metrics", rank, step, values) for step, _, values in records]

    def run_finished(self, status, summary) -> None:
        self.calls.append(("finished", status))


def test_a_registered_tracker_follows_every_cell_until_untracked(fresh_pools):
    tracker = nbtrain.track(Recorder())
    try:
        run_cell(fresh_pools, "import nbtrain\nnbtrain.log(step=3, loss=1.5 * rank)")
    finally:
        nbtrain.untrack(tracker)
    run_cell(fresh_pools, "import nbtrain\nnbtrain.log(loss=1.0)")
    calls = tracker.calls
    assert calls[0] == ("started", 2) and calls[-1] == ("finished", "finished") and len(calls) == 4
    assert sorted(calls[1:3]) == [("metrics", 0, 3, {"loss": 0.0}), ("metrics", 1, 3, {"loss": 1.5})]


def test_tensorboard_without_the_package_is_a_usage_error_before_any_process(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what `import tensorboard` meets where it is not installed
    running = {p.pid for p in nbtrain_workers()}  # the module's warm pool, if any
    with pytest.raises(ConfigError, match=r"--tensorboard needs the tensorboard package.*pip install 'nbtrain\[tensorboard\]'"):
        run_source("import nbtrain\nnbtrain.log(loss=1.0)", LaunchRequest(nprocs=2, cpu=True, fresh=True,
                                                                         tensorboard=str(tmp_path / "tb")), {})
    assert {p.pid for p in nbtrain_workers()} == running and not (tmp_path / "tb").exists()


def test_tensorboard_dir_that_is_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "tb").write_text("")
    with pytest.raises(ConfigError, match="is a file; give a directory"):
        resolve(LaunchRequest(nprocs=2, cpu=True, tensorboard=str(tmp_path / "tb")))


def test_a_run_restarted_from_its_checkpoint_is_one_tensorboard_run(fresh_pools, tmp_path):
    """--max-restarts: the series the restart resends from the checkpoint are not written again, so
    TensorBoard reads each rank's curve once, steps 0 to 11 (events of the first attempt past the checkpoint
    are replaced by the restart's, as TensorBoard does for a run that goes back in steps)."""
    cell = killed_rank_cell(tmp_path / "killed-once", epoch=1)
    run_cell(fresh_pools, cell, checkpoint=str(tmp_path / "ckpt"), max_restarts=1, out="steps",
             tensorboard=str(tmp_path / "tb"))
    for rank in (0, 1):
        assert [step for step, _ in scalars(str(tmp_path / "tb" / f"rank{rank}"))["loss"]] == list(range(12))


class Broken(nbtrain.Tracker):
    def metrics(self, rank, records):
        raise OSError(28, "No space left on device")


def test_a_tracker_that_raises_is_detached_with_its_error_in_words(pools, capsys):
    run_cell(pools, "import nbtrain\nnbtrain.log(loss=1.0)\n", observers=[Broken()])
    said = capsys.readouterr().err
    assert "nbtrain: Broken stopped following this run (OSError: [Errno 28] No space left on device)" in said, said


def test_nbtrains_own_follower_is_named_by_what_it_does_not_its_class(pools, capsys, tmp_path):
    from nbtrain.kernel.observers.trackers import TensorBoardTracker

    (tmp_path / "board").write_text("a file where the writer makes its folder")
    run_cell(pools, "import nbtrain\nnbtrain.log(loss=1.0)\n", observers=[TensorBoardTracker(str(tmp_path / "board"))])
    said = capsys.readouterr().err
    assert "nbtrain: the TensorBoard writer (--tensorboard) stopped following this run (FileExistsError: " in said, said
    assert "TensorBoardTracker" not in said, said
