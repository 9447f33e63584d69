"""One restart rule for every supervisor (``wire/restart_policy.py``), and a detached run's decisions read back
from its record as a following kernel reads them (``runfolder.restart_decision``)."""

from __future__ import annotations

import threading
import time

import pytest

from nbtrain.wire import runfolder
from nbtrain.wire.restart_policy import FailureFacts, RestartPolicy, first_failure, why_not_restart
from nbtrain.wire.runfolder import RecordedState, RunFolder


@pytest.fixture
def policy(tmp_path) -> RestartPolicy:
    (tmp_path / "checkpoint.pt").write_bytes(b"saved")
    return RestartPolicy(2, str(tmp_path), str(tmp_path / "checkpoint.pt"))


def test_a_rank_that_died_is_restarted_and_one_that_raised_is_not(policy):
    assert why_not_restart(FailureFacts(1, exit_code=-9), 0, policy) is None
    assert why_not_restart(FailureFacts(1, exit_code=3), 1, policy) is None
    raised = why_not_restart(FailureFacts(1, error_type="ValueError", error_message="bad"), 0, policy)
    assert raised is not None and "rank 1 raised ValueError" in raised
    assert why_not_restart(FailureFacts(1, exit_code=-9), 2, policy) == "--max-restarts 2 used up"
    assert "different collectives" in why_not_restart(FailureFacts(0, diagnosed=True), 0, policy)


def test_without_a_checkpoint_it_says_the_cell_cannot_resume(tmp_path):
    empty = RestartPolicy(1, str(tmp_path), str(tmp_path / "checkpoint.pt"))
    assert "holds no checkpoint yet" in why_not_restart(FailureFacts(0, exit_code=-9), 0, empty)


def test_the_death_comes_first_not_the_communication_error_it_caused(policy):
    peer_error = FailureFacts(0, error_type="RuntimeError", error_message="[gloo/transport] Connection closed by peer")
    died = FailureFacts(1, exit_code=-9)
    assert first_failure([peer_error, died]) == died
    assert why_not_restart(first_failure([peer_error, died]), 0, policy) is None


def test_a_following_reader_gets_each_attempts_decision_in_turn(tmp_path):
    folder = RunFolder("run-1", 2, directory=str(tmp_path))
    folder.restart(1, resumes="ckpt (epoch 1, step 2)")
    folder.restart(0, reason="--max-restarts 1 used up")
    assert runfolder.restart_decision("run-1", 0, directory=str(tmp_path)) == (None, "ckpt (epoch 1, step 2)")
    assert runfolder.restart_decision("run-1", 1, directory=str(tmp_path)) == ("--max-restarts 1 used up", "")


def test_a_reader_waits_for_the_decision_and_a_run_that_ends_without_one_is_said(tmp_path):
    folder = RunFolder("run-2", 2, directory=str(tmp_path))
    threading.Timer(0.3, lambda: folder.restart(1, resumes="ckpt")).start()
    began = time.monotonic()
    assert runfolder.restart_decision("run-2", 0, directory=str(tmp_path)) == (None, "ckpt")
    assert time.monotonic() - began >= 0.25
    folder.finish(RecordedState.FAILED)
    assert runfolder.restart_decision("run-2", 1, directory=str(tmp_path)) == ("the run ended (failed)", "")
