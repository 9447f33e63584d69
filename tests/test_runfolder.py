"""A detached run's folder (nbtrain/wire/runfolder.py): written in order, followed from an offset, private,
and read safely where another user planted folders, links and files."""

from __future__ import annotations

import base64
import os
import pickle
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest

from nbtrain.wire import runfolder
from nbtrain.wire import protocol as P
from nbtrain.wire.runfolder import EventKind, RunFolder, RunFolderError, RecordedState
from helpers.attacker import needs_root, python_as_attacker


@pytest.fixture
def runs(tmp_path, monkeypatch):
    directory = tmp_path / "runs"
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(directory))
    return directory


def test_the_runs_directory_follows_jupyter_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("NBTRAIN_RUNS_DIR", raising=False)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    assert runfolder.runs_directory() == str(tmp_path / "nbtrain" / "runs")


def test_a_reader_follows_a_live_run_from_its_offset_and_sees_every_event_once_in_order(runs):
    folder = RunFolder("run-1", nprocs=2, agent_pid=4242)
    folder.started({0: 100, 1: 101})
    folder.output(0, "stdout", "hello\n")
    folder.message(0, pickle.dumps(P.Metrics(0, [(0, 1.0, {"loss": 2.0})])))
    folder.step(1)
    first, offset = runfolder.read_events("run-1")
    assert [e["kind"] for e in first] == [EventKind.STARTED.value, EventKind.OUTPUT.value, EventKind.MESSAGE.value]
    assert first[0]["ranks"] == {"0": 100, "1": 101}
    assert runfolder.list_runs()[0].step == 1

    folder.step(0)  # the last step only grows
    folder.rank_exited(1, 1, "Traceback: ...")
    folder.message(0, b"\x00raw bytes, carried unread")
    folder.finish(RecordedState.FINISHED)
    rest, end = runfolder.read_events("run-1", offset)
    assert [e["kind"] for e in rest] == ["exit", "message"]
    assert rest[0] == {"kind": "exit", "rank": 1, "code": 1, "error": "Traceback: ..."}
    assert base64.b64decode(rest[1]["data"]) == b"\x00raw bytes, carried unread"
    assert runfolder.read_events("run-1", end) == ([], end)

    (run,) = runfolder.list_runs()
    assert (run.run_id, run.state, run.agent_pid, run.nprocs, run.step) == ("run-1", RecordedState.FINISHED, 4242, 2, 1)
    assert run.ended is not None and run.ended >= run.started


def test_the_kernel_reserves_the_folder_with_the_cell_and_the_agent_writes_into_it(runs):
    path = runfolder.reserve("run-7", {"line": "2 --cpu --detach", "source": "x = 1\n"})
    assert stat.S_IMODE(os.stat(os.path.join(path, runfolder.ABOUT)).st_mode) == 0o600
    folder = RunFolder("run-7", nprocs=2)
    assert folder.path == path
    assert runfolder.read_about("run-7") == {"line": "2 --cpu --detach", "source": "x = 1\n"}
    assert runfolder.read_about("run-8") == {}
    with pytest.raises(FileExistsError):
        runfolder.reserve("run-7", {})


def test_a_line_still_being_written_is_left_for_the_next_read(runs):
    folder = RunFolder("run-2", nprocs=1)
    folder.output(0, "stdout", "a\n")
    with open(os.path.join(folder.path, runfolder.EVENTS), "ab") as log:
        log.write(b'{"kind": "out')
    events, offset = runfolder.read_events("run-2")
    assert len(events) == 1
    assert offset == len(open(os.path.join(folder.path, runfolder.EVENTS), "rb").read()) - len(b'{"kind": "out')


def test_run_folders_are_private_and_a_run_id_is_used_once(runs):
    folder = RunFolder("run-3", nprocs=1)
    assert stat.S_IMODE(os.stat(runs).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(folder.path).st_mode) == 0o700
    for name in (runfolder.MANIFEST, runfolder.EVENTS):
        assert stat.S_IMODE(os.stat(os.path.join(folder.path, name)).st_mode) == 0o600
    with pytest.raises(RunFolderError, match="not a new run folder"):
        RunFolder("run-3", nprocs=1)
    with pytest.raises(RunFolderError, match="not a run id"):
        RunFolder("../elsewhere", nprocs=1)


PLANT = r"""
import json, os, sys
runs = sys.argv[1]
os.mkdir(os.path.join(runs, "theirs"), 0o755)
manifest = {"run_id": "theirs", "state": "running", "started": 1.0, "agent_pid": 1, "nprocs": 1, "step": 3}
open(os.path.join(runs, "theirs", "manifest.json"), "w").write(json.dumps(manifest))
open(os.path.join(runs, "theirs", "events.jsonl"), "w").write('{"kind": "output"}\n')
os.symlink(sys.argv[2], os.path.join(runs, "link"))
os.mkfifo(os.path.join(runs, "fifo"))
open(os.path.join(runs, "file"), "w").write("x" * 100000)
os.mkdir(os.path.join(runs, "in-ours"), 0o777)
os.symlink("/etc/shadow", os.path.join(runs, "in-ours", "manifest.json"))
"""


@pytest.fixture
def reachable(monkeypatch):
    """A runs directory under /tmp that the attacker can reach (pytest's own folders are 0700)."""
    top = tempfile.mkdtemp(prefix="nbtrain-runfolder-")
    os.chmod(top, 0o755)
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", os.path.join(top, "runs"))
    yield Path(top)
    shutil.rmtree(top, ignore_errors=True)


@needs_root
def test_another_users_folders_links_and_files_in_the_runs_directory_are_passed_over(reachable):
    runs = reachable / "runs"
    ours = RunFolder("ours", nprocs=1)
    ours.output(0, "stdout", "mine\n")
    os.chmod(runs, 0o1777)  # as if the user had opened the folder to everyone: the reader still holds
    done = python_as_attacker(PLANT, str(runs), ours.path)
    assert done.returncode == 0, done.stderr

    assert [run.run_id for run in runfolder.list_runs()] == ["ours"]
    for planted in ("theirs", "link", "fifo", "file", "in-ours"):
        with pytest.raises(RunFolderError, match="no run"):
            runfolder.read_events(planted)
        assert runfolder.read_manifest(planted) is None
    assert runfolder.read_events("ours")[0] == [{"kind": "output", "rank": 0, "stream": "stdout", "text": "mine\n"}]
    with pytest.raises(RunFolderError, match="not a new run folder"):
        RunFolder("theirs", nprocs=1)  # never writes into the attacker's folder


@needs_root
def test_a_runs_directory_another_user_made_first_is_refused_naming_it(reachable, monkeypatch):
    shared = reachable / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    done = python_as_attacker("import os, sys; os.mkdir(sys.argv[1], 0o777)", str(shared / "runs"))
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(shared / "runs"))
    with pytest.raises(RunFolderError, match="not a folder of this user's"):
        RunFolder("run-4", nprocs=1)
    assert runfolder.list_runs() == []


def test_a_run_that_ended_a_week_ago_is_swept_and_a_running_or_recent_one_stays(runs, monkeypatch):
    now = time.time()
    for run_id, ended in (("old", now - 8 * 86400), ("recent", now - 6 * 86400)):
        folder = RunFolder(run_id, nprocs=1)
        with monkeypatch.context() as clock:
            clock.setattr(runfolder.time, "time", lambda ended=ended: ended)
            folder.finish(RecordedState.FINISHED)
    RunFolder("running", nprocs=1)
    assert runfolder.sweep_ended(now=now) == ["old"]
    assert sorted(run.run_id for run in runfolder.list_runs()) == ["recent", "running"]
    monkeypatch.setenv("NBTRAIN_RUNS_KEEP_DAYS", "1")
    assert runfolder.sweep_ended(now=now) == ["recent"]
    assert [run.run_id for run in runfolder.list_runs()] == ["running"]  # a running run is never swept
