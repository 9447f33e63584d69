"""A detached run's store, hosted by the agent: it serves the ranks after the kernel that asked for it is killed.

Real processes: a stand-in kernel starts an agent process in its own session; the agent hosts the store
(:class:`nbtrain.node.agent_store.AgentStore`) and writes its port to a file. The kernel is SIGKILLed; a
``TCPStore`` client still sets and reads keys there. When the agent closes the store, its process is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

pytestmark = pytest.mark.timeout(120)

AGENT = textwrap.dedent("""
    import pathlib, signal, sys
    from nbtrain.node.agent_store import AgentStore
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by sigwait below, then the store closed
    store = AgentStore()
    out = pathlib.Path(sys.argv[1])
    out.with_suffix(".tmp").write_text(f"{store.port} {store.pid}")
    out.with_suffix(".tmp").rename(out)
    signal.sigwait({signal.SIGTERM})
    store.close()
""")

KERNEL = textwrap.dedent("""
    import subprocess, sys, time
    agent = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
    print(agent.pid, flush=True)
    time.sleep(600)
""")


def _wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, "the agent did not report its store's port"
        time.sleep(0.05)
    return [int(word) for word in path.read_text().split()]


@pytest.mark.slow  # a node agent, its ranks and a killed kernel: 4–5 s on two shared cores
def test_a_store_hosted_by_the_agent_serves_the_ranks_after_the_kernel_is_killed(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, AGENT, str(tmp_path / "port")],
                              stdout=subprocess.PIPE, text=True, env=env)
    agent_pid = int(kernel.stdout.readline())
    try:
        port, store_pid = _wait_for(tmp_path / "port")
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
        time.sleep(0.5)
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=10))
        client.set("step", "21")
        assert client.get("step") == b"21"
        del client
        os.kill(agent_pid, signal.SIGTERM)
        psutil.Process(agent_pid).wait(30)
        assert not psutil.pid_exists(store_pid) or psutil.Process(store_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        for pid in (agent_pid,):
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
