"""Which kernel's stop button stops a detached run: several kernels may follow one run; one of them controls it.

The kernel that starts a detached run controls it; a kernel that attaches while that kernel lives follows the run
(its output, its dashboard, its names at the end), and its stop button — or ``run.stop()`` — ends the following
there, not the run. ``%distributed_attach RUN --force`` takes control. A kernel that has exited (killed,
restarted: a new process) controls nothing any more, and the next kernel that attaches takes control.

Control is the file ``control.json`` in the run's folder (:mod:`.runfolder`, private to the user): the
controlling kernel's pid, its process's start time (so a pid the system gave to another process since is not
taken for that kernel) and its notebook. ``%distributed_shutdown --detached`` and the JupyterLab panel's Stop are
the user's explicit word: they stop the run whoever controls it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import psutil

from .runfolder import RunFolderError, read_json, write_json

CONTROL = "control.json"
START_SLACK_S = 0.01  # start times read twice from /proc agree to its clock tick


@dataclass(frozen=True)
class Controller:
    pid: int
    started: float  # the process's start time
    notebook: str = ""

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            same = abs(process.create_time() - self.started) < START_SLACK_S
            return same and process.status() != psutil.STATUS_ZOMBIE  # a killed kernel its parent has not reaped
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    def is_this_process(self) -> bool:
        return self.pid == os.getpid() and self.alive()

    def describe(self) -> str:
        return f"the kernel of {self.notebook}" if self.notebook else f"kernel process {self.pid}"


def this_kernel(notebook: str = "") -> Controller:
    return Controller(os.getpid(), psutil.Process().create_time(), notebook)


def controller(run_id: str) -> Controller | None:
    """The live kernel that controls ``run_id``; None when none does (none took it, or it has exited)."""
    found = read_json(run_id, CONTROL)
    try:
        holder = Controller(int(found["pid"]), float(found["started"]), str(found.get("notebook", "")))
    except (KeyError, TypeError, ValueError):
        return None
    return holder if holder.alive() else None


def held_elsewhere(run_id: str) -> Controller | None:
    """The other live kernel whose stop button stops ``run_id``; None when this kernel's does."""
    holder = controller(run_id)
    return holder if holder is not None and not holder.is_this_process() else None


def take_control(run_id: str, notebook: str = "", force: bool = False) -> Controller | None:
    """This kernel controls ``run_id`` from now — unless another live kernel does and ``force`` is not given: then
    that kernel is returned and nothing changes. A folder that cannot be written leaves control as it was."""
    holder = held_elsewhere(run_id)
    if holder is not None and not force:
        return holder
    try:
        write_json(run_id, CONTROL, asdict(this_kernel(notebook)))
    except (OSError, RunFolderError):
        pass  # the run's record is gone or not writable: nobody can take control, the stop stays the agent's
    return None


def following_only(run_id: str) -> str:
    """What a kernel's stop button does to ``run_id`` when another live kernel controls it ("": it stops the run)."""
    holder = held_elsewhere(run_id)
    if holder is None:
        return ""
    return (f"{holder.describe()} controls detached run {run_id}: this kernel stopped following it, and the run "
            f"goes on. %distributed_attach {run_id} --force takes control here; then the stop button stops it.")
