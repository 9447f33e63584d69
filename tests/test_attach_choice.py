"""Which run ``%distributed_attach [RUN]`` means (nbtrain/kernel/cluster/detached_runs.py), over real run folders."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers.attacker import needs_root, python_as_attacker

from nbtrain.kernel.cluster.detached_runs import AttachChoiceError, choose_run
from nbtrain.wire.runfolder import STARTING_WITHIN_S, RecordedState, RunFolder, reserve


@pytest.fixture
def runs(tmp_path, monkeypatch):
    directory = tmp_path / "runs"
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(directory))
    return directory


def _finished(run_id: str) -> RunFolder:
    folder = RunFolder(run_id, nprocs=2)
    folder.finish(RecordedState.FINISHED)
    return folder


def test_with_no_id_the_only_running_run_is_chosen_over_later_finished_ones(runs):
    RunFolder("training", nprocs=2).step(7)
    _finished("later")
    assert choose_run().run_id == "training"


def test_an_attach_right_after_the_cell_waits_for_the_starting_run_instead_of_finding_none(runs):
    """The detached cell returns once the kernel reserved the folder; the agent writes the manifest a moment
    later. An attach in between chose the last finished run, or said there was none."""
    import threading
    import time

    _finished("earlier")
    reserve("starting", {"source": "%%distributed 2 --detach"})
    threading.Timer(0.5, lambda: RunFolder("starting", nprocs=2)).start()  # the agent, a moment later
    began = time.monotonic()
    assert choose_run().run_id == "starting"
    assert 0.3 < time.monotonic() - began < 5


def test_a_folder_whose_agent_never_started_delays_no_attach(runs):
    import time

    _finished("earlier")
    path = reserve("abandoned", {"source": "%%distributed 2 --detach"})
    old = time.time() - STARTING_WITHIN_S - 1
    os.utime(os.path.join(path, "cell.json"), (old, old))
    began = time.monotonic()
    assert choose_run().run_id == "earlier"
    assert time.monotonic() - began < 1


def test_with_no_run_running_the_most_recently_started_finished_one_is_chosen(runs):
    _finished("first")
    _finished("second")
    assert choose_run().run_id == "second"


def test_several_running_runs_stop_the_attach_with_a_table_asking_for_the_id(runs):
    RunFolder("alpha", nprocs=2)
    RunFolder("beta", nprocs=2)
    with pytest.raises(AttachChoiceError) as refused:
        choose_run()
    message = str(refused.value)
    assert "2 detached runs are running; name one: %distributed_attach RUN_ID" in message
    assert "state" in message and "step" in message
    assert "alpha" in message and "beta" in message and "running" in message


def test_a_named_run_is_chosen_and_an_unknown_one_is_refused_listing_the_runs(runs):
    RunFolder("alpha", nprocs=2)
    RunFolder("beta", nprocs=2)
    assert choose_run("alpha").run_id == "alpha"
    with pytest.raises(AttachChoiceError, match=r"No detached run 'gamma' of yours\.\n.*\nalpha"):
        choose_run("gamma")


def test_no_runs_at_all_say_how_to_start_one(runs):
    with pytest.raises(AttachChoiceError, match="start one with %%distributed N --detach"):
        choose_run()


PLANT_RUNNING = r"""
import json, os, sys
os.mkdir(os.path.join(sys.argv[1], "theirs"), 0o755)
manifest = {"run_id": "theirs", "state": "running", "started": 9e9, "agent_pid": 1, "nprocs": 1, "step": 3}
open(os.path.join(sys.argv[1], "theirs", "manifest.json"), "w").write(json.dumps(manifest))
"""

LIST_THEIRS = r"""
import os, sys
try:
    print(os.listdir(sys.argv[1]))
    print(open(os.path.join(sys.argv[1], "ours", "manifest.json")).read())
except PermissionError as error:
    print("refused", error)
"""


@pytest.fixture
def reachable(monkeypatch):
    """A runs directory under /tmp that the attacker can reach (pytest's own folders are 0700)."""
    top = tempfile.mkdtemp(prefix="nbtrain-attach-")
    os.chmod(top, 0o755)
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", os.path.join(top, "runs"))
    yield Path(top)
    shutil.rmtree(top, ignore_errors=True)


@needs_root
def test_a_run_another_user_planted_is_never_chosen_and_ours_are_not_listed_to_them(reachable):
    runs = reachable / "runs"
    _finished("ours")
    seen = python_as_attacker(LIST_THEIRS, str(runs))
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.startswith("refused") and "ours" not in seen.stdout
    os.chmod(runs, 0o1777)  # as if the user had opened the folder to everyone: the choice still holds
    planted = python_as_attacker(PLANT_RUNNING, str(runs))
    assert planted.returncode == 0, planted.stderr
    assert choose_run().run_id == "ours"  # their "running" run would otherwise be the one chosen
    with pytest.raises(AttachChoiceError, match="No detached run 'theirs' of yours"):
        choose_run("theirs")
