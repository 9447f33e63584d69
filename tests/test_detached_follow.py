"""A detached run followed live (nbtrain/kernel/cluster/detached_follow.py): a real writer process logs steps
while the kernel's side follows from the start; every step arrives once, in order, and the follow ends with the
run's final state."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nbtrain.kernel.cluster.detached_follow import follow
from nbtrain.wire.runfolder import RecordedState, read_manifest

pytestmark = pytest.mark.timeout(120)

STEPS = 300

WRITER = r"""
import sys, time
from nbtrain.wire.runfolder import RecordedState, RunFolder
folder = RunFolder("live", nprocs=2)
for step in range(int(sys.argv[1])):
    folder.metrics(0, [[step, time.time(), {"step": step}]])
    folder.output(1, "stdout", f"rank 1 at {step}\n")
    if step % 50 == 0:
        time.sleep(0.05)
folder.finish(RecordedState.FINISHED)
"""


def test_a_live_run_is_followed_from_its_first_step_to_its_end_with_no_gap_and_no_duplicate(tmp_path, monkeypatch):
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(STEPS)],
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        while read_manifest("live") is None:
            assert writer.poll() is None, "the writer ended before it made the run's folder"
            time.sleep(0.01)
        batches: list[list[dict]] = []
        state = follow("live", batches.append, poll_s=0.01)
        assert writer.wait(30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    events = [event for batch in batches for event in batch]
    steps = [record[0] for event in events if event["kind"] == "metrics" for record in event["records"]]
    assert state is RecordedState.FINISHED
    assert steps == list(range(STEPS))
    assert [event["text"] for event in events if event["kind"] == "output"] == [
        f"rank 1 at {step}\n" for step in range(STEPS)]
    assert len(batches) > 1  # followed while it ran, not read once at the end

