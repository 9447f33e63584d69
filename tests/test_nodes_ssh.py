"""``--hosts``: the kernel starts the node agents itself over ssh, through a private sshd on loopback.

The test runs its own ``sshd`` (its config, host key and authorized key in tmp_path, a free high port,
listening on 127.0.0.2 and 127.0.0.3 only — no other address is ever contacted) and the system ``ssh``
client with ``BatchMode=yes``. A 2-node × 2-rank cell runs through it (names in, results back, output
labelled by node), re-runs warm, and ``%distributed_shutdown`` ends the ssh sessions and their agents. A host
whose port is closed (127.0.0.4) and a host without nbtrain are reported in the cell, with ssh's own words,
within seconds. Mistakes in ``--hosts`` are refused before anything starts.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from helpers.detachhelp import kernels, runs  # noqa: F401  (the fixtures)
from helpers.detachhelp import assert_nothing_left, start_detached, wait_for_step
from helpers.kernelhelp import Kernel
from helpers.workers import assert_no_workers

from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve
from nbtrain.wire import runfolder

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
HOSTS = ("127.0.0.2", "127.0.0.3")
BASE = "%%distributed --nodes 2 --nproc-per-node 2 --rdzv-host 127.0.0.1 --cpu --start-timeout 120"


@pytest.mark.parametrize("hosts, nodes, message", [
    ("a,b,c", "2", "--hosts names 3 hosts but --nodes is 2"),
    ("-oProxyCommand=touch,b", "2", "is not a host name ssh can take"),
    ("a,a", "2", "names a more than once"),
    ("a", None, "--hosts starts node agents for --nodes N"),
])
def test_bad_hosts_are_refused_before_anything_starts(hosts, nodes, message):
    with pytest.raises(ConfigError, match=message):
        resolve(LaunchRequest(nodes=nodes, rdzv_host="127.0.0.1", cpu=True, hosts=hosts))


def test_a_bad_ssh_option_is_refused():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        resolve(LaunchRequest(nodes="1", rdzv_host="127.0.0.1", cpu=True, hosts="a", ssh_option=("-v",)))


def test_a_missing_ssh_client_is_said_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh on it
    with pytest.raises(ConfigError, match="the ssh client, which is not installed here"):
        resolve(LaunchRequest(nodes="1", rdzv_host="127.0.0.1", cpu=True, hosts="a"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOSTS[0], 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if SSHD is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("needs openssh-server and openssh-client (apt-get install openssh-server); .ci/run installs them")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", *[f"ListenAddress {h}" for h in HOSTS], f"HostKey {d / 'host_key'}",
        f"PidFile {d / 'sshd.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}", f"AllowUsers {getpass.getuser()}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        "StrictModes no", "UsePAM no", ""]))
    server = subprocess.Popen([SSHD, "-D", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection((HOSTS[1], port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    if server.poll() is not None:
        pytest.skip(f"this machine's sshd would not start: {(d / 'sshd.log').read_text()[-300:]}")
    options = [f"Port={port}", f"IdentityFile={d / 'user_key'}", "IdentitiesOnly=yes",
               f"UserKnownHostsFile={d / 'known_hosts'}", "StrictHostKeyChecking=accept-new"]
    # the hosts' Python is this one, with the tests' PYTHONPATH (nbtrain from this checkout)
    python = f"env PYTHONPATH={os.environ.get('PYTHONPATH', '')} {sys.executable}"
    yield " ".join(f"--ssh-option {o}" for o in options) + f" --remote-python '{python}'"
    server.terminate()
    server.wait(10)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    k.run("%load_ext nbtrain\nscale = 3")
    yield k
    k.shutdown()
    assert_no_workers(15)


def _ssh_children(kernel: Kernel) -> list[psutil.Process]:
    return [p for p in psutil.Process(kernel.pid()).children() if p.name() == "ssh"]


def test_two_nodes_started_over_ssh_run_the_cell(sshd, kernel):
    line = f"{BASE} --hosts {','.join(HOSTS)} {sshd}\n"
    out = kernel.run(line + "print(f'hi from {rank}')\ntotal = scale * world_size + rank\n", timeout=180)
    assert "starting node agents over ssh on 127.0.0.2, 127.0.0.3" in out, out
    assert "python -m nbtrain.node --join" not in out  # nobody has to paste the command
    assert "[node a rank" in out and "[node b rank" in out and "hi from 3" in out, out
    assert "total 12" in kernel.run("print('total', total)")
    sessions = _ssh_children(kernel)
    assert len(sessions) == 2 and all("BatchMode=yes" in p.cmdline() for p in sessions)
    assert not any("nbt1." in arg for p in sessions for arg in p.cmdline())  # the token went through stdin
    again = kernel.run(line + "again = world_size\n", timeout=60)
    assert "(warm)" in again and "starting node agents" not in again, again
    listing = kernel.run("%distributed_nodes")
    assert "(127.0.0.2)" in listing and "(127.0.0.3)" in listing, listing
    kernel.run("%distributed_shutdown")
    psutil.wait_procs(sessions, timeout=15)  # the agents leave with the pool; their ssh sessions end
    assert not [p for p in sessions if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_an_unreachable_host_is_reported_with_ssh_s_words(sshd, kernel):
    started = time.monotonic()
    reply, out = kernel.execute(f"{BASE} --hosts 127.0.0.2,127.0.0.4 {sshd}\nx = 1\n", timeout=60)
    took = time.monotonic() - started
    assert reply["status"] == "error"
    assert "the node on 127.0.0.4 could not be started over ssh: ssh could not reach or log in to it" in out, out
    assert "Connection refused" in out, out  # ssh's own stderr
    assert took < 30  # not --start-timeout's 120 s
    kernel.run("%distributed_shutdown")


def test_a_host_without_nbtrain_is_reported(sshd, kernel):
    options = sshd.rsplit(" --remote-python", 1)[0]
    reply, out = kernel.execute(f"{BASE.replace('--nodes 2', '--nodes 1')} --hosts 127.0.0.3 {options} "
                                f"--remote-python 'env PYTHONPATH= {sys.executable} -I -S'\nx = 1\n", timeout=60)
    assert reply["status"] == "error"
    assert "the node on 127.0.0.3 could not be started over ssh: the agent exited with 1" in out, out
    assert "No module named 'nbtrain'" in out and "install nbtrain there" in out, out
    kernel.run("%distributed_shutdown")


def test_distributed_nodes_starts_hosts_before_any_cell(sshd, kernel):
    reply, out = kernel.execute("%distributed_nodes --hosts 127.0.0.2")
    assert reply["status"] == "error" and "--hosts needs --rdzv-host ADDRESS" in out, out
    out = kernel.run(f"%distributed_nodes --rdzv-host 127.0.0.1 --hosts {','.join(HOSTS)} {sshd}")
    assert "starting node agents over ssh on 127.0.0.2, 127.0.0.3" in out, out
    deadline = time.monotonic() + 60
    while "(127.0.0.3)" not in out or "(127.0.0.2)" not in out:
        assert time.monotonic() < deadline, out
        time.sleep(0.5)
        out = kernel.run("%distributed_nodes")
    sessions = _ssh_children(kernel)
    ran = kernel.run(f"{BASE}\nlate = world_size\n", timeout=120)  # the joined nodes: nothing to paste or start
    assert "python -m nbtrain.node --join" not in ran and "starting node agents" not in ran, ran
    assert "late 4" in kernel.run("print('late', late)")
    kernel.run("%distributed_shutdown")
    psutil.wait_procs(sessions, timeout=15)
    assert not [p for p in sessions if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_kernel_death_ends_the_ssh_sessions_and_their_agents(sshd, kernel):
    kernel.run(f"{BASE} --hosts {','.join(HOSTS)} {sshd}\nx = 1\n", timeout=180)
    sessions = _ssh_children(kernel)
    assert len(sessions) == 2
    join = re.search(r"--join (\S+)", sessions[0].cmdline()[-1]).group(1)  # this kernel's agents, not others'
    agents = [p for p in psutil.process_iter(["name", "cmdline"])
              if p.info["name"] != "ssh" and f"nbtrain.node --join {join}" in " ".join(p.info["cmdline"] or [])]
    assert len(agents) == 2  # their parents are sshd's sessions, not the kernel
    os.kill(kernel.pid(), signal.SIGKILL)
    psutil.wait_procs(sessions + agents, timeout=15)  # an agent leaves a silent kernel within 5 s; its ssh follows
    assert not [p for p in sessions + agents if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_a_detached_run_starts_its_nodes_over_ssh_and_outlives_its_kernel(sshd, runs, kernels):  # noqa: F811
    """``--detach --hosts``: the run's agent starts the nodes' agents over ssh itself, so the ssh sessions are
    its children, not the kernel's: the kernel SIGKILLed, the ranks on both hosts go on, and a new kernel gets the
    names; the sessions end with the run."""
    first = kernels()
    cell = (f"%%distributed --detach --nodes 2 --nproc-per-node 1 --rdzv-host 127.0.0.1 --cpu --no-dashboard "
            f"--hosts {','.join(HOSTS)} {sshd}\n"
            "import time, torch, torch.distributed as dist, nbtrain\n"
            "for step in range(60):\n"
            "    t = torch.ones(1); dist.all_reduce(t)\n"
            "    nbtrain.log(seen=step); time.sleep(0.05)\n"
            "total = t.item() * world_size\n")
    run_id, _ = start_detached(first, cell)
    at_kill = wait_for_step(run_id, 10, timeout=120)
    agent = psutil.Process(at_kill.agent_pid)
    sessions = [p for p in agent.children() if p.name() == "ssh"]
    assert len(sessions) == 2  # started by the run's agent
    os.kill(first.pid(), signal.SIGKILL)
    wait_for_step(run_id, at_kill.step + 10)
    second = kernels()
    out = second.run(f"%distributed_attach {run_id}", timeout=120)
    assert "back in the notebook:" in out, out
    assert second.run("print(total)").strip() == "4.0"
    assert_nothing_left(runfolder.read_manifest(run_id))
    psutil.wait_procs(sessions, timeout=15)
    assert not [p for p in sessions if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
