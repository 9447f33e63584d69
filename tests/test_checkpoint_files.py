"""Checkpoint files someone else could have written: refused before anything starts, and no pickle in a checkpoint
runs code (2 ranks, gloo, CPU; the other user is a real second Unix account)."""

from __future__ import annotations

import glob
import os
import pickle
import shutil
import uuid
from unittest import mock

import pytest
import torch
from helpers.attacker import NAME, attacker, needs_root, plant, python_as_attacker
from helpers.runhelp import run_cell
from helpers.sharding import CURVE

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

pytestmark = pytest.mark.timeout(240)

SAVE = "import torch, nbtrain\nnet = torch.nn.Linear(2, 2)\nnbtrain.prepare(net)\nnbtrain.save_checkpoint()\n"
LOAD_BY_HAND = "import torch, nbtrain\nnbtrain.prepare(torch.nn.Linear(2, 2))\nnbtrain.load_checkpoint(PATH)\n"


class RunsCode:
    """Unpickling this writes ``marker``: what a planted checkpoint would do to whoever loads it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _check(folder) -> None:
    resolve(LaunchRequest(nprocs=2, cpu=True, checkpoint=str(folder)))


def test_a_checkpoint_folder_or_file_others_can_write_is_refused_before_anything_starts(pools, tmp_path):
    folder = tmp_path / "ckpt"
    run_cell(pools, SAVE, checkpoint=str(folder))
    _check(folder)  # the user's own, as saved: accepted

    os.chmod(folder, 0o777)
    with pytest.raises(ConfigError, match=f"the checkpoint folder {folder} can be written by group and others "
                                          rf"\(mode 0777\).*chmod go-w {folder}"):
        _check(folder)
    os.chmod(folder, 0o755)
    os.chmod(folder / "checkpoint.pt", 0o664)
    with pytest.raises(ConfigError, match=rf"checkpoint file {folder}/checkpoint.pt can be written by group \(mode 0664\)"):
        _check(folder)
    with pytest.raises(RankFailedError, match=r"can be written by group \(mode 0664\)"):  # by hand, in the ranks
        run_cell(pools, LOAD_BY_HAND.replace("PATH", repr(str(folder / "checkpoint.pt"))))


def test_a_sharded_checkpoints_folder_others_can_write_is_refused(pools, tmp_path):
    folder = tmp_path / "ckpt"
    run_cell(pools, CURVE.replace("EPOCHS", "1"), shard="full", checkpoint=str(folder))
    layout = glob.glob(str(folder / "checkpoint.pt.shards-*" / ".metadata"))[0]
    os.chmod(layout, 0o666)
    with pytest.raises(ConfigError, match=f"the checkpoint file {layout} can be written by group and others"):
        _check(folder)


@needs_root
def test_a_history_file_another_user_owns_or_others_can_write_is_refused(pools, tmp_path):
    """The history file holds only numbers, but it is the user's curves: another user's under its name is refused as
    any other part of the checkpoint is."""
    folder = tmp_path / "ckpt"
    run_cell(pools, SAVE + "nbtrain.log(loss=1.0)\nnbtrain.save_checkpoint()\n", checkpoint=str(folder))
    (history,) = glob.glob(str(folder / "checkpoint.pt.history-*"))
    os.chmod(history, 0o666)
    with pytest.raises(ConfigError, match=f"the checkpoint file {history} can be written by group and others"):
        _check(folder)
    os.chmod(history, 0o644)
    os.chown(history, attacker().pw_uid, attacker().pw_gid)
    with pytest.raises(ConfigError, match=f"the checkpoint file {history} belongs to {NAME}"):
        _check(folder)
    with pytest.raises(RankFailedError, match=f"belongs to {NAME}"):  # by hand, in the ranks
        run_cell(pools, LOAD_BY_HAND.replace("PATH", repr(str(folder / "checkpoint.pt"))))


def test_a_pickle_that_runs_code_in_the_users_own_checkpoint_runs_nothing(pools, tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch.save({"format": 1, "epoch": 0, "step": 0, "extra": {"x": RunsCode(str(marker))}}, folder / "checkpoint.pt")
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, SAVE, checkpoint=str(folder))
    assert "holds a reference to exec, which nbtrain does not unpickle" in str(failed.value)
    assert "torch.serialization.add_safe_globals" in str(failed.value)
    assert not marker.exists()


def test_a_pickle_in_a_sharded_checkpoints_layout_runs_nothing(pools, tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "ckpt"
    run_cell(pools, CURVE.replace("EPOCHS", "1"), shard="full", checkpoint=str(folder))
    layout = glob.glob(str(folder / "checkpoint.pt.shards-*" / ".metadata"))[0]
    with open(layout, "wb") as file:
        pickle.dump(RunsCode(str(marker)), file)
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, CURVE.replace("EPOCHS", "2"), shard="full", checkpoint=str(folder))
    assert "builtins.exec is not part of a checkpoint's layout" in str(failed.value)
    assert not marker.exists()


@pytest.fixture
def attackers_folder():
    """A folder in /tmp made by the other user, holding a checkpoint file of theirs."""
    folder = f"/tmp/nbtrain-test-{uuid.uuid4().hex[:8]}"
    made = python_as_attacker("import os, sys; os.mkdir(sys.argv[1], 0o755)", folder)
    assert made.returncode == 0, made.stderr
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_a_checkpoint_owned_by_another_user_is_refused_and_runs_nothing(pools, tmp_path, attackers_folder):
    marker = tmp_path / "ran"
    planted = os.path.join(attackers_folder, "checkpoint.pt")
    content = tmp_path / "planted.pt"
    torch.save({"format": 1, "epoch": 0, "step": 0, "extra": {"x": RunsCode(str(marker))}}, content)
    plant(planted, content.read_bytes(), mode=0o644)
    with pytest.raises(ConfigError, match=f"the checkpoint folder {attackers_folder} belongs to {NAME} "
                                          r"\(uid \d+\) \(mode 0755\), not to you.*Use a --checkpoint folder of your own"):
        _check(attackers_folder)
    with pytest.raises(RankFailedError, match=f"belongs to {NAME}.*not to you"):  # by hand, in the ranks
        run_cell(pools, LOAD_BY_HAND.replace("PATH", repr(planted)))

    mine = tmp_path / "ckpt"  # the user's own folder, holding a file of theirs
    mine.mkdir()
    shutil.copy(content, mine / "checkpoint.pt")
    os.chown(mine / "checkpoint.pt", attacker().pw_uid, attacker().pw_gid)
    with pytest.raises(ConfigError, match=f"the checkpoint file {mine}/checkpoint.pt belongs to {NAME}"):
        _check(mine)
    assert not marker.exists()


def test_a_pickle_among_a_sharded_checkpoints_values_runs_nothing(tmp_path):
    """A DCP folder whose stored value (an optimizer's lr, say) is a pickle that runs code, read as a resume reads it
    (one process, DCP's own writer and reader; torch's plain dcp.load would run it)."""
    import torch.distributed.checkpoint as dcp

    from nbtrain.rank.train import dcp_reading

    marker = tmp_path / "ran"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"optim0": {"lr": RunsCode(str(marker)), "w": torch.ones(3)}}, checkpoint_id=str(tmp_path / "f"))
    into = {"optim0": {"lr": 0.0, "w": torch.zeros(3)}}
    with pytest.raises(dcp_reading.UnexpectedContent, match="optim0.lr is not a plain value"), \
            pytest.warns(UserWarning, match="single process"):
        dcp_reading.load(into, str(tmp_path / "f"))
    assert not marker.exists()
    with pytest.warns(UserWarning, match="single process"):  # a plain value is read, once, with weights_only
        dcp.save({"optim0": {"lr": 0.25, "w": torch.ones(3)}}, checkpoint_id=str(tmp_path / "g"))
    unpickled_with = []
    real_load = torch.load

    def load(*args, weights_only=None, **kwargs):
        unpickled_with.append(weights_only)
        return real_load(*args, weights_only=weights_only, **kwargs)

    with pytest.warns(UserWarning, match="single process"), mock.patch.object(torch, "load", load):
        dcp_reading.load(into, str(tmp_path / "g"))
    assert into["optim0"]["lr"] == 0.25 and torch.equal(into["optim0"]["w"], torch.ones(3))
    assert unpickled_with and all(unpickled_with), unpickled_with  # never a second, unsafe read of the value


def test_checkpoints_saved_under_a_umask_that_lets_the_group_write_are_accepted_next_time(pools, tmp_path):
    """nbtrain writes its checkpoint files writable by the user alone, whatever the umask, so its own refusal of
    group-writable files never stops the next cell."""
    folder = tmp_path / "ckpt"
    loose = "import os\nbefore = os.umask(0o002)\ntry:\n" + "".join(
        f"    {line}\n" for line in CURVE.replace("EPOCHS", "1").splitlines()) + "finally:\n    os.umask(before)\n"
    run_cell(pools, loose, shard="full", checkpoint=str(folder))
    _check(folder)
    paths = [os.path.join(top, name) for top, dirs, files in os.walk(folder) for name in [*dirs, *files]]
    modes = {p: oct(os.stat(p).st_mode & 0o777) for p in [str(folder), *paths]}
    assert any(p.endswith(".metadata") for p in modes) and any(p.endswith("checkpoint.pt") for p in modes)
    assert all(not int(mode, 8) & 0o022 for mode in modes.values()), modes


def test_the_entries_beside_a_checkpoint_are_its_own_and_an_odd_one_is_checked_without_failing(tmp_path):
    from nbtrain.wire.checkpoint_files import ForeignCheckpointError, beside, refuse_foreign_checkpoint

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"")
    for name in ("checkpoint.pt.history-1", "checkpoint.pt.shards-4-ab", "other.pt.shards-4-ab", ".checkpoint.pt.tmp-1",
                 "checkpoint.pt.shards-8-cd"):
        (tmp_path / name).mkdir() if "shards" in name else (tmp_path / name).write_bytes(b"")
    (tmp_path / "checkpoint.pt.shards-4-ab" / ".metadata").write_bytes(b"")
    (tmp_path / "checkpoint.pt.shards-8-cd").rmdir()
    (tmp_path / "checkpoint.pt.shards-8-cd").write_bytes(b"")  # a file where a shard folder would be
    assert [os.path.basename(p) for p in beside(str(path))] == [
        "checkpoint.pt.history-1", "checkpoint.pt.shards-4-ab", "checkpoint.pt.shards-8-cd"]
    assert [os.path.basename(p) for p in beside(str(path), (".shards-",))] == [
        "checkpoint.pt.shards-4-ab", "checkpoint.pt.shards-8-cd"]
    refuse_foreign_checkpoint(str(path))  # the odd file is checked as an entry, not listed as a folder
    os.chmod(tmp_path / "checkpoint.pt.shards-4-ab" / ".metadata", 0o666)
    with pytest.raises(ForeignCheckpointError, match=r"shards-4-ab/\.metadata can be written by group and others"):
        refuse_foreign_checkpoint(str(path))
