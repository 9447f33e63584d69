"""A real Slurm of one node — this machine — for the ``--slurm`` tests: its own munged, slurmctld and slurmd.

:func:`slurm_cluster` (a session-scoped fixture; import it into a test module) writes a private
``slurm.conf`` under a tmp directory: one node, this host by its short name, 2 CPUs, ``select/cons_tres``,
``proctrack/linuxproc``, ``task/none``, no accounting; the controller and the node daemon on free ports of
127.0.0.1; ``auth/munge`` through a munged of its own (its own key and socket, ``AuthInfo=socket=…``). It
starts the three daemons in the foreground (they are this process's children), waits for the node to be
idle, points ``SLURM_CONF`` at the file (the kernels the tests start inherit it, so ``sbatch``, ``squeue``
and the others talk to this Slurm and no other), and at the end cancels every job and stops the daemons.

Slurm's daemons run as root here (``SlurmUser=root``), as on a real cluster's nodes. When something is
missing (the packages, root) or a daemon will not start, the tests skip, saying why — never pass silently.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest

PACKAGES = "slurm-wlm munge"  # Debian's; .ci/run installs them
DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "salloc")
IDLE_WAIT_S = 30.0


@dataclass
class Slurm:
    """The running test cluster: its configuration file, the node's name, where the daemons log."""

    conf: str
    node: str
    directory: str
    started_in_s: float

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command against this cluster; its stdout (and stderr, where salloc says what it did, when
        ``check`` is off)."""
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=30)
        if check and done.returncode:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout if check else done.stdout + done.stderr

    def jobs(self) -> list[str]:
        """``JOBID|STATE|REASON`` of each job in the queue."""
        return [line for line in self.run("squeue", "-h", "-o", "%i|%T|%r").splitlines() if line.strip()]

    def logs(self) -> str:
        text = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = os.path.join(self.directory, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _missing() -> str:
    absent = [c for c in (*DAEMONS, *COMMANDS) if not (shutil.which(c) or shutil.which(c, path="/usr/sbin:/sbin"))]
    if absent:
        return f"needs Slurm and munge ({', '.join(absent)} not found): apt-get install {PACKAGES}; .ci/run installs them"
    if os.geteuid() != 0:
        return "a private Slurm's slurmd runs as root (it starts jobs as their user); these tests need root"
    return ""


def write_conf(directory: str, node: str, ports: tuple[int, int], munge_socket: str) -> str:
    lines = [
        "ClusterName=nbtrain-test", f"SlurmctldHost={node}(127.0.0.1)", f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}", f"StateSaveLocation={directory}/state", f"SlurmdSpoolDir={directory}/spool",
        f"SlurmctldPidFile={directory}/slurmctld.pid", f"SlurmdPidFile={directory}/slurmd.pid",
        f"SlurmctldLogFile={directory}/slurmctld.log", f"SlurmdLogFile={directory}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "SchedulerType=sched/builtin", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "ReturnToService=2", "MinJobAge=600", "KillWait=2", "InactiveLimit=0", "SlurmdTimeout=30",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP", ""]
    path = os.path.join(directory, "slurm.conf")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _start_munge(directory: str) -> tuple[subprocess.Popen, str]:
    munge = os.path.join(directory, "munge")
    os.makedirs(munge, mode=0o700)
    key = os.path.join(munge, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = os.path.join(munge, "munge.socket")
    daemon = subprocess.Popen(["munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                               f"--log-file={directory}/munged.log", f"--pid-file={munge}/munged.pid",
                               f"--seed-file={munge}/munged.seed"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    _until(lambda: os.path.exists(sock) or daemon.poll() is not None, 10)
    return daemon, sock


def _until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _node_state(slurm: Slurm) -> str:
    return slurm.run("sinfo", "-h", "-n", slurm.node, "-o", "%T", check=False).strip()


def _stop(daemons: list[subprocess.Popen]) -> None:
    for daemon in reversed(daemons):
        if daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def _cannot_start(reason: str):
    """Skip, saying why — or fail where Slurm must run (CI sets NBTRAIN_TESTS_NEED_SLURM: it installs Slurm)."""
    if os.environ.get("NBTRAIN_TESTS_NEED_SLURM"):
        pytest.fail(f"Slurm is required here (NBTRAIN_TESTS_NEED_SLURM) but could not start: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = _missing()
    if missing:
        _cannot_start(missing)
    started = time.monotonic()
    directory = str(tmp_path_factory.mktemp("slurm"))
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(directory, sub))
    node = socket.gethostname().split(".")[0]
    daemons: list[subprocess.Popen] = []
    munge, sock = _start_munge(directory)
    daemons.append(munge)
    conf = write_conf(directory, node, (_free_port(), _free_port()), sock)
    env = {**os.environ, "SLURM_CONF": conf}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT, "env": env}
    daemons.append(subprocess.Popen(["slurmctld", "-D", "-i"], **quiet))  # type: ignore[call-overload]
    daemons.append(subprocess.Popen(["slurmd", "-D", "-N", node], **quiet))  # type: ignore[call-overload]
    slurm = Slurm(conf, node, directory, 0.0)
    if not _until(lambda: any(d.poll() is not None for d in daemons) or _node_state(slurm) == "idle", IDLE_WAIT_S):
        _stop(daemons)
        _cannot_start(f"the private Slurm did not come up within {IDLE_WAIT_S:.0f} s:\n{slurm.logs()}")
    if any(d.poll() is not None for d in daemons):
        _stop(daemons)
        _cannot_start(f"a Slurm daemon exited at once:\n{slurm.logs()}")
    slurm.started_in_s = time.monotonic() - started
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # for the kernels the tests start, and Slurm's commands they run
    try:
        yield slurm
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        slurm.run("scancel", "--user", getpass.getuser(), check=False)
        _until(lambda: not slurm.jobs(), 15)
        _stop(daemons)
