"""nbtrain's DCP save planner: the save's side work starts once the plan is agreed and before the write, once a save,
and the planner's plan cache is its own. One process, no process group (DCP saves without one)."""

from __future__ import annotations


import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from nbtrain.rank.train.save_planner import save_planner

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class _RecordingWriter(FileSystemWriter):
    def __init__(self, path, events: list[str]) -> None:
        super().__init__(path)
        self._events = events

    def prepare_global_plan(self, plans):
        self._events.append("global plan")
        return super().prepare_global_plan(plans)

    def write_data(self, plan, planner):
        self._events.append("write")
        return super().write_data(plan, planner)


def _save(tmp_path, name: str, events: list[str], planned, part: bytes | None = None) -> None:
    state = {"model": {"weight": torch.arange(12.0).reshape(3, 4)}}
    dcp.save(state, storage_writer=_RecordingWriter(str(tmp_path / name), events), planner=save_planner(planned, part))


def test_the_side_work_starts_after_the_plan_is_agreed_and_before_the_write(tmp_path):
    events: list[str] = []
    _save(tmp_path, "one", events, lambda parts: events.append("planned"))
    assert events == ["global plan", "planned", "write"]


def test_each_save_starts_its_side_work_once_also_when_its_plan_comes_from_the_cache(tmp_path):
    for name in ("first", "second", "third"):
        events: list[str] = []
        _save(tmp_path, name, events, lambda parts, events=events: events.append("planned"))
        assert events.count("planned") == 1 and events.index("planned") < events.index("write"), (name, events)


def test_a_ranks_part_reaches_the_coordinator_with_its_plan_and_the_plan_cache_still_serves(tmp_path):
    for round_, name in enumerate(("first", "second")):  # the second save's plan comes from DCP's cache
        got: list = []
        _save(tmp_path, name, [], got.append, part=f"rank state {round_}".encode())
        assert got == [[f"rank state {round_}".encode()]]
    loaded = {"model": {"weight": torch.zeros(3, 4)}}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "second"))  # the part is not in the checkpoint's metadata
    assert torch.equal(loaded["model"]["weight"], torch.arange(12.0).reshape(3, 4))


def test_a_save_without_side_work_writes_a_checkpoint_that_loads(tmp_path):
    _save(tmp_path, "plain", [], None)
    loaded = {"model": {"weight": torch.zeros(3, 4)}}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "plain"))
    assert torch.equal(loaded["model"]["weight"], torch.arange(12.0).reshape(3, 4))
