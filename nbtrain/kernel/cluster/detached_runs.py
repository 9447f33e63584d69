"""Which detached run an attach means: the one named, else this user's only running run, else the latest finished.

With no id and several runs still running, or an id that names none of this user's runs, the attach stops
before anything is replayed, with a table of this user's runs (id, started, state, step) and how to name one.
Only this user's runs are seen (:func:`nbtrain.wire.runfolder.list_runs` passes over anything another user planted).
An attach to a running run takes control of it (:func:`follow_or_control`) unless another live kernel has it.
"""

from __future__ import annotations

import os
import time

from ...wire.run_control import take_control
from ...wire.runfolder import RecordedState, RunSummary, check_run_id, list_runs, starting_runs
from ..lifecycle.checkpoint_lock import NOTEBOOK_ENV


class AttachChoiceError(Exception):
    """No run, or more than one, answers an attach; the message lists this user's runs and says what to do."""


STARTING_WAIT_S = 15.0  # an attach right after a detached cell returned waits this long for its agent's manifest


def settled_runs(directory: str | None = None, wait_s: float = STARTING_WAIT_S) -> list[RunSummary]:
    """This user's runs, once those whose cell just returned have a manifest (or ``wait_s`` has passed): an
    attach right after the cell must find the run it started, not report none."""
    deadline = time.monotonic() + wait_s
    while starting_runs(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    return list_runs(directory)


def choose_run(run_id: str | None = None, directory: str | None = None) -> RunSummary:
    """The run ``%distributed_attach [RUN]`` attaches to (see the module docstring)."""
    runs = settled_runs(directory)
    if run_id is not None:
        check_run_id(run_id)
        named = [run for run in runs if run.run_id == run_id]
        if named:
            return named[0]
        raise AttachChoiceError(f"No detached run {run_id!r} of yours.\n{runs_table(runs)}")
    running = [run for run in runs if run.state is RecordedState.RUNNING]
    if len(running) == 1:
        return running[0]
    if len(running) > 1:
        raise AttachChoiceError(f"{len(running)} detached runs are running; name one: "
                                f"%distributed_attach RUN_ID\n{runs_table(runs)}")
    if runs:
        return runs[-1]  # the most recently started of the finished ones
    raise AttachChoiceError("No detached run of yours: start one with %%distributed N --detach.")


def runs_table(runs: list[RunSummary]) -> str:
    """This user's runs, a line each: id, when it started, its state and the last step logged."""
    if not runs:
        return "(no detached runs)"
    lines = [f"{'id':<24} {'started':<19} {'state':<8} step"]
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        step = "-" if run.step is None else str(run.step)
        lines.append(f"{run.run_id:<24} {started:<19} {run.state.value:<8} {step}")
    return "\n".join(lines)


def running_note() -> str:
    """What ``%load_ext nbtrain`` says when detached runs of this user's run on this machine ("" if none)."""
    running = [run for run in list_runs() if run.state is RecordedState.RUNNING]
    if not running:
        return ""
    if len(running) == 1:
        return (f"nbtrain: detached run {running[0].run_id} is running (step {running[0].step if running[0].step is not None else '-'}): "
                "%distributed_attach follows it")
    return (f"nbtrain: {len(running)} detached runs of yours are running: %distributed_attach --list shows them, "
            "%distributed_attach RUN_ID follows one")


def follow_or_control(run: RunSummary, force: bool = False) -> str:
    """This kernel takes control of ``run`` (its stop button stops it) unless another live kernel has it and
    ``force`` is not given: then the line that says this kernel only follows ("" when it controls)."""
    if run.state is not RecordedState.RUNNING:
        return ""  # an ended run has nothing to stop
    holder = take_control(run.run_id, os.environ.get(NOTEBOOK_ENV, ""), force)
    if holder is None:
        return ""
    return (f"nbtrain: {holder.describe()} controls this run: this kernel follows it, and its stop button stops "
            f"following only (%distributed_attach {run.run_id} --force takes control)")
