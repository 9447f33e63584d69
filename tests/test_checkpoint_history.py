"""A checkpoint's logged series in a history file each save appends to: the format, the account of what each save
sends (a failed save, a new writer), and in real ranks (2, gloo) saves that write only the new points, a resume that
goes on appending, a checkpoint that holds its series itself (as nbtrain wrote them before), and a damaged file."""

from __future__ import annotations

import os
from array import array

import pytest
import torch
from helpers.runhelp import Captured, run_cell

from nbtrain.rank.train.history_file import HEADER, HistoryFileError, append, encode, read_rank
from nbtrain.rank.train.history_saves import HistoryFile, SavedHistory
from nbtrain.rank.train.metrics import LoggedSeries

pytestmark = pytest.mark.timeout(240)


def delta(start: int, steps: list[int]) -> tuple[int, array, array, array]:
    return start, array("q", steps), array("d", [s + 0.5 for s in steps]), array("d", [s * 2.0 for s in steps])


def test_a_chunk_replaces_its_series_from_its_start_and_other_ranks_chunks_are_skipped(tmp_path):
    path = str(tmp_path / "h")
    length = append(path, 0, [encode(0, {"loss": delta(0, [0, 1, 2])}), encode(1, {"loss": delta(0, [7])})])
    length = append(path, length, [encode(0, {"loss": delta(2, [2, 3]), "acc": delta(0, [1])})])  # 2 sent again
    mine = read_rank(path, length, 0)
    assert list(mine["loss"][0]) == [0, 1, 2, 3] and list(mine["loss"][2]) == [0.0, 2.0, 4.0, 6.0]
    assert list(mine["loss"][1]) == [0.5, 1.5, 2.5, 3.5] and list(mine["acc"][0]) == [1]
    assert list(read_rank(path, length, 1)["loss"][0]) == [7]
    assert list(read_rank(path, length, 0, known={"loss"})) == ["acc"], "a series the rank has is left unread"
    assert read_rank(path, 0, 0) == {}


def test_a_write_keeps_only_what_the_last_checkpoint_names(tmp_path):
    path = str(tmp_path / "h")
    named = append(path, 0, [encode(0, {"loss": delta(0, [0, 1])})])
    append(path, named, [encode(0, {"loss": delta(2, [2])})])  # a save whose checkpoint never went in place
    length = append(path, named, [encode(0, {"loss": delta(2, [2, 3])})])  # the next one sends those points again
    assert list(read_rank(path, length, 0)["loss"][0]) == [0, 1, 2, 3]
    assert list(read_rank(path, named, 0)["loss"][0]) == [0, 1], "the older checkpoint still reads its own part"


def test_a_link_or_a_short_file_is_never_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x" * 100)
    os.symlink(target, tmp_path / "link")
    with pytest.raises(OSError):
        append(str(tmp_path / "link"), 0, [encode(0, {"loss": delta(0, [0])})])
    with pytest.raises(HistoryFileError, match="shorter than the 500 bytes"):
        append(str(target), 500, [])
    assert target.read_bytes() == b"x" * 100


@pytest.mark.parametrize("damage", ["cut", "garbage", "gap", "short"])
def test_a_damaged_history_file_is_an_error_that_names_it(tmp_path, damage):
    path = str(tmp_path / "h")
    length = append(path, 0, [encode(0, {"loss": delta(0, [0, 1, 2])})])
    if damage == "cut":
        os.truncate(path, length - 5)
    elif damage == "garbage":
        with open(path, "r+b") as file:
            file.write(b"XXXX")
    elif damage == "gap":
        length = append(path, length, [encode(0, {"loss": delta(5, [5])})])
    with pytest.raises(HistoryFileError, match=path):
        read_rank(path, length + (HEADER.size if damage == "short" else 0), 0)


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class Ranks:
    """Two ranks' logged series and accounts, and the save protocol between them, without processes: rank 0's
    plan reaches both, each sends what its account says, rank 0 writes and (unless the save fails) puts it in place."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.logged = [LoggedSeries(), LoggedSeries()]
        self.accounts = [SavedHistory(), SavedHistory()]
        self.sent_points = 0

    def log(self, *steps: int) -> None:
        for logged in self.logged:
            logged.add([(step, float(step), {"loss": float(step)}) for step in steps])

    def save(self, writer: int = 0, fails: bool = False) -> dict:
        plan = self.accounts[writer].plan(self.target)
        entries = []
        for rank, (logged, account) in enumerate(zip(self.logged, self.accounts, strict=True)):
            new = logged.since(account.sent_by(self.target, plan))
            account.sending(self.target, plan, logged.lengths())
            self.sent_points += sum(len(columns[1]) for columns in new.values())
            entries.append({"rank": rank, "history": as_tensor(encode(rank, new))})
        snapshot = self.accounts[writer].write(self.target, plan, {"ranks": entries})
        if not fails:
            self.accounts[writer].in_place(self.target)
        return snapshot["history"]

    def read(self, entry: dict, rank: int) -> list[int]:
        path = os.path.join(os.path.dirname(self.target), HistoryFile.from_entry(entry).name(self.target))
        return list(read_rank(path, entry["length"], rank).get("loss", ([],))[0])


def test_each_save_sends_what_was_logged_since_the_last_one_that_reached_the_file(tmp_path):
    ranks = Ranks(str(tmp_path / "checkpoint.pt"))
    ranks.log(*range(1000))
    first = ranks.save()
    ranks.log(1000, 1001)
    ranks.save(fails=True)  # its points are sent again by the next save
    ranks.log(1002)
    third = ranks.save()
    assert first["file"] == third["file"] and ranks.sent_points == 2 * (1000 + 2 + 3)
    assert [ranks.read(third, rank) for rank in (0, 1)] == [list(range(1003))] * 2
    assert ranks.read(first, 0) == list(range(1000)), "the first checkpoint's part of the file is unchanged"


def test_a_new_writer_starts_its_own_file_and_every_rank_sends_everything(tmp_path):
    ranks = Ranks(str(tmp_path / "checkpoint.pt"))
    ranks.log(*range(10))
    ranks.save(writer=0)
    ranks.log(10)
    other = ranks.save(writer=1)  # another replica group writes now (--ft): it knows no file
    assert [ranks.read(other, rank) for rank in (0, 1)] == [list(range(11))] * 2


def test_a_resume_goes_on_appending_to_the_file_its_checkpoint_names(tmp_path):
    ranks = Ranks(str(tmp_path / "checkpoint.pt"))
    ranks.log(*range(10))
    saved = ranks.save()
    resumed = Ranks(ranks.target)  # new ranks, which read the file back
    for rank, (logged, account) in enumerate(zip(resumed.logged, resumed.accounts, strict=True)):
        steps = ranks.read(saved, rank)
        logged.add([(step, float(step), {"loss": float(step)}) for step in steps])
        account.resumed(resumed.target, HistoryFile.from_entry(saved), {"loss": len(steps)})
    resumed.log(10, 11)
    later = resumed.save()
    assert later["file"] == saved["file"] and resumed.sent_points == 2 * 2
    assert [resumed.read(later, rank) for rank in (0, 1)] == [list(range(12))] * 2


def test_a_rank_that_sends_what_is_not_its_own_fails_the_save(tmp_path):
    account = SavedHistory()
    target = str(tmp_path / "checkpoint.pt")
    plan = account.plan(target)
    forged = as_tensor(encode(0, {"loss": delta(0, [0])}))
    with pytest.raises(HistoryFileError, match="rank 1"):
        account.write(target, plan, {"ranks": [{"rank": 0}, {"rank": 1, "history": forged}]})
    with pytest.raises(HistoryFileError, match="bytes"):
        account.write(target, plan, {"ranks": [{"rank": 0, "history": [1, 2, 3]}]})


LOGS_THEN_SAVES = """
import torch, nbtrain
net = torch.nn.Linear(4, 4)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(FIRST):
    nbtrain.log(loss=float(step), step=step)
nbtrain.save_checkpoint()
for step in range(FIRST, FIRST + 5):
    nbtrain.log(loss=float(step), step=step)
nbtrain.save_checkpoint()
"""


def history_of(folder) -> tuple[str, int]:
    saved = torch.load(folder / "checkpoint.pt", weights_only=True)
    return saved["history"]["file"], saved["history"]["length"]


def test_saves_write_only_the_new_points_and_a_resumed_run_appends_to_the_same_file(pools, tmp_path):
    run_cell(pools, LOGS_THEN_SAVES.replace("FIRST", "20000"), checkpoint=str(tmp_path))
    name, length = history_of(tmp_path)
    assert os.path.getsize(tmp_path / "checkpoint.pt") < 64 * 1024, "the checkpoint file holds no series"
    point_bytes = 2 * 20005 * 24  # two ranks' loss, 24 bytes a point
    assert point_bytes < length < point_bytes + 2 * 4 * 64, "every point once, and a few chunk headers"
    assert [n for n in os.listdir(tmp_path) if ".history-" in n] == [name]

    output = Captured()
    _, result = run_cell(pools, LOGS_THEN_SAVES.replace("range(FIRST)", "range(0)").replace("FIRST", "20005"),
                         write=output, checkpoint=str(tmp_path))
    assert "resuming from" in output.text()
    for rank in (0, 1):
        assert result.history.series("loss", rank=rank).steps == list(range(20010)), "the whole curve, continued"
    again, longer = history_of(tmp_path)
    assert again == name and length < longer < length + 2 * 2 * (5 * 24 + 64), "two saves of 5 points, appended"


def test_a_checkpoint_that_holds_its_series_itself_resumes_with_them(pools, tmp_path):
    run_cell(pools, LOGS_THEN_SAVES.replace("FIRST", "3"), checkpoint=str(tmp_path))
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    name = saved.pop("history")["file"]
    for entry in saved["ranks"]:  # as nbtrain wrote checkpoints before their series had a file of their own
        steps, times, values = read_rank(str(tmp_path / name), os.path.getsize(tmp_path / name), entry["rank"])["loss"]
        entry["metric_history"] = {"loss": {"steps": torch.tensor(list(steps), dtype=torch.int64),
                                            "times": torch.tensor(list(times), dtype=torch.float64),
                                            "values": torch.tensor(list(values), dtype=torch.float64)}}
    os.remove(tmp_path / name)
    torch.save(saved, tmp_path / "checkpoint.pt")
    _, result = run_cell(pools, LOGS_THEN_SAVES.replace("range(FIRST)", "range(0)").replace("FIRST", "8"),
                         checkpoint=str(tmp_path))
    assert result.history.series("loss", rank=1).steps == list(range(13))
    fresh, _ = history_of(tmp_path)
    assert read_rank(str(tmp_path / fresh), os.path.getsize(tmp_path / fresh), 1)["loss"][0].tolist() == list(range(13))


def test_a_damaged_history_file_costs_the_curves_not_the_resume(pools, tmp_path):
    run_cell(pools, LOGS_THEN_SAVES.replace("FIRST", "3"), checkpoint=str(tmp_path))
    name, length = history_of(tmp_path)
    os.truncate(tmp_path / name, length // 2)
    output = Captured()
    ns, result = run_cell(pools, LOGS_THEN_SAVES.replace("range(FIRST)", "range(0)").replace("FIRST", "8") +
                          "step = nbtrain.training_state().step\n", write=output, checkpoint=str(tmp_path), out="step")
    assert "resuming from" in output.text() and "cannot be read" in output.text()
    assert result.history.series("loss", rank=0).steps == list(range(8, 13)), "only what this run logged"
    fresh, _ = history_of(tmp_path)
    assert fresh != name and not os.path.exists(tmp_path / name), "a new file, and the damaged one removed"


LOADS_THE_BEST_AT_THE_END = """
import torch, nbtrain
net = torch.nn.Linear(4, 4)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(10):
    nbtrain.log(loss=float(step))
    if step == 4:
        nbtrain.save_checkpoint(BEST)
nbtrain.load_checkpoint(BEST)   # the best model back, twice over
nbtrain.load_checkpoint(BEST)
nbtrain.save_checkpoint()
"""


def test_a_checkpoint_loaded_after_the_cell_logged_adds_no_point_to_history(pools, tmp_path):
    best = str(tmp_path / "best.pt")
    _, result = run_cell(pools, LOADS_THE_BEST_AT_THE_END.replace("BEST", repr(best)), checkpoint=str(tmp_path / "run"))
    for rank in (0, 1):
        assert result.history.series("loss", rank=rank).steps == list(range(10)), "each point once"
    name, length = history_of(tmp_path / "run")
    assert read_rank(str(tmp_path / "run" / name), length, 1)["loss"][0].tolist() == list(range(10))
