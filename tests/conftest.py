"""Shared fixtures: every test ends with no nbtrain process left behind.

Pools of ranks come from one place, in two lifetimes: ``pools`` is shared by a module's tests (only the
first pays for starting the ranks), ``fresh_pools`` is a test's own (for tests that time a start, stop
the pool, wait for its idle timeout or check that nothing is left after each test).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid

import pytest
from helpers import tiers
from helpers.chartbuild import ensure_chart_bundle
from helpers.workers import SESSION_VARIABLE, assert_no_workers

# The fast tier (``pytest -m "not slow"``): tests that start ranks, kernels, servers, node agents or a browser
# are slow — by the fixtures they take, or by a module's ``pytestmark = pytest.mark.slow`` where they start
# them themselves. Everything else is a unit test of the development loop.
SLOW_FIXTURES = {"pools", "fresh_pools", "shell", "kernel", "cluster", "nodes", "sshd", "slurm_cluster", "jp_serverapp", "jp_fetch",
                 "no_leftover_workers", "namespace", "kernel_name", "notebook_dir"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Unmarked tests are held to the fast tier's limit (tests/helpers/tiers.py): a helper that starts a kernel,
    nodes or a server fails them at once, and one that ran too long fails after it."""
    slow = item.get_closest_marker("slow") is not None
    tiers.entering(slow)
    limit, started = tiers.fast_limit(), time.monotonic()
    try:
        result = yield
    finally:
        tiers.entering(True)
    took = time.monotonic() - started
    if not slow and took > limit:
        pytest.fail(f"an unmarked test took {took:.1f} s, over the fast tier's {limit:.1f} s: make it faster "
                    "or mark it slow", pytrace=False)
    return result


# Ranks (and kernels started by tests) inherit this, so a check only sees this test run's processes.
os.environ.setdefault(SESSION_VARIABLE, uuid.uuid4().hex)
# Detached runs' folders of this test run (kernels and agents inherit it): never the user's own runs directory
os.environ.setdefault("NBTRAIN_RUNS_DIR", tempfile.mkdtemp(prefix="nbtrain-test-runs-"))


@pytest.fixture(scope="session")
def chart_bundle():
    """The dashboard's chart module, rebuilt from its sources when they are newer (widgets and kernels load it)."""
    return ensure_chart_bundle()


@pytest.fixture(autouse=True)
def _chart_where_it_is_loaded(request):
    """Built once per test session, and only for tests that may load it: the slow ones (kernels, browsers, ranks
    with a dashboard) and the dashboard's own."""
    if request.node.get_closest_marker("slow") or "dashboard" in request.node.module.__name__:
        request.getfixturevalue("chart_bundle")


_ZYGOTE: list = []  # the test run's zygote, shared by the pool fixtures as a kernel's pools share the kernel's


def shared_zygote():
    """The zygote the pool fixtures fork ranks from, started once per test run (NBTRAIN_TEST_SPAWN=1: none, every
    rank spawned); a kernel has one from ``%load_ext nbtrain``."""
    from nbtrain.kernel.ranks.zygote_handle import ZygoteHandle

    if os.environ.get("NBTRAIN_TEST_SPAWN") == "1":
        return None
    if not _ZYGOTE or _ZYGOTE[0].why_not():  # none yet, or it died
        _ZYGOTE[:] = [ZygoteHandle.start()]
    return _ZYGOTE[0]


@pytest.fixture(scope="session", autouse=True)
def _close_test_zygote():
    yield
    for zygote in _ZYGOTE:
        zygote.close()


@contextlib.contextmanager
def _pool_manager():
    from nbtrain.kernel.lifecycle.pools import PoolManager
    from nbtrain.kernel.ranks.starter import RankStarter

    manager = PoolManager(starter=RankStarter(shared_zygote()))
    try:
        yield manager
    finally:
        manager.shutdown()
    assert_no_workers()


@pytest.fixture
def no_leftover_workers():
    """Use in a test (or autouse in a module) to check that its ranks are all gone afterwards."""
    yield
    assert_no_workers()


@pytest.fixture(scope="module")
def pools():
    """One warm pool of ranks per test module; afterwards, no rank of this test run is left."""
    with _pool_manager() as manager:
        yield manager


@pytest.fixture
def fresh_pools():
    """A pool of ranks for this test only; afterwards, no rank of this test run is left."""
    with _pool_manager() as manager:
        yield manager


@pytest.fixture(scope="module")
def shell():
    """An IPython shell with nbtrain loaded; its warm ranks are stopped after the module."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbtrain")
    yield ip
    ip.run_line_magic("distributed_shutdown", "")
    assert_no_workers()


@pytest.fixture
def nodes():
    """Node agents on 127.0.0.2, 127.0.0.3, … joined to a cluster in this process (``nodes.start(address)``)."""
    from helpers.nodehelp import Nodes

    n = Nodes()
    yield n
    n.close()
    assert_no_workers(10)
