"""Nodes started over ssh: ``--hosts a,b`` runs the join command on each host with the system ``ssh`` client.

The kernel starts one ``ssh`` per host, as the user would from a shell: the user's ``~/.ssh/config``, keys and
agent apply; ``BatchMode=yes`` means a host that would ask for a password (or to confirm an unknown host key)
fails at once instead of hanging on a prompt nobody sees; ``--ssh-option KEY=VALUE`` adds ``-o KEY=VALUE``.
The remote side runs ``PYTHON -m nbtrain.node --join HOST:PORT --token -``, where PYTHON is
``--remote-python`` (a command, such as ``/opt/conda/bin/python`` or ``env PYTHONPATH=… python3``) or, by default, this kernel's ``sys.executable`` when that path exists on the host (the
same environment on a shared file system), else ``python3``. The token goes through ssh's stdin, so it is in
no command line on either machine. A loopback host (``127.0.0.K``) is also the address the agent connects
from, so agents on one machine are told apart as emulated ones are.

The options are checked with the cell's other options, before anything starts
(:mod:`nbtrain.kernel.request.hosts`). The ``ssh`` processes own the nodes: each lives as long as its agent. The agent leaves with the pool (Bye,
a broken link or a silent kernel); :meth:`SshNodes.close` then reaps the ``ssh`` processes, ending one that
outlived that by :data:`EXIT_WAIT_S`. One that exits with an error before its node joined — host unreachable,
authentication refused, nbtrain missing on the host — is reported by the waiting pool
(:meth:`SshNodes.failed`) with the last lines ssh and the remote side wrote, within about
:data:`CONNECT_TIMEOUT_S` rather than at ``--start-timeout``.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

EXIT_WAIT_S = 10.0
CONNECT_TIMEOUT_S = 10  # ssh's ConnectTimeout: an unreachable host is said within this


def remote_command(join: str, address: str, python: str, token: str = "--token -", preemption_url: str = "") -> str:
    """The shell command ssh runs on the host: pick Python, read the token from stdin (or as ``token`` says: a
    Slurm task names the 0600 file), exec the agent (polling ``preemption_url``, given)."""
    agent = f"-m nbtrain.node --join {shlex.quote(join)} {token}" + (f" --address {address}" if address else "")
    agent += f" --preemption-url {shlex.quote(preemption_url)}" if preemption_url else ""
    if python:  # the user's own shell words, for their own host: such as `env PYTHONPATH=… /opt/py/bin/python`
        return f"exec {python} {agent}"
    here = shlex.quote(sys.executable)
    return f"if [ -x {here} ]; then exec {here} {agent}; else exec python3 {agent}; fi"


def loopback(host: str) -> str:
    try:
        return host if ipaddress.ip_address(host).is_loopback else ""
    except ValueError:
        return ""


@dataclass
class _Session:
    host: str
    process: subprocess.Popen
    log: str

    def tail(self, lines: int = 4) -> str:
        with open(self.log, errors="replace") as f:
            text = [line for line in f.read().strip().splitlines() if line.strip()]
        return " / ".join(text[-lines:]) or "(nothing written)"


class SshNodes:
    """The ssh sessions this kernel runs node agents through, by host."""

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self._logs = ""

    def running(self) -> list[str]:
        return [host for host, s in self.sessions.items() if s.process.poll() is None]

    def start(self, hosts, join: str, token: str, options=(), python: str = "", preemption_url: str = "") -> list[str]:
        """Start an agent on each host that has none running; the hosts started."""
        self._logs = self._logs or tempfile.mkdtemp(prefix=f"nbtrain-ssh-{os.getpid()}-")
        started = []
        for host in hosts:
            if host in self.running():
                continue
            log = os.path.join(self._logs, f"{host}.log")
            argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                    "-o", "ServerAliveInterval=5", *[a for o in options for a in ("-o", o)],
                    host, remote_command(join, loopback(host), python, preemption_url=preemption_url)]
            with open(log, "wb") as out:
                process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
            assert process.stdin is not None
            try:
                process.stdin.write(token.encode() + b"\n")
                process.stdin.close()
            except OSError:  # ssh already gone: failed() says why
                pass
            self.sessions[host] = _Session(host, process, log)
            started.append(host)
        return started

    def failed(self) -> list[tuple[str, str]]:
        """(host, what went wrong) for each session that ended with an error; they are forgotten (a re-run retries)."""
        failures = []
        for host, session in list(self.sessions.items()):
            code = session.process.poll()
            if code:
                why = "ssh could not reach or log in to it" if code == 255 else f"the agent exited with {code}"
                tail = session.tail()
                if "No module named" in tail:
                    tail += " (install nbtrain there, or point --remote-python at a Python that has it)"
                failures.append((host, f"{why}: {tail}"))
                del self.sessions[host]
        return failures

    def close(self) -> None:
        """After the pool ended (its agents were told to leave): wait for the ssh sessions, end any that stays."""
        for session in self.sessions.values():
            try:
                session.process.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                session.process.terminate()
                try:
                    session.process.wait(2)
                except subprocess.TimeoutExpired:
                    session.process.kill()
                    session.process.wait()
        self.sessions = {}
        if self._logs:
            shutil.rmtree(self._logs, ignore_errors=True)
            self._logs = ""
