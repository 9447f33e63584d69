"""Spot reclaims on emulated nodes: the noticed node's ranks save, it leaves, the group re-forms and resumes.

Node agents on 127.0.0.2, .3, .4 (1 rank each, gloo), the training cell of ``helpers/preempt_cells.py``:

* SIGTERM to one of three agents mid-training (``--nodes 2:3 --max-restarts 1``): every rank saves at the next
  step, the cell says when the notice came and the checkpoint's step and time, the node leaves, the group
  re-forms with the two that are left and resumes — one curve, no step repeated or missing;
* a cloud's notice (AWS's format, from an HTTP server on 127.0.0.1) to one of two agents polling it
  (``--nodes 2``): the same, with a replacement node joining; the world size stays 2, so the curve is the
  uninterrupted run's, value for value;
* a notice URL that answers what no cloud does is said once — in the cell, on the agent's terminal and in its log.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import threading
import time

import pytest
import torch
from helpers.kernelhelp import nbtrain_kernel
from helpers.metadata import PATHS, MetadataServer, ScriptedServer
from helpers.nodehelp import until
from helpers.preempt_cells import RECLAIMED_CELL, progress, signal_at_step, training_cell
from helpers.runhelp import Captured

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.request.config import LaunchRequest

pytestmark = pytest.mark.timeout(400)


def _request(tmp_path, nodes: str, **options) -> LaunchRequest:
    options.setdefault("last_call", 1.0 if ":" in nodes else None)
    options.setdefault("out", "steps,world")
    return LaunchRequest(nodes=nodes, nproc_per_node=1, rdzv_host="127.0.0.1", cpu=True, start_timeout=120,
                         checkpoint=str(tmp_path / "ckpt"), **options)


@pytest.mark.slow
def test_preempt_sigterm_to_one_of_three_agents_re_forms_with_two_and_resumes(tmp_path):
    """Through a kernel (nbclient), three emulated nodes: the cell's own output says it all."""
    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    cell = training_cell(marks, epochs=2, samples=48, step_s=0.5)  # 3 ranks: 4 steps an epoch; then 2 ranks: 6
    with nbtrain_kernel() as kernel:
        kernel.run("%distributed_nodes --rdzv-host 127.0.0.1 --emulate 3", timeout=120)
        sent = signal_at_step(marks, rank=1, step=2, to_parent=True)  # the agent: SIGTERM, as a cloud or Slurm sends
        reply, text = kernel.execute(f"%%distributed --nodes 2:3 --rdzv-host 127.0.0.1 --cpu --last-call 1 "
                                     f"--start-timeout 120 --checkpoint {ckpt} --max-restarts 1\n{cell}", timeout=300)
        assert reply["status"] == "ok", text
        notice = re.search(r"nbtrain: node (\w): SIGTERM at (\d\d:\d\d:\d\d) \(the machine is being stopped: a "
                           r"preemption, Slurm, Kubernetes\); saving a checkpoint at the next step", text)
        assert notice, text
        saved = re.search(rf"nbtrain: node {notice.group(1)}: SIGTERM at {notice.group(2)} \(.*?\); checkpoint at "
                          rf"step (\d+) saved in \d+\.\d+ s \(\d+\.\d+ s after the notice\); node {notice.group(1)} "
                          r"leaves", text)
        assert saved, text
        step = int(saved.group(1))
        assert sent["step"] <= step <= sent["after"] + 2, (sent, step)  # the step in progress, or the next
        assert "lost" not in text and "replace" not in text, text  # it left on purpose; 2 are enough
        assert "the group forms with 2 nodes of 2–3" in text and "(restart 1 of 1)" in text, text
        checks = kernel.run("print(world, history['loss'].steps == list(range(steps)), steps)")
        assert checks.split() == ["2", "True", "12"], checks  # epoch 0 goes on at its batch, over 6 a rank now
        nodes = kernel.run("%distributed_nodes")
        assert len(re.findall(r"^node \w:", nodes, re.M)) == 2, nodes  # the noticed agent left with its ranks


def test_preempt_an_aws_notice_to_a_polling_agent_resumes_on_a_replacement_as_if_uninterrupted(nodes, tmp_path, capsys):
    server = MetadataServer("AWS")
    try:
        env_url = {"NBTRAIN_PREEMPTION_URL": server.url, "NBTRAIN_PREEMPTION_POLL_S": "0.1"}
        nodes.start("127.0.0.2")
        agent = nodes.start("127.0.0.3", env_url)
        nodes.wait_joined(2)
        marks = tmp_path / "marks"
        cell = training_cell(marks, epochs=2, samples=32, step_s=0.3)  # 2 ranks: 4 steps an epoch, 8 in all
        output, ns = Captured(), {}
        write = _replacing_on_restart(nodes, output)
        _announce_at_step(server, marks, step=5)
        result = run_source(cell, _request(tmp_path, "2", max_restarts=1), ns, manager=nodes.manager, write=write)
        text = capsys.readouterr().out + output.text()
        assert re.search(r"nbtrain: node \w: spot reclaim notice at \d\d:\d\d:\d\d \(AWS, the machine goes at "
                         r"\d\d:\d\d:\d\d\); saving a checkpoint at the next step", text), text
        assert re.search(r"checkpoint at step \d saved in .*; node \w leaves", text) and "(restart 1 of 1)" in text, text
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(30)
        assert agent.returncode == 0, (text, nodes.consoles())  # it left when the kernel said so
        whole_ns: dict = {}
        whole = run_source(cell.replace("time.sleep(0.3)", "time.sleep(0.01)"), _request(tmp_path / "whole", "2"), whole_ns, manager=nodes.manager, write=Captured())
        assert ns["steps"] == whole_ns["steps"] == 8 and ns["world"] == 2
        curve, expected = result.history.series("loss", rank=0), whole.history.series("loss", rank=0)
        assert curve.steps == list(range(8))
        assert curve.values == pytest.approx(expected.values, abs=1e-6)
        assert torch.load(tmp_path / "ckpt" / "checkpoint.pt", weights_only=False)["step"] == 8
    finally:
        server.close()


def test_preempt_reclaim_bit_for_bit_through_a_preemption_url_on_emulated_nodes(nodes, tmp_path):
    """A cloud's notice at step 17 of 40, heard by one of two agents polling its --preemption-url: every rank saves
    at one step, the node leaves, a replacement joins, and the resumed run ends with exactly the parameters — dropout's
    random state, the shuffled loader's position, SGD's momentum — and the 40 logged values of a run that never
    stopped."""
    server = MetadataServer("AWS")
    try:
        nodes.start("127.0.0.2")
        nodes.start("127.0.0.3", {"NBTRAIN_PREEMPTION_URL": server.url, "NBTRAIN_PREEMPTION_POLL_S": "0.1"})
        nodes.wait_joined(2)
        marks = tmp_path / "marks"
        marks.mkdir()
        output, ns = Captured(), {"MARKS": str(marks), "STEP_S": 0.1}
        write = _replacing_on_restart(nodes, output)
        _announce_at_step(server, marks, step=17)
        result = run_source(RECLAIMED_CELL, _request(tmp_path, "2", max_restarts=1, out="final"), ns,
                            manager=nodes.manager, write=write)
        saved = re.search(r"checkpoint at step (\d+) saved in .*; node \w leaves", output.text())
        assert saved and 17 <= int(saved.group(1)) < 40 and "(restart 1 of 1)" in output.text(), output.text()
        whole_ns = {"MARKS": str(marks), "STEP_S": 0.0}
        whole = run_source(RECLAIMED_CELL, _request(tmp_path / "whole", "2", out="final"), whole_ns,
                           manager=nodes.manager, write=Captured())
        assert all(torch.equal(mine, theirs) for mine, theirs in zip(ns["final"], whole_ns["final"], strict=True))
        curve, expected = result.history.series("loss", rank=0), whole.history.series("loss", rank=0)
        assert curve.steps == expected.steps == list(range(40))  # each step once: none repeated, none lost
        assert curve.values == expected.values
    finally:
        server.close()


def _replacing_on_restart(nodes, output: Captured):
    """The run's output to ``output``; when the ranks restart after a node left, a replacement (127.0.0.4) joins."""
    restarted: list[bool] = []

    def write(stream: str, text: str) -> None:
        output(stream, text)
        if "restarting the ranks" in text and not restarted:
            restarted.append(True)
            nodes.start("127.0.0.4")

    return write


def _announce_at_step(server: MetadataServer, marks, step: int) -> None:
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen = progress(marks, 1)
            if seen is not None and seen[1] >= step:
                server.announce()
                return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()


def test_preempt_an_idle_agent_leaves_at_once_and_one_noticed_after_the_last_step_leaves_with_the_cell(nodes, tmp_path,
                                                                                                       capsys):
    idle = nodes.start("127.0.0.4")
    nodes.wait_joined(1)
    idle.send_signal(signal.SIGTERM)  # no ranks to save: nothing to wait for
    assert idle.wait(20) == 0
    assert "leaving: a preemption notice (SIGTERM) with no ranks running" in nodes.consoles()["127.0.0.4"]

    busy = [nodes.start("127.0.0.2"), nodes.start("127.0.0.3")]
    nodes.wait_joined(2)
    cell = ("import os, signal, time\nif rank == 1:\n    os.kill(os.getppid(), signal.SIGTERM)\n    time.sleep(2)\n"
            "done = True\n")  # the notice comes after the last step: nothing more to save
    ns, output = {}, Captured()
    run_source(cell, _request(tmp_path, "1:2", out="done"), ns, manager=nodes.manager, write=output)
    text = capsys.readouterr().out + output.text()
    assert ns["done"] and re.search(r"node (\w): SIGTERM at .*; the cell ended before its next step; node \1 leaves",
                                    text), text
    until(lambda: any(agent.poll() is not None for agent in busy), 20, "the noticed agent to leave")
    assert sum(agent.poll() is not None for agent in busy) == 1, text  # it, and not the other


def test_preempt_a_notice_url_answering_junk_is_said_once_in_the_cell_and_on_the_agents_terminal_and_log(
        nodes, tmp_path, capsys):
    server = ScriptedServer(PATHS["Azure"], ["[1]"])
    try:
        agent = nodes.start("127.0.0.2", {"NBTRAIN_PREEMPTION_URL": server.url, "NBTRAIN_PREEMPTION_POLL_S": "0.1"})
        nodes.wait_joined(1)
        until(lambda: "cannot read the preemption notice URL" in nodes.consoles()["127.0.0.2"], 60, "the agent to say so")
        output, ns = Captured(), {}
        run_source("ok = 1\n", _request(tmp_path, "1", out="ok"), ns, manager=nodes.manager, write=output)
        text = capsys.readouterr().out + output.text()
        assert ns["ok"] == 1 and agent.poll() is None, text  # the agent polls on
        said = re.findall(r"nbtrain: node a: cannot read the preemption notice URL \S+ \(its JSON is list, not an "
                          r"object\); trying again every 0\.1 s", text)
        assert len(said) == 1, text
        console = nodes.consoles()["127.0.0.2"]
        assert console.count("cannot read the preemption notice URL") == 1, console
        log = re.search(r"\(log: (\S+)\)", console).group(1)
        with open(log) as f:
            assert f.read().count("cannot read the preemption notice URL") == 1
    finally:
        server.close()


def test_the_notebooks_preemption_url_reaches_the_agents_it_starts(shell, monkeypatch):
    """``--preemption-url`` on %distributed_nodes (or a --nodes cell): the emulated agent polls it, with no
    variable of its own; a URL that is not one is a UsageError before any agent starts."""
    from IPython.core.error import UsageError

    monkeypatch.delenv("NBTRAIN_PREEMPTION_URL", raising=False)
    monkeypatch.setenv("NBTRAIN_PREEMPTION_POLL_S", "0.1")  # the agents inherit it: a quick first poll
    with pytest.raises(UsageError, match="--preemption-url takes the cloud's metadata URL"):
        shell.run_line_magic("distributed_nodes", "--rdzv-host 127.0.0.1 --emulate 1 --preemption-url ftp://x")
    cluster = shell.magics_manager.registry["DistributedMagics"].cluster
    assert cluster.emulated.running() == [], "nothing was started"
    server = MetadataServer("AWS")
    try:
        shell.run_line_magic("distributed_nodes", f"--rdzv-host 127.0.0.1 --emulate 1 --preemption-url {server.url}")
        until(lambda: server.reads > 0, 60, "the emulated agent never polled the URL given in the notebook")
    finally:
        shell.run_line_magic("distributed_shutdown", "")
        server.close()


def test_a_cells_preemption_url_is_checked_with_its_other_options(tmp_path):
    from nbtrain.kernel.request.config import ConfigError, resolve

    with pytest.raises(ConfigError, match="--preemption-url takes the cloud's metadata URL"):
        resolve(_request(tmp_path, "2", preemption_url="169.254.169.254/latest"))
    spec = resolve(_request(tmp_path, "2", preemption_url="http://169.254.169.254/latest/meta-data/spot/instance-action")).pool
    assert spec.nodes.preemption_url == "http://169.254.169.254/latest/meta-data/spot/instance-action"
