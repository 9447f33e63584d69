"""The stop button while attached: a signal to the run's node agent, once ``/proc`` shows it is that agent.

A run's manifest names its agent's pid, and a manifest is only a file: the pid may have been reused since, or be
one another user hoped to have signalled. So the kernel signals it only when the process is this user's, runs
``python -m nbtrain.node``, and started no later than the run did; anything else is refused with the reason,
and no process is signalled.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from .runfolder import RecordedState, RunSummary, list_runs, read_manifest

ESCALATE_AFTER_S = 3.0  # a run still running this long after the first SIGINT gets the second (its ranks stopped)

START_SLACK_S = 1.0  # /proc's start time is rounded to clock ticks; the agent writes the manifest after it started


class NotTheRunsAgent(Exception):
    """The pid in a run's manifest is not that run's agent; the message says what it is instead."""


def runs_agent(run: RunSummary) -> psutil.Process:
    """The process of ``run``'s agent, checked as the module docstring says; :class:`NotTheRunsAgent` if it is not."""
    try:
        process = psutil.Process(run.agent_pid)
        uid, cmdline, started = process.uids().real, process.cmdline(), process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        raise NotTheRunsAgent(f"run {run.run_id}'s agent (pid {run.agent_pid}) is no longer running") from None
    if uid != os.getuid():
        raise NotTheRunsAgent(f"pid {run.agent_pid} in run {run.run_id}'s manifest belongs to another user")
    if cmdline[1:3] != ["-m", "nbtrain.node"]:
        raise NotTheRunsAgent(f"pid {run.agent_pid} in run {run.run_id}'s manifest is not a node agent")
    if started > run.started + START_SLACK_S:
        raise NotTheRunsAgent(f"pid {run.agent_pid} started after run {run.run_id}: its agent has ended")
    return process


def stop_run(run: RunSummary) -> None:
    """Ask ``run``'s agent to stop the run (SIGINT, as the stop button is to ranks)."""
    runs_agent(run).send_signal(signal.SIGINT)


def stop_all_detached() -> list[str]:
    """``%distributed_shutdown --detached``: stop every running detached run of this user's (its agent's SIGINT,
    then the second one where the ranks did not stop); what was done, a line each."""
    said = []
    for run in [run for run in list_runs() if run.state is RecordedState.RUNNING]:
        try:
            stop_run(run)
        except NotTheRunsAgent as exc:
            said.append(f"nbtrain: detached run {run.run_id}: not stopped: {exc}")
            continue
        deadline = time.monotonic() + ESCALATE_AFTER_S
        while _running(run.run_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _running(run.run_id):
            try:
                stop_run(run)
            except NotTheRunsAgent:
                pass  # it ended meanwhile
        said.append(f"nbtrain: detached run {run.run_id} was stopped")
    return said


def _running(run_id: str) -> bool:
    summary = read_manifest(run_id)
    return summary is not None and summary.state is RecordedState.RUNNING
