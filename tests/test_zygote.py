"""Ranks forked from the kernel's zygote (nbtrain.kernel.ranks.zygote_handle, nbtrain.rank.zygote), on real processes.

The pool fixtures fork their ranks from the test run's zygote (conftest), so every run test exercises forked
ranks; here: what is the zygote's own — the packages the notebook imported since it started, the refusal when
it saw CUDA initialised, random streams, memory shared copy-on-write, the zygote's end with the kernel's, and
the cold start's split.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.restart_cells import killed_rank_cell
from helpers.runhelp import Captured, run_cell
from helpers.workers import assert_no_workers

from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.ranks.interpreter import interpreter_env
from nbtrain.kernel.ranks.starter import RankStarter
from nbtrain.kernel.ranks.zygote_handle import ZygoteHandle
from nbtrain.wire import forking

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.environ.get("NBTRAIN_TEST_SPAWN") == "1",
                                                 reason="NBTRAIN_TEST_SPAWN=1: the pool fixtures have no zygote")]

PARENTS = "import os\nparent, session = os.getppid(), os.getsid(0) == os.getpid()\n"


@pytest.fixture
def own_zygote():
    """A pool manager with a zygote of its own (one a test may make unusable)."""
    manager = PoolManager(starter=RankStarter())
    manager.starter.start_zygote()
    try:
        yield manager
    finally:
        manager.shutdown()
        manager.starter.close()
    assert_no_workers()


def installed_module(tmp_path, name: str, body: str) -> str:
    """A module in a site-packages folder on this process's path, as a package installed with pip."""
    site = tmp_path / "site-packages"
    site.mkdir(exist_ok=True)
    (site / f"{name}.py").write_text(textwrap.dedent(body))
    sys.path.append(str(site))
    return str(site)


def test_ranks_are_forked_by_the_zygote_in_sessions_of_their_own_and_spawned_with_spawn(fresh_pools):
    zygote = fresh_pools.starter.zygote
    ns, result = run_cell(fresh_pools, PARENTS, out="parent,session", fresh=True)
    assert ns["parent"] == zygote.pid and ns["session"]
    assert result.cold_start is not None and result.cold_start.how == "forked"
    assert zygote.why_not() == "", "the zygote never initialises CUDA nor starts a thread"
    ns, result = run_cell(fresh_pools, PARENTS, out="parent,session", fresh=True, spawn=True)
    assert ns["parent"] == os.getpid() and ns["session"] and result.cold_start.how == "spawned"


def test_a_package_the_notebook_imported_since_is_imported_by_the_zygote_before_it_forks(fresh_pools, tmp_path):
    site = installed_module(tmp_path, "nbtrain_probe_lib", "import os\nimported_by = os.getpid()\n")
    try:
        import nbtrain_probe_lib  # noqa: F401  (the notebook imports a library after %load_ext)

        cell = "import sys\nhad = 'nbtrain_probe_lib' in sys.modules\nimport nbtrain_probe_lib\nby = nbtrain_probe_lib.imported_by\n"
        ns, _ = run_cell(fresh_pools, cell, out="had,by", fresh=True)
        assert ns["had"] and ns["by"] == fresh_pools.starter.zygote.pid
    finally:
        sys.path.remove(site)
        sys.modules.pop("nbtrain_probe_lib", None)


def _spares_of(zygote: psutil.Process, count: int) -> set[int]:
    """The zygote's idle spare forks, once there are ``count`` of them (they are forked while it idles)."""
    deadline = time.monotonic() + 30
    while True:
        found = {child.pid for child in zygote.children() if child.name() == "nbtrain-spare"}
        if len(found) == count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_an_idle_zygote_forks_spares_ahead_and_a_cold_pool_takes_them_unless_the_notebook_imported_since(
        own_zygote, tmp_path):
    from nbtrain.rank.spares import SPARE_RANKS

    zygote = psutil.Process(own_zygote.starter.zygote.pid)
    spares = _spares_of(zygote, SPARE_RANKS + 1)  # a store's too
    assert len(spares) == SPARE_RANKS + 1
    cell = "import os, sys\npid, parent = os.getpid(), os.getppid()\nhad = 'nbtrain_spare_probe' in sys.modules\n"
    ns, result = run_cell(own_zygote, cell, out="pid,parent,had", fresh=True)
    stores = [child.pid for child in zygote.children() if child.name() == "nbtrain-store"]
    assert ns["pid"] in spares and ns["parent"] == zygote.pid and result.cold_start.how == "forked"
    assert len(stores) == 1 and stores[0] in spares  # the pool's store host was a spare too
    again = _spares_of(zygote, SPARE_RANKS + 1)  # forked again once the zygote idled
    assert len(again) == SPARE_RANKS + 1 and ns["pid"] not in again and stores[0] not in again
    assert len(again - spares) == 3  # the pool's 2 ranks and its store, replaced; the spares it left stay
    site = installed_module(tmp_path, "nbtrain_spare_probe", "VALUE = 1\n")
    try:
        import nbtrain_spare_probe  # noqa: F401  (imported after the spares were forked: they lack it)

        ns, _ = run_cell(own_zygote, cell, out="pid,parent,had", fresh=True)
        assert ns["had"] and ns["pid"] not in again and ns["parent"] == zygote.pid
    finally:
        sys.path.remove(site)
        sys.modules.pop("nbtrain_spare_probe", None)


def test_a_zygote_that_saw_cuda_initialised_forks_no_more_and_the_cell_says_why(own_zygote, tmp_path):
    # No GPU here: the library stands in for one that initialises CUDA when imported (in the zygote only).
    site = installed_module(tmp_path, "nbtrain_cuda_lib", """
        import sys, torch
        if getattr(sys.modules["__main__"].__spec__, "name", "") == "nbtrain.rank.zygote":
            torch.cuda.is_initialized = lambda: True
    """)
    try:
        import nbtrain_cuda_lib  # noqa: F401

        out = Captured()
        ns, result = run_cell(own_zygote, PARENTS, out="parent", write=out, fresh=True)
        assert ns["parent"] == os.getpid(), "spawned by the kernel"
        assert result.cold_start.how == "spawned"
        said = out.text()
        assert said.count("not forked from the zygote") == 1 and "saw CUDA initialised" in said, said
    finally:
        sys.path.remove(site)
        sys.modules.pop("nbtrain_cuda_lib", None)


RANDOM = """
import random, numpy, torch
values = (random.random(), float(numpy.random.rand()), torch.rand(1).item())
random.seed(7); numpy.random.seed(7); torch.manual_seed(7)
seeded = (random.random(), float(numpy.random.rand()), torch.rand(1).item())
both = [None, None]
import torch.distributed as dist
dist.all_gather_object(both, values)
"""


def test_random_streams_differ_per_forked_rank_and_seeded_ones_equal_a_spawned_ranks(fresh_pools):
    import numpy  # noqa: F401  (imported in the notebook: the zygote has it too, and must reseed it)

    forked, _ = run_cell(fresh_pools, RANDOM, out="both,seeded", fresh=True)
    rank0, rank1 = forked["both"]
    assert all(a != b for a, b in zip(rank0, rank1, strict=True)), forked["both"]
    spawned, _ = run_cell(fresh_pools, RANDOM, out="both,seeded", fresh=True, spawn=True)
    assert forked["seeded"] == spawned["seeded"]
    assert rank0 not in spawned["both"], "a fork does not replay the zygote's streams"


def test_forked_ranks_share_the_zygotes_memory(fresh_pools):
    def pss_mib() -> list[float]:
        return [psutil.Process(pid).memory_full_info().pss / 2**20 for pid in fresh_pools.pool.pids()]

    run_cell(fresh_pools, "import torch\nx = torch.ones(4)\n", out="-", fresh=True)
    forked = pss_mib()
    run_cell(fresh_pools, "import torch\nx = torch.ones(4)\n", out="-", fresh=True, spawn=True)
    spawned = pss_mib()
    assert max(forked) < 0.6 * min(spawned), f"PSS forked {forked} MiB, spawned {spawned} MiB"


def test_the_zygote_its_ranks_and_the_store_end_when_the_kernel_is_killed():
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain")
        zygote = int(kernel.run("print(get_ipython()._nbtrain_magics.pools.starter.zygote.pid)").strip())
        msg_id = kernel.start("%%distributed 2 --cpu\nimport os, time\nprint('up', os.getppid(), flush=True)\n"
                              "time.sleep(600)\n")
        out = kernel.collect(msg_id, 90, until=lambda out: out.count("up ") >= 2)[1]
        assert f"up {zygote}" in out, out
        children = psutil.Process(zygote).children()
        ranks = [p for p in children if p.name() == "nbtrain-rank"]
        others = [p.name() for p in children if p not in ranks and p.name() != "nbtrain-spare"]
        assert len(ranks) == 2 and others == ["nbtrain-store"]  # the pool's store (and the spares: they end too)
        os.kill(kernel.pid(), signal.SIGKILL)
        gone, alive = psutil.wait_procs([psutil.Process(zygote), *children], timeout=5)
        assert not alive, f"still alive after the kernel died: {[p.pid for p in alive]}"
    finally:
        kernel.shutdown()
    assert_no_workers()


def test_a_start_time_is_said_in_milliseconds_below_a_tenth_of_a_second():
    from nbtrain.kernel.observers.coldstart import latency

    assert [latency(s) for s in (0.0, 0.004, 0.0449, 0.1, 0.173, 5.84, 95.3)] == \
        ["0 ms", "4 ms", "45 ms", "0.10 s", "0.17 s", "5.8 s", "95 s"]


def test_the_summary_splits_the_cold_start(fresh_pools):
    cell = ("import torch\nm = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
            "m(torch.ones(2)).sum().backward()\nopt.step()\n")
    started = time.time()
    _, result = run_cell(fresh_pools, cell, out="-", fresh=True)
    split = result.cold_start
    names = [name for name, _ in split.phases]
    assert names == ["process start", "imports", "rendezvous", "communicator", "names arrive", "first step"]
    assert split.stepped and 0 < split.total_s < time.time() - started
    assert abs(sum(s for _, s in split.phases) - split.total_s) < 0.01
    from nbtrain.kernel.lifecycle.entry import format_summary

    line = next(line for line in format_summary(result) if line.startswith("nbtrain: cold start "))
    assert "forked" in line and " 0.00 s" not in line, line  # a forked start's phases are milliseconds: said so
    _, warm = run_cell(fresh_pools, cell, out="-")
    assert warm.cold_start is None, "a warm run has no cold start"


def test_a_zygote_that_died_is_replaced_and_its_cell_spawns(own_zygote):
    first = own_zygote.starter.zygote
    os.kill(first.pid, signal.SIGKILL)
    psutil.Process(first.pid).wait(5)
    out = Captured()
    ns, _ = run_cell(own_zygote, PARENTS, out="parent", write=out, fresh=True)
    assert ns["parent"] == os.getpid() and "the zygote process ended" in out.text(), out.text()
    second = own_zygote.starter.zygote
    assert second is not first and isinstance(second, ZygoteHandle)
    ns, _ = run_cell(own_zygote, PARENTS, out="parent", fresh=True)
    assert ns["parent"] == second.pid


def test_a_restart_after_a_lost_rank_forks_its_new_ranks(fresh_pools, tmp_path):
    cell = killed_rank_cell(tmp_path / "killed-once", epoch=1) + "parent = os.getppid()\n"
    out = Captured()
    ns, result = run_cell(fresh_pools, cell, write=out, checkpoint=str(tmp_path / "ckpt"), max_restarts=1,
                          out="parent,restart_count")
    assert "rank 1 was killed by SIGKILL" in out.text() and ns["restart_count"] == 1
    assert ns["parent"] == fresh_pools.starter.zygote.pid and result.cold_start.how == "forked"


def test_an_env_read_when_an_interpreter_starts_gets_spawned_ranks_and_says_so(fresh_pools, tmp_path):
    out = Captured()
    ns, _ = run_cell(fresh_pools, PARENTS + "import sys\nfound = sys.path\n", out="parent,found", write=out,
                     fresh=True, env=(f"PYTHONPATH={tmp_path}",))
    assert ns["parent"] == os.getpid() and str(tmp_path) in ns["found"]
    assert "PYTHONPATH differs from the zygote's, and an interpreter reads it when it starts" in out.text(), out.text()
    assert fresh_pools.starter.zygote.why_not() == "", "the next cell without it forks again"


THREADS = """
import ctypes, numpy, torch
path = next(line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.rsplit("/", 1)[-1])
lib = ctypes.CDLL(path)
getter = next(getattr(lib, n) for n in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads") if hasattr(lib, n))
threads = (torch.get_num_threads(), getter())
import os, threading
pythons = {str(t.native_id) for t in threading.enumerate() if t is not threading.main_thread()} | {str(os.getpid())}
native = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task") if t not in pythons)
"""


def test_forked_ranks_size_their_thread_pools_as_spawned_ones(fresh_pools):
    import numpy  # noqa: F401  (the zygote loads its OpenBLAS, sized for the zygote's environment)

    forked, _ = run_cell(fresh_pools, THREADS, out="threads,native", fresh=True, env=("OMP_NUM_THREADS=1",))
    spawned, _ = run_cell(fresh_pools, THREADS, out="threads,native", fresh=True, spawn=True, env=("OMP_NUM_THREADS=1",))
    assert forked["threads"] == spawned["threads"] == (1, 1)
    # no OpenBLAS worker started again after the fork (it would spin ~100 ms of CPU while the rank starts): the
    # native threads are the same as a spawned rank's (gloo's)
    assert forked["native"] == spawned["native"], (forked["native"], spawned["native"])


def test_the_zygote_listens_nowhere_and_hears_only_json(fresh_pools):
    zygote = fresh_pools.starter.zygote
    assert zygote.wait_ready()
    sockets = psutil.Process(zygote.pid).net_connections(kind="all")
    assert sockets and all(s.family == socket.AF_UNIX and not s.laddr for s in sockets), sockets  # the socketpair only
    assert psutil.Process(zygote.pid).environ()[forking.ZYGOTE_FD_ENV].isdigit()  # a descriptor's number, no secret


STAND_IN_DRIVER = """
static int initialised = 0;
int cuInit(unsigned int flags) { initialised = 1; return 0; }
int cuDeviceGetCount(int *count) { if (!initialised) return 3; *count = 1; return 0; }
"""


@pytest.fixture
def stand_in_driver(tmp_path):
    """A ``libcuda.so.1`` answering as the driver does before and after ``cuInit`` (no GPU here)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver")
    (tmp_path / "driver.c").write_text(STAND_IN_DRIVER)
    library = tmp_path / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library),
                    str(tmp_path / "driver.c")], check=True)
    return library


@pytest.mark.parametrize("initialise", [False, True])
def test_a_zygote_forks_with_the_driver_loaded_but_not_after_a_library_called_cuinit(own_zygote, tmp_path,
                                                                                     stand_in_driver, initialise):
    # Importing torch may map libcuda without initialising it (an H200 showed it): that must not stop forks;
    # a library that calls cuInit itself (CuPy, JAX) must.
    site = installed_module(tmp_path, "nbtrain_driver_lib", f"""
        import ctypes, sys
        if getattr(sys.modules["__main__"].__spec__, "name", "") == "nbtrain.rank.zygote":
            driver = ctypes.CDLL({str(stand_in_driver)!r})
            if {initialise}:
                driver.cuInit(0)
    """)
    try:
        import nbtrain_driver_lib  # noqa: F401

        out = Captured()
        ns, result = run_cell(own_zygote, PARENTS, out="parent", write=out, fresh=True)
        if initialise:
            assert result.cold_start.how == "spawned" and ns["parent"] == os.getpid()
            assert "saw the CUDA driver initialised" in out.text(), out.text()
        else:
            assert result.cold_start.how == "forked" and ns["parent"] == own_zygote.starter.zygote.pid
    finally:
        sys.path.remove(site)
        sys.modules.pop("nbtrain_driver_lib", None)


def test_a_forked_ranks_exit_polled_from_two_threads_at_once_is_kept(own_zygote, tmp_path):
    """The zygote hands a rank's exit code out once. The run's thread and a teardown poll the same rank: the one
    that got None (the other had just taken the code) must not overwrite the code, or the rank looks alive for ever
    and the teardown waits out its whole SIGKILL grace."""
    zygote = own_zygote.starter.zygote
    rank = zygote.fork(interpreter_env(dict(os.environ)), str(tmp_path))  # no rank's variables: it exits at once
    psutil.wait_procs([psutil.Process(rank.pid)], timeout=60)  # the zygote's child: ended, reaped or not
    took = zygote.exit_code

    def other_thread_polls_first(pid: int):
        # the other thread's whole poll runs between this call's start and its end: it takes the code
        zygote.exit_code = took
        rank.poll()
        return took(pid)  # None now

    zygote.exit_code = other_thread_polls_first
    try:
        code = rank.poll()
    finally:
        zygote.exit_code = took
    assert code is not None and code != 0
    assert rank.wait(timeout=1) == code
