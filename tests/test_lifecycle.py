"""The pool's life: authenticated channel, torch elastic error files, idle timeout, fast teardown."""

from __future__ import annotations

import ipaddress
import os
import stat
import time
from multiprocessing.connection import AuthenticationError, Client

import psutil
import pytest
from helpers.runhelp import run_cell
from helpers.tiers import load_factor

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.ranks.pool import LocalPool
from nbtrain.kernel.request.config import LaunchRequest, resolve

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


def test_channel_is_a_private_socket_that_refuses_a_wrong_key():
    pool = LocalPool(resolve(LaunchRequest(nprocs=2, cpu=True)).pool)
    try:
        pool.spawn()
        socket_path = os.path.join(pool._dir, "kernel.sock")
        assert stat.S_IMODE(os.stat(pool._dir).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
        with pytest.raises(AuthenticationError):  # refused before anything is unpickled
            Client(socket_path, family="AF_UNIX", authkey=b"not the key")
        deadline = time.monotonic() + 60
        while not pool.connected() and time.monotonic() < deadline:
            pool.poll_events(0.1)
        assert pool.connected()  # the real ranks still got in
        time.sleep(0.2)
        assert not os.path.exists(socket_path)  # and then nothing can connect at all
    finally:
        pool.teardown(graceful=False)


def test_rank_failing_outside_the_cell_reports_torch_elastic_error_file(fresh_pools):
    with pytest.raises(RankFailedError) as err:
        run_cell(fresh_pools, "x = 1", env=("NBTRAIN_TIMEOUT=soon",))
    report = str(err.value)
    assert "exited with code 1 while starting" in report
    assert "Error recorded by rank" in report and "could not convert string to float: 'soon'" in report


def test_a_failure_stops_the_other_ranks_within_2_s(fresh_pools):
    run_cell(fresh_pools, "import torch.distributed as dist")  # warm: measure the failure, not the start
    pids = fresh_pools.pool.pids()
    started = time.monotonic()
    with pytest.raises(RankFailedError):
        run_cell(fresh_pools, "import torch.distributed as dist\nif rank == 0:\n    raise KeyError('x')\ndist.barrier()\n")
    # 2 s on an idle machine (not the collective's timeout of minutes); a loaded one stretches it by its load per core
    assert time.monotonic() - started < 2.0 * load_factor()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_idle_pool_stops_by_itself(fresh_pools):
    run_cell(fresh_pools, "a = 1", keep_alive=0.5)
    pids = fresh_pools.pool.pids()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids], timeout=5)
    assert not alive and fresh_pools.pool is None


def test_different_options_start_a_new_pool_and_stop_the_old(fresh_pools):
    run_cell(fresh_pools, "a = 1")
    old = fresh_pools.pool.pids()
    run_cell(fresh_pools, "a = 1", env=("FOO=1",))
    assert fresh_pools.pool.pids() != old
    assert not [p for p in old if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_every_socket_of_a_run_is_on_loopback_or_a_private_unix_socket(fresh_pools):
    ns, _ = run_cell(fresh_pools, """
        import os, psutil, torch.distributed as dist
        t = torch.ones(1); dist.all_reduce(t)
        mine = [c for c in psutil.Process().net_connections(kind="inet")]
        addresses = sorted({c.laddr.ip for c in mine})
        port = int(os.environ["MASTER_PORT"])
    """, {"torch": __import__("torch")}, out="addresses,port")
    kernel = [c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    store = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == ns["port"]]
    assert ns["addresses"] and all(_loopback(a) for a in ns["addresses"]), ns["addresses"]
    assert kernel == []  # the store is hosted by a process of its own (kernel/ranks/storehost.py)
    assert store and all(_loopback(c.laddr.ip) for c in store) and all(c.pid != os.getpid() for c in store), store


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)
