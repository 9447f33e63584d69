"""``--hosts a,b`` and its ssh options, and ``--slurm ARGS``, checked with the cell's other options before
anything starts.

The kernel then starts a node agent on each host over ssh (:mod:`nbtrain.kernel.cluster.ssh`), or the agents as a
Slurm job (:mod:`nbtrain.kernel.cluster.slurm`); here only the words: host names ssh takes (never one that begins
with ``-``, which ssh would read as an option), each once, one per ``--nodes``; ``--ssh-option KEY=VALUE``;
``--remote-python COMMAND``; Slurm's arguments, split as a shell would, and the Slurm command they need.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

HOST = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9_.-]*")  # [user@]host, no leading '-'
SSH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]*=[^\n]+")


class SshSetupError(ValueError):
    """``--hosts`` (or ``--slurm``) and its options are not usable; the message says how to fix them."""


def parse_hosts(text: str, nodes: int | None = None) -> tuple[str, ...]:
    """``a,b`` → ``("a", "b")``, checked: names ssh takes as hosts, each once, as many as ``--nodes``; an ssh client."""
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    if not hosts:
        raise SshSetupError(f"--hosts takes host names separated by commas, such as --hosts gpu1,gpu2 (got {text!r}).")
    bad = [h for h in hosts if not HOST.fullmatch(h)]
    if bad:
        raise SshSetupError(f"--hosts: {', '.join(map(repr, bad))} is not a host name ssh can take; give names or "
                            "addresses such as gpu1, user@gpu2 or 10.0.0.7 (an alias from ~/.ssh/config works too).")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise SshSetupError(f"--hosts names {', '.join(twice)} more than once; each host runs one node agent.")
    if shutil.which("ssh") is None:
        raise SshSetupError("--hosts starts the nodes with the ssh client, which is not installed here (apt-get "
                            "install openssh-client); or run the join command on each node yourself.")
    if nodes is not None and len(hosts) != nodes:
        raise SshSetupError(f"--hosts names {len(hosts)} host{'s' if len(hosts) != 1 else ''} but --nodes is "
                            f"{nodes}; give one host per node.")
    return hosts


def parse_ssh_options(items) -> tuple[str, ...]:
    bad = [item for item in items if not SSH_OPTION.fullmatch(item)]
    if bad:
        raise SshSetupError(f"--ssh-option takes one ssh option as KEY=VALUE, such as --ssh-option Port=2222 "
                            f"(got {', '.join(map(repr, bad))}).")
    return tuple(items)


def parse_remote_python(text: str | None) -> str:
    if text is not None and (not text.strip() or "\n" in text):
        raise SshSetupError(f"--remote-python takes the command that runs Python on the hosts, such as "
                            f"/opt/conda/bin/python (got {text!r}).")
    return _unquoted(text or "")


def _unquoted(text: str) -> str:
    command = text.strip()
    if len(command) > 1 and command[0] == command[-1] and command[0] in "'\"":
        command = command[1:-1].strip()  # IPython's magic arguments keep the quotes around a value with spaces
    return command


def parse_slurm(text: str, environ=None) -> tuple[str, ...]:
    """``--slurm ARGS`` → the words for sbatch (inside an allocation, ``SLURM_JOB_ID`` set: for srun), checked:
    a shell's quoting, no ``--wrap`` (nbtrain gives the script), the command on PATH."""
    try:
        words = tuple(shlex.split(_unquoted(text)))
    except ValueError as exc:
        raise SshSetupError(f"--slurm {text!r}: {exc}; give Slurm's options as in a shell, such as "
                            "--slurm \"--partition=gpu --time=2:00:00\"") from None
    mine = [w for w in words if w.split("=")[0] == "--wrap"]
    if mine:
        raise SshSetupError("--slurm takes Slurm's options, not --wrap: nbtrain writes the job's script (the agents' "
                            "srun); put resources in ARGS, such as --slurm \"--gpus-per-node=8 --time=4:00:00\".")
    inside = (os.environ if environ is None else environ).get("SLURM_JOB_ID")
    command = "srun" if inside else "sbatch"
    if shutil.which(command) is None:
        where = (f"inside Slurm job {inside} (SLURM_JOB_ID) the agents start with srun" if inside else
                 "from a login node the agents' job is submitted with sbatch")
        raise SshSetupError(f"--slurm: {where}, which is not on this machine's PATH; run the notebook where "
                            "Slurm's commands are (a login node or a job), or start the agents with the join command.")
    return words
