"""Preemption notices: a checkpoint at the next step, then the machine goes — and the run goes on from there.

On one machine (2 CPU ranks, gloo): SIGTERM to a rank from outside (a container stopping) makes every rank save
at the next step boundary and the cell end saying why; running the cell again resumes, and the whole curve is
the uninterrupted run's. Without ``--checkpoint`` the notice is said at once with how to set one; a notice during
a checkpoint write leaves that checkpoint whole. The node agent's metadata poller reads the three clouds' formats
from an HTTP server on 127.0.0.1; emulated nodes (``tests/test_preemption_nodes.py``) carry the rest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

from datetime import datetime

import pytest
import torch
from helpers.metadata import PATHS, MetadataServer, ScriptedServer
from helpers.preempt_cells import BLOCKS, RECLAIMED_CELL, progress, signal_at_step, training_cell
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve
from nbtrain.kernel.ranks.channel import Channel
from nbtrain.wire import protocol as P
from nbtrain.node.notices import READ_DEADLINE_S, Notices, PreemptionURLError, check_url, cloud_of, read_once

pytestmark = pytest.mark.timeout(240)


def _checkpoint_step(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["step"]


def test_preempt_sigterm_to_a_rank_saves_at_the_next_step_and_the_cell_ends_saying_why(fresh_pools, tmp_path):
    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    cell = training_cell(marks, epochs=3, samples=64, step_s=0.2)  # 8 steps an epoch per rank, 24 in all
    sent = signal_at_step(marks, rank=1, step=11)  # mid-epoch 1: its end-of-epoch save is not the one
    output = Captured()
    with pytest.raises(RankFailedError) as failed:
        run_cell(fresh_pools, cell, write=output, checkpoint=str(ckpt))
    text, report = output.text(), str(failed.value)
    assert re.search(r"nbtrain: rank 1 got SIGTERM from outside at \d\d:\d\d:\d\d \(the container or job is being "
                     r"stopped\); saving a checkpoint at the next step \(within 25 s, --preemption-grace\)", text), text
    saved = _checkpoint_step(ckpt / "checkpoint.pt")
    assert sent["step"] <= saved <= sent["after"] + 2, (sent, saved)  # the step in progress, or the next
    assert re.search(rf"checkpoint at step {saved} saved in \d+\.\d+ s \(\d+\.\d+ s after the notice\); the ranks were "
                     rf"stopped; run the cell again to resume from {re.escape(str(ckpt / 'checkpoint.pt'))}", report), report
    assert progress(marks, 0)[1] == saved and progress(marks, 1)[1] == saved  # no step after the checkpoint

    # again, as the message says: the run resumes there, and the curve is the uninterrupted run's
    quick = cell.replace("time.sleep(0.2)", "time.sleep(0.01)")
    ns, resumed = run_cell(fresh_pools, quick, checkpoint=str(ckpt), out="steps")
    ns_whole, whole = run_cell(fresh_pools, quick, checkpoint=str(tmp_path / "whole"), out="steps")
    assert ns["steps"] == ns_whole["steps"] == 24
    curve, expected = resumed.history.series("loss", rank=0), whole.history.series("loss", rank=0)
    assert curve.steps == list(range(24))  # no step repeated, none missing
    assert curve.values == pytest.approx(expected.values, abs=1e-6)


def test_preempt_a_sharded_run_saves_its_shards_at_the_next_step_and_resumes_from_them(fresh_pools, tmp_path):
    """--shard (FSDP2 on gloo): the notice's checkpoint is the sharded DCP one, and the cell resumes from it."""
    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    cell = training_cell(marks, epochs=2, samples=32, step_s=0.2, model=BLOCKS)  # 4 steps an epoch per rank
    sent = signal_at_step(marks, rank=1, step=5)
    with pytest.raises(RankFailedError) as failed:
        run_cell(fresh_pools, cell, checkpoint=str(ckpt), shard="full")
    state = torch.load(ckpt / "checkpoint.pt", map_location="cpu", weights_only=False)
    saved = state["step"]
    assert sent["step"] <= saved <= sent["after"] + 2, (sent, saved)
    assert list(ckpt.glob(f"checkpoint.pt.shards-{saved}-*")), list(ckpt.iterdir())  # each rank's shards
    assert f"checkpoint at step {saved} saved" in str(failed.value)
    quick = cell.replace("time.sleep(0.2)", "time.sleep(0.01)")
    ns, resumed = run_cell(fresh_pools, quick, checkpoint=str(ckpt), shard="full", out="steps")
    assert ns["steps"] == 8 and resumed.history.series("loss", rank=0).steps == list(range(8))


def test_preempt_sigterm_to_a_ranks_whole_process_group_with_dataloader_workers_still_saves(fresh_pools, tmp_path):
    """Slurm signals every process of a job step: the rank's DataLoader workers get SIGTERM too, and must not die of
    it before the rank has saved (its loader would fail first)."""
    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    cell = training_cell(marks, epochs=2, samples=32, step_s=0.2, workers=1)
    sent = signal_at_step(marks, rank=1, step=5, group=True)
    with pytest.raises(RankFailedError) as failed:
        run_cell(fresh_pools, cell, checkpoint=str(ckpt))
    saved = _checkpoint_step(ckpt / "checkpoint.pt")
    assert sent["step"] <= saved <= sent["after"] + 2, (sent, saved, str(failed.value))
    assert f"checkpoint at step {saved} saved" in str(failed.value), str(failed.value)


def test_preempt_without_a_checkpoint_says_so_at_once_with_how_to_set_one(fresh_pools, tmp_path):
    marks = tmp_path / "marks"
    signal_at_step(marks, rank=1, step=3)
    output = Captured()
    said: list[float] = []

    def write(stream: str, text: str) -> None:
        output(stream, text)
        if "nothing can be saved" in text:
            said.append(time.monotonic())

    ns, _ = run_cell(fresh_pools, training_cell(marks, epochs=2, samples=32, save=False), write=write, out="steps")
    text = output.text()
    assert re.search(r"rank 1 got SIGTERM from outside at \d\d:\d\d:\d\d \(the container or job is being stopped\); "
                     r"nothing can be saved: this cell has no --checkpoint\. Run it with --checkpoint DIR", text), text
    assert ns["steps"] == 8  # nothing else changes: the machine goes when it goes


def test_preempt_during_a_checkpoint_write_leaves_it_whole(fresh_pools, tmp_path):
    """SIGTERM lands on rank 0 while it writes an epoch's checkpoint (to a folder of its own, with a 64 MB value
    that makes the write last): that write finishes whole, and the notice's checkpoint follows at the next step."""
    marks, ckpt, epochs = tmp_path / "marks", tmp_path / "ckpt", tmp_path / "epochs"
    cell = training_cell(marks, epochs=3, samples=64, extra=f"{str(epochs)!r}, blob=torch.ones(16 * 2**20)")
    hit: list[str] = []

    def sigterm_mid_write() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not hit:
            writing = list(epochs.glob(".checkpoint.pt.tmp-*")) if epochs.exists() else []
            if writing and (seen := progress(marks, 0)) is not None:
                os.kill(seen[0], signal.SIGTERM)
                hit.append(writing[0].name)
            time.sleep(0.002)

    epochs.mkdir()
    threading.Thread(target=sigterm_mid_write, daemon=True).start()
    with pytest.raises(RankFailedError) as failed:
        run_cell(fresh_pools, cell, checkpoint=str(ckpt))
    assert hit, "the write was never caught in progress"
    written = torch.load(epochs / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert written["step"] == 8 and written["extra"]["blob"].numel() == 16 * 2**20  # whole
    assert not list(epochs.glob(".checkpoint.pt.tmp-*"))
    assert _checkpoint_step(ckpt / "checkpoint.pt") == 9  # then the notice's, at the next step
    assert "checkpoint at step 9 saved" in str(failed.value), str(failed.value)


def test_preempt_grace_is_checked_before_anything_starts():
    with pytest.raises(ConfigError, match=r"--preemption-grace must be a positive number of seconds \(got 0.0\)"):
        resolve(LaunchRequest(nprocs=2, cpu=True, preemption_grace=0.0))
    assert resolve(LaunchRequest(nprocs=2, cpu=True, preemption_grace=60)).preemption_grace_s == 60.0
    assert resolve(LaunchRequest(nprocs=2, cpu=True)).preemption_grace_s == 25.0


@pytest.mark.parametrize("message", ["sent", "lost"])
def test_preempt_the_kernels_own_sigterm_is_no_notice(fresh_pools, tmp_path, monkeypatch, message):
    """The kernel ending a pool mid-cell announces its SIGTERM: the ranks go at once, not after the SIGKILL grace
    (a rank that took it for a preemption notice would go on to its next step). "lost": the channel's Stopping never
    reaches the ranks, as when their reader thread does not run in time on a loaded machine; the stop file the kernel
    leaves in the pool's private directory still tells them."""
    if message == "lost":
        send_all = Channel.send_all
        monkeypatch.setattr(Channel, "send_all",
                            lambda self, msg: None if isinstance(msg, P.Stopping) else send_all(self, msg))
    marks = tmp_path / "marks"
    marks.mkdir()
    cell = f"import time\nopen({str(marks / 'running')!r} + str(rank), 'w').close()\ntime.sleep(120)\n"
    ended: list = []

    def run() -> None:
        try:
            run_cell(fresh_pools, cell, checkpoint=str(tmp_path / "ckpt"))
        except BaseException as exc:  # the pool is ended under it
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while len(list(marks.glob("running*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    fresh_pools.pool.teardown(graceful=False, grace=10)  # SIGTERM, then SIGKILL 10 s later
    assert time.monotonic() - started < 5
    thread.join(60)
    assert ended and isinstance(ended[0], RankFailedError)


# ------------------------------------------------------------------ the node agent's metadata poller
@pytest.mark.parametrize("cloud, ends", [("AWS", "2026-11-26T12:05:41+00:00"), ("GCP", None),
                                         ("Azure", "2026-11-26T12:05:41+00:00")])
def test_preempt_poller_reads_each_clouds_notice_from_its_metadata_service(cloud, ends):
    server = MetadataServer(cloud)
    try:
        assert read_once(server.url) is None  # no notice yet: AWS 404, GCP FALSE, Azure no event
        server.announce()
        notice = read_once(server.url)
        assert notice is not None and notice.source == cloud
        expected = datetime.fromisoformat(ends).timestamp() if ends else None
        assert notice.ends_at == expected
        assert server.reads == 2  # each read carried what the cloud asks for (token, header)
    finally:
        server.close()


def test_preempt_poller_polls_until_the_notice_and_the_agent_sends_it_once():
    server = MetadataServer("GCP")
    notices, said = Notices(), []
    try:
        notices.poll(server.url, said.append, interval=0.05)
        time.sleep(0.3)
        assert notices.take() is None and server.reads >= 3
        server.announce()
        deadline = time.monotonic() + 5
        while (notice := notices.take()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert notice is not None and notice.source == "GCP"
        notices.on_sigterm(signal.SIGTERM, None)  # the same event again: not sent twice
        assert notices.take() is None and not said
    finally:
        server.close()


def test_preempt_poller_says_once_when_the_url_cannot_be_read_and_bad_urls_are_refused():
    notices, said = Notices(), []
    notices.poll("http://127.0.0.1:9/latest/meta-data/spot/instance-action", said.append, interval=0.05)
    time.sleep(0.4)
    assert len(said) == 1 and said[0].startswith("cannot read the preemption notice URL"), said
    with pytest.raises(PreemptionURLError, match="--preemption-url takes the cloud's metadata URL"):
        check_url("169.254.169.254/latest/meta-data/spot/instance-action")
    assert [cloud_of(u, b) for u, b in [("http://h/x", "TRUE"), ("http://h/x", '{"Events": []}'),
                                        ("http://h/x", '{"action": "stop"}')]] == ["GCP", "Azure", "AWS"]


@pytest.mark.slow  # serves a trickle that is cut at a 3 s deadline, then a notice
def test_preempt_poller_outlives_hostile_answers_and_still_hears_the_next_notice():
    """[1], null, JSON nested 20 000 deep, events that are not objects, 1 MiB, headers and a body trickled a byte
    every 1.5 s: each read ends by its deadline, the poller says so once and goes on, and hears the notice after."""
    notice = json.dumps({"Events": [{"EventType": "Preempt", "NotBefore": "Thu, 26 Nov 2026 12:05:41 GMT"}]})
    hostile = ["[1]", "null", "[" * 20_000 + "]" * 20_000, '{"Events": [1]}', "x" * (1 << 20),
               ("trickle", "headers"), ("trickle", "body")]
    server = ScriptedServer(PATHS["Azure"], [*hostile, notice])
    notices, said = Notices(), []
    try:
        thread = notices.poll(server.url, said.append, interval=0.05)
        deadline = time.monotonic() + 60
        while (heard := notices.take()) is None and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.close()
    assert heard is not None and heard.source == "Azure", said
    assert len(said) == 1 and said[0].startswith("cannot read the preemption notice URL"), said
    assert "its JSON is list, not an object" in said[0], said
    for where in ("headers", "body"):  # each read alone, timed here: one deadline for the whole of it
        trickle = ScriptedServer(PATHS["Azure"], [("trickle", where)])
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError, match="no whole answer within"):
                read_once(trickle.url)
        finally:
            trickle.close()
        assert time.monotonic() - started < READ_DEADLINE_S + 1.0




def test_preempt_reclaim_bit_for_bit_resumes_to_the_uninterrupted_runs_exact_parameters(fresh_pools, tmp_path):
    """Dropout's random state, the shuffled loader's position and SGD's momentum all come back: a run reclaimed at
    step 17 of 40 and resumed ends with exactly the parameters and logged values of one that never stopped."""
    marks = tmp_path / "marks"
    marks.mkdir()
    ns_whole, whole = run_cell(fresh_pools, RECLAIMED_CELL, {"MARKS": str(marks), "STEP_S": 0.03}, checkpoint=str(tmp_path / "whole"))
    for mark in marks.iterdir():
        mark.unlink()
    sent = signal_at_step(marks, rank=1, step=17)
    with pytest.raises(RankFailedError, match="got SIGTERM from outside"):
        run_cell(fresh_pools, RECLAIMED_CELL, {"MARKS": str(marks), "STEP_S": 0.03}, checkpoint=str(tmp_path / "reclaimed"))
    assert 17 <= sent["step"] < 40
    ns, resumed = run_cell(fresh_pools, RECLAIMED_CELL, {"MARKS": str(marks), "STEP_S": 0.03}, checkpoint=str(tmp_path / "reclaimed"))
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(ns["final"], ns_whole["final"], strict=True))
    curve, expected = resumed.history.series("loss", rank=0), whole.history.series("loss", rank=0)
    assert curve.steps == expected.steps == list(range(40))  # each step once: none repeated, none lost
    assert curve.values == expected.values


EPOCH_LOGGED_CELL = RECLAIMED_CELL.replace("""        time.sleep(STEP_S)
""", """        time.sleep(STEP_S)
    nbtrain.log(epoch=epoch)  # once an epoch, after its last step
""")


@pytest.mark.parametrize("signal_step", [4, 12])  # on an epoch's last step (5 a epoch), and inside one
def test_preempt_reclaim_bit_for_bit_keeps_each_epochs_value_logged_after_its_last_step(fresh_pools, tmp_path,
                                                                                          signal_step):
    """A value the loop logs after an epoch's last step is in the checkpoint with that step, so a resumed run's
    ``history`` holds each epoch's value exactly once, as the uninterrupted run's does."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sent = signal_at_step(marks, rank=1, step=signal_step)
    with pytest.raises(RankFailedError, match="got SIGTERM from outside"):
        run_cell(fresh_pools, EPOCH_LOGGED_CELL, {"MARKS": str(marks), "STEP_S": 0.03}, checkpoint=str(tmp_path / "reclaimed"))
    assert signal_step <= sent["step"] < 40
    _, resumed = run_cell(fresh_pools, EPOCH_LOGGED_CELL, {"MARKS": str(marks), "STEP_S": 0.03}, checkpoint=str(tmp_path / "reclaimed"))
    for rank in (0, 1):
        assert resumed.history.series("epoch", rank=rank).values == [float(e) for e in range(8)], sent
    assert resumed.history.series("loss", rank=0).steps == list(range(40))
