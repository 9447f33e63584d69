"""The stop button while attached signals only the run's own agent (nbtrain/wire/detached_stop.py):
a manifest naming another user's process, a process of ours that is no agent, or an agent that started after
the run gets no signal."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from helpers.agents import start_waiting_agent
from helpers.attacker import attacker, attacker_python, needs_root

from nbtrain.wire.detached_stop import NotTheRunsAgent, runs_agent, stop_run
from nbtrain.wire.runfolder import RecordedState, RunSummary

pytestmark = pytest.mark.timeout(120)


def _run(pid: int) -> RunSummary:
    return RunSummary(run_id="run-1", state=RecordedState.RUNNING, started=time.time(), agent_pid=pid,
                      nprocs=2, step=3)


def _alive(process: subprocess.Popen) -> bool:
    time.sleep(0.5)
    return process.poll() is None


def test_the_runs_own_agent_is_stopped_and_a_process_of_ours_that_is_no_agent_is_not_signalled():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    agent = start_waiting_agent()
    try:
        with pytest.raises(NotTheRunsAgent, match="is not a node agent"):
            stop_run(_run(other.pid))
        assert _alive(other)
        early = dataclasses.replace(_run(agent.pid), started=time.time() - 3600)
        with pytest.raises(NotTheRunsAgent, match="started after run"):
            stop_run(early)  # the pid was reused since the run's agent ended
        assert _alive(agent)
        stop_run(_run(agent.pid))
        agent.wait(30)  # the agent ended on the signal (a TimeoutExpired here fails the test)
    finally:
        for process in (other, agent):
            if process.poll() is None:
                process.kill()
            process.wait()


@needs_root
def test_a_manifest_naming_another_users_process_gets_it_no_signal(tmp_path_factory):
    """Their process even looks like an agent: ``python3 -m nbtrain.node`` (a module of their own that sleeps)."""
    who = attacker()
    fake = Path(tempfile.mkdtemp(prefix="nbtrain-fake-agent-"))
    (fake / "nbtrain" / "node").mkdir(parents=True)
    (fake / "nbtrain" / "__init__.py").write_text("")
    (fake / "nbtrain" / "node" / "__init__.py").write_text("")
    (fake / "nbtrain" / "node" / "__main__.py").write_text("import time\ntime.sleep(60)\n")
    for path in (fake, *fake.rglob("*")):
        path.chmod(0o755)
    theirs = subprocess.Popen([attacker_python(), "-m", "nbtrain.node"], user=who.pw_uid, group=who.pw_gid,
                              extra_groups=[], cwd=str(fake), env={"PATH": "/usr/bin:/bin"})
    try:
        time.sleep(0.5)
        assert psutil.Process(theirs.pid).cmdline()[1:3] == ["-m", "nbtrain.node"]  # only its owner tells it apart
        with pytest.raises(NotTheRunsAgent, match="belongs to another user"):
            runs_agent(_run(theirs.pid))
        assert psutil.Process(theirs.pid).status() != psutil.STATUS_ZOMBIE
    finally:
        theirs.kill()
        theirs.wait()
        shutil.rmtree(fake, ignore_errors=True)
