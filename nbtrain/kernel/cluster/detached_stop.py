"""The stop button while attached: a signal to the run's node agent, once ``/proc`` shows it is that agent.

A run's manifest names its agent's pid, and a manifest is only a file: the pid may have been reused since, or be
one another user hoped to have signalled. So the kernel signals it only when the process is this user's, runs
``python -m nbtrain.node``, and started no later than the run did; anything else is refused with the reason,
and no process is signalled.
"""

from __future__ import annotations

import os
import signal

import psutil

from ...wire.runfolder import RunSummary

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
