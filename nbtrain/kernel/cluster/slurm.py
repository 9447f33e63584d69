"""Nodes started as a Slurm job: ``--slurm ARGS`` runs the node agents through Slurm's own tools.

Nothing here schedules anything: the kernel calls ``sbatch``, ``srun``, ``scontrol``, ``sacct`` and ``scancel``
as the user would from a shell, so the cluster's partitions, accounts, limits and queue apply. Which way
depends on where the kernel runs:

* **outside an allocation** (a notebook on a login node): ``sbatch ARGS`` with a batch script on its stdin
  (:func:`batch_script`) whose ``srun`` runs one agent per node of the job (``--ntasks-per-node=1``); ARGS
  on sbatch's command line win over the script's ``#SBATCH`` lines (``--partition``, ``--time``,
  ``--gpus-per-node``, ``--nodes=MIN-MAX`` …);
* **inside an allocation** (``SLURM_JOB_ID`` in the kernel's environment: a notebook started in ``salloc``,
  in a batch job, or by Open OnDemand's Jupyter app): ``srun --nodes=N --ntasks-per-node=1 ARGS`` runs them as
  a step of that job (:func:`srun_argv`); its ``srun`` process is the kernel's child.

Each task runs ``PYTHON -m nbtrain.node --join HOST:PORT --token-file PATH`` (:func:`agent_command`). The
token stays in the hub's 0600 file in the user's Jupyter runtime directory (a shared home on a cluster):
never in a command line, the batch script (Slurm keeps its text, readable by its administrators) or the
job's environment. PYTHON is ``--remote-python`` as for ``--hosts`` (:func:`~.ssh.remote_command`). With a
loopback ``--rdzv-host`` every agent must run on this machine (a one-machine trial): the job is one node
with a task per agent, each connecting from ``127.0.0.(2 + SLURM_PROCID)`` as emulated agents do.

:class:`SlurmNodes` holds the one job (or step) of a kernel. :meth:`~SlurmNodes.news` says its state when it
changes — the id once submitted, ``PENDING (Resources)`` or another reason while it waits, the nodes it got;
:meth:`~SlurmNodes.ended` tells a job that ended before its nodes joined, with its output's last lines;
:meth:`~SlurmNodes.end_reason` gives Slurm's account of a job that ended under running ranks (``TIMEOUT
(TimeLimit)``, ``CANCELLED by 1000``, ``NODE_FAIL``, ``PREEMPTED``), which is how the lost nodes are
reported. :meth:`~SlurmNodes.close` (``%distributed_shutdown``, the kernel's exit) cancels the job
(``scancel``) or ends the step; the stop button while the job waits ends only the wait. Idle nodes stay billed:
after a cell the kernel's :class:`~nbtrain.kernel.lifecycle.pools.PoolManager` keeps the job ``--keep-alive``
(:meth:`~SlurmNodes.kept`), then :meth:`~SlurmNodes.release` cancels it (a step of the notebook's own allocation
stays: the allocation is the user's).

The batch script waits for its ``srun`` instead of ``exec``-ing it: Slurm's warning before the time limit
(``--signal=B:USR1@60``, :data:`WARNING_SIGNAL`) reaches the shell, which sends SIGTERM to the job's steps — a
preemption notice for the agents and ranks, which save a checkpoint at their next step. SIGTERM itself (which
srun answers by killing its tasks) is left to srun, as before: a cancelled job is a lost node in Slurm's words.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass

from ..request.mistakes import UserInputError
from .ssh import remote_command

COMMAND_TIMEOUT_S = 30  # sbatch, scontrol, scancel: a controller that does not answer in this is said so
POLL_EVERY_S = 2.0  # how often the job's state is asked while it matters
END_WAIT_S = 5.0  # a job that is ending: how long to wait for Slurm's final word on it
STEP_CHECK_S = 1.0  # srun that refuses its arguments exits within this
EXIT_WAIT_S = 10.0
JOB_NAME = "nbtrain-nodes"
WARNING_SIGNAL = "B:USR1@60"  # Slurm signals the batch shell this long before the time limit (ARGS may change it)
# the batch shell's answer: SIGTERM to every step of the job, not to itself (scancel --signal spares the batch step)
WARNING_TRAP = """trap 'scancel --signal=TERM "$SLURM_JOB_ID"' USR1 USR2"""
# SIGTERM (scancel, a time limit without warning) reaches srun beside the shell, which ends its tasks as when it
# was the batch shell itself (the nodes are lost, in Slurm's words); the shell outlives it, as it did
TERM_TRAP = "trap : TERM"
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}


class SlurmError(UserInputError):
    """Slurm refused to start the node agents; the message quotes it."""


def log_dir() -> str:
    """Where the job's output goes: the agents' log directory, in the (shared) home."""
    return os.path.expanduser(os.environ.get("NBTRAIN_LOG_DIR") or os.path.join("~", ".cache", "nbtrain", "logs"))


def agent_command(join: str, token_file: str, python: str, loopback: bool, preemption_url: str = "") -> str:
    """The shell command each task runs: the agent, its token read from the 0600 file."""
    address = "127.0.0.$((2 + SLURM_PROCID))" if loopback else ""
    return remote_command(join, address, python, token=f"--token-file {shlex.quote(token_file)}",
                          preemption_url=preemption_url)


def placement(nodes: int, min_nodes: int, loopback: bool) -> list[str]:
    """One task per node; a loopback trial: one node, a task per agent."""
    if loopback:
        return ["--nodes=1", f"--ntasks={nodes}"]
    return [f"--nodes={min_nodes}-{nodes}" if min_nodes else f"--nodes={nodes}", "--ntasks-per-node=1"]


def batch_script(nodes: int, min_nodes: int, loopback: bool, command: str, output: str) -> str:
    """The script given to sbatch (on its stdin): its resources, then one srun over the job's nodes, which the
    shell waits for so that Slurm's warning before the time limit becomes a notice (:data:`WARNING_TRAP`)."""
    step = f"--ntasks={nodes}" if loopback else "--nodes=$SLURM_JOB_NUM_NODES --ntasks-per-node=1"
    lines = ["#!/bin/sh", f"#SBATCH --job-name={JOB_NAME}", *[f"#SBATCH {word}" for word in placement(
        nodes, min_nodes, loopback)], f"#SBATCH --output={output}", f"#SBATCH --signal={WARNING_SIGNAL}",
        "# nbtrain node agents: they join the notebook's kernel and leave when its pool ends.",
        "# Slurm's warning before the time limit (--signal=B:USR1@60) comes to this shell: it becomes SIGTERM to",
        "# the agents and their ranks, a preemption notice (a checkpoint at the next step). srun itself would kill",
        "# its tasks on SIGTERM, so it runs in the background, and waiting for it goes on after the trap.",
        WARNING_TRAP, f"srun --whole {step} /bin/sh -c {shlex.quote(command)} &", "step=$!", TERM_TRAP,
        'wait "$step"; code=$?', 'while kill -0 "$step" 2>/dev/null; do wait "$step"; code=$?; done', 'exit "$code"',
        ""]
    return "\n".join(lines)


def srun_argv(nodes: int, min_nodes: int, loopback: bool, args: tuple[str, ...], command: str) -> list[str]:
    """Inside an allocation: the agents as a step of it (ARGS after nbtrain's words, so they win)."""
    return ["srun", f"--job-name={JOB_NAME}", "--whole", *placement(nodes, min_nodes, loopback), *args,
            "/bin/sh", "-c", command]


def in_allocation(environ=None) -> str:
    """The job this kernel runs in (``SLURM_JOB_ID``), or ""."""
    return (os.environ if environ is None else environ).get("SLURM_JOB_ID", "").strip()


def _slurm(*argv: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]} got no answer within {COMMAND_TIMEOUT_S} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {exc.strerror}")


@dataclass(frozen=True)
class JobState:
    """What Slurm says of a job: its state, the reason (why it waits, why it ended), its nodes."""

    state: str
    reason: str = ""
    nodes: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def __str__(self) -> str:
        return f"{self.state} ({self.reason})" if self.reason and self.reason != "None" else self.state


def query(job_id: str) -> JobState | None:
    """The job as ``scontrol show job`` has it; ``sacct`` for one the controller has forgotten; None if unknown."""
    shown = _slurm("scontrol", "show", "job", "-o", job_id)
    if shown.returncode == 0:
        fields = dict(re.findall(r"(?:^|\s)(JobState|Reason|NodeList)=(\S*)", shown.stdout))
        if "JobState" in fields:
            return JobState(fields["JobState"], fields.get("Reason", ""), fields.get("NodeList", "").replace("(null)", ""))
    return _accounted(job_id)


def _accounted(job_id: str) -> JobState | None:
    """sacct's record (it names who cancelled a job: ``CANCELLED by 1000``); None without accounting."""
    done = _slurm("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,Reason,NodeList")
    rows = [line.split("|") for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    if not rows or len(rows[0]) < 3:
        return None
    return JobState(rows[0][0].strip(), rows[0][1].strip(), rows[0][2].strip())


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _tail(path: str, lines: int = 4) -> str:
    """The last lines of the job's output, with what to do for the failures people meet."""
    try:
        with open(path, errors="replace") as f:
            text = " / ".join([line.strip() for line in f.read().splitlines() if line.strip()][-lines:])
    except OSError:
        return "(no output)"
    if "cannot read the join token" in text:
        text += (" (the nodes must see the token file: set JUPYTER_RUNTIME_DIR to a directory in the home the "
                 "nodes share)")
    elif "No module named" in text:
        text += " (install nbtrain there, or point --remote-python at a Python that has it)"
    return text or "(no output)"


class SlurmNodes:
    """This kernel's Slurm job (``sbatch``) or step (``srun`` in its allocation) running node agents."""

    def __init__(self) -> None:
        self.job_id = ""  # the job: ours (sbatch) or the allocation the step runs in
        self.step: subprocess.Popen | None = None  # inside an allocation: our srun
        self.output = ""  # the job's (or srun's) output file
        self.state: JobState | None = None
        self._said = ""  # the state last reported
        self._asked_at = 0.0

    def active(self) -> bool:
        """A job or step that still runs or waits (its nodes may join)."""
        if self.step is not None:
            return self.step.poll() is None
        return bool(self.job_id) and (self._ask(force=True) or JobState("")).active

    def start(self, nodes: int, min_nodes: int, join: str, token_file: str, args: tuple[str, ...], python: str,
              loopback: bool, preemption_url: str = "") -> str:
        """Submit the agents (inside an allocation: run their step); what to tell the user. :class:`SlurmError`
        with Slurm's words if it refuses."""
        os.makedirs(log_dir(), mode=0o700, exist_ok=True)
        command = agent_command(join, token_file, python, loopback, preemption_url)
        self.state, self._said = None, ""
        allocation = in_allocation()
        if allocation:
            return self._run_step(allocation, nodes, min_nodes, loopback, args, command)
        self.step, self.output = None, os.path.join(log_dir(), "slurm-nbtrain-%j.out")
        try:
            done = subprocess.run(["sbatch", "--parsable", *args], input=batch_script(
                nodes, min_nodes, loopback, command, self.output), capture_output=True, text=True,
                timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"sbatch could not submit the node agents' job: {exc}") from None
        if done.returncode:
            words = " / ".join(line.strip() for line in done.stderr.splitlines() if line.strip())
            raise SlurmError(f"sbatch refused the node agents' job (--slurm {shlex.join(args)}): {words}")
        self.job_id = done.stdout.strip().split(";")[0]
        self.output = self.output.replace("%j", self.job_id)
        return f"nbtrain: submitted Slurm job {self.job_id} for the node agents ({shlex.join(['sbatch', *args])})"

    def _run_step(self, allocation: str, nodes: int, min_nodes: int, loopback: bool, args, command: str) -> str:
        self.job_id, self.output = allocation, os.path.join(log_dir(), f"slurm-nbtrain-{allocation}-{os.getpid()}.out")
        with open(self.output, "wb") as out:
            self.step = subprocess.Popen(srun_argv(nodes, min_nodes, loopback, tuple(args), command),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.step.wait(STEP_CHECK_S)
            self.step, self.job_id = None, ""
            raise SlurmError(f"the node agents' srun step in job {allocation} ended at once (exit {code}, --slurm "
                             f"{shlex.join(args)}): {_tail(self.output)}")
        return f"nbtrain: starting the node agents as a step of this notebook's Slurm job {allocation} (srun)"

    def _ask(self, force: bool = False) -> JobState | None:
        now = time.monotonic()
        if self.job_id and (force or now - self._asked_at >= POLL_EVERY_S):
            self._asked_at = now
            self.state = query(self.job_id) or self.state
        return self.state

    def news(self, again: bool = False, ask_now: bool = False) -> str:
        """A line when the job's state changed since the last one (asked every :data:`POLL_EVERY_S`, or now with
        ``ask_now``), else ""; ``again``: the state now, said or not (a new cell waits for the job)."""
        if not self.job_id or self.step is not None:
            return ""
        state = self._ask(force=again or ask_now)
        if state is None or not state.active or (str(state) == self._said and not again):
            return ""
        self._said = str(state)
        if state.state == "RUNNING":
            return f"nbtrain: Slurm job {self.job_id} is running on {state.nodes or 'its nodes'}; the agents join"
        return f"nbtrain: Slurm job {self.job_id} is {state}; the cell waits for it"

    def ended(self) -> str:
        """Before the nodes joined: why the job (or step) is over, with its output's last lines; "" while it lives."""
        if self.step is not None:
            code = self.step.poll()
            if code is None:
                return ""
            job, self.step, self.job_id = self.job_id, None, ""
            return f"the srun step in Slurm job {job} ended (exit {code}): {_tail(self.output)}"
        state = self._ask()
        if not self.job_id or state is None or state.active or state.state == "COMPLETING":
            return ""
        job = self.job_id
        self.job_id = ""  # reported once; a re-run submits again
        return f"Slurm job {job} ended: {state}: {_tail(self.output)}"

    def end_reason(self) -> str:
        """Slurm's account of a job that ended (or is ending) under its ranks, such as ``TIMEOUT (TimeLimit)``;
        "" while it runs (the node was lost for another reason)."""
        if not self.job_id:
            return ""
        step = ""
        if self.step is not None:  # its agents died: srun ends right after them
            with contextlib.suppress(subprocess.TimeoutExpired):
                step = f"the srun step in Slurm job {self.job_id} ended (exit {self.step.wait(STEP_CHECK_S)})"
        state = self._ask(force=True)
        deadline = time.monotonic() + END_WAIT_S
        while state is not None and state.state == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.2)
            state = self._ask(force=True)
        if state is None or state.active:
            return step  # the job runs on: the node was lost for another reason (or its step alone ended)
        if state.state == "CANCELLED":  # sacct, where there is accounting, says by whom
            state = _accounted(self.job_id) or state
        return f"Slurm job {self.job_id} ended: {state}"

    def describe(self) -> list[str]:
        """For ``%distributed_nodes``: the job and its state."""
        if self.step is not None:
            live = "running" if self.step.poll() is None else f"ended ({self.step.returncode})"
            return [f"Slurm: the node agents' srun step in job {self.job_id}, {live}"]
        state = self._ask(force=True) if self.job_id else None
        if state is None:
            return []
        where = f" on {state.nodes}" if state.state == "RUNNING" and state.nodes else ""
        return [f"Slurm job {self.job_id} (node agents): {state}{where}"]

    def kept(self, seconds: float) -> str:
        """Said under a cell: how long this kernel's job (one it submitted, waiting or running) stays for the next
        cell; "" for none, or for a step of the notebook's own allocation (the user's, not nbtrain's, to end)."""
        if self.step is not None or not self.active():
            return ""
        return f"nbtrain: Slurm job {self.job_id} kept for {_span(seconds)} (--keep-alive), then released"

    def release(self) -> str:
        """Cancel this kernel's job, as idle nodes must not stay billed; what to say ("" if there was none)."""
        if self.step is not None or not self.active():
            return ""
        job = self.job_id
        self.close()
        return f"nbtrain: Slurm job {job} released (scancel): its nodes are idle"

    def close(self) -> None:
        """Cancel the job (waiting or running), or end the step; its agents were told to leave already."""
        if self.step is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.step.wait(EXIT_WAIT_S)
            if self.step.poll() is None:
                self.step.terminate()  # srun ends its step's tasks
                try:
                    self.step.wait(EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.step.kill()
                    self.step.wait()
            self.step = None
        elif self.job_id:
            _slurm("scancel", self.job_id)
        self.job_id, self.state, self._said = "", None, ""
