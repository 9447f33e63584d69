"""The CPU/RAM path of the telemetry, for real: psutil on real processes (what CI and laptops use)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
from helpers.workers import parent_and_child, parent_code

from nbtrain.kernel.dashboard.threads import Sampler, check_interval
from nbtrain.gpu import nvml
from nbtrain.gpu.telemetry import NO_DRIVER, Telemetry, snapshot

SPIN_30_S = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


@pytest.fixture
def busy_tree():
    """An idle parent whose child spins a core: the tree's CPU is the child's."""
    with parent_and_child(SPIN_30_S, seconds=30) as pids:
        yield pids


def test_process_tree_cpu_and_memory(busy_tree):
    parent, child = busy_tree
    tel = Telemetry([(0, parent)])
    tel.snapshot()
    time.sleep(1.0)
    usage = tel.snapshot().ranks[0]
    assert usage.alive and usage.pid == parent
    assert usage.cpu_percent > 25, "the busy child's CPU counts for the rank"
    parent_rss = psutil.Process(parent).memory_info().rss
    assert usage.rss > parent_rss, "the child's memory counts too"


def test_first_reading_is_not_measured_and_no_reading_exceeds_the_cores(busy_tree):
    """A rank's first CPU reading has no baseline (N/A, not noise like "501%"); none exceeds cores × 100."""
    parent, child = busy_tree
    tel = Telemetry([(0, parent), (1, child)])  # the child is rank 0's descendant and rank 1's root
    assert [u.cpu_percent for u in tel.snapshot().ranks] == [None, None]
    time.sleep(0.1)
    readings = [u.cpu_percent for _ in range(300) for u in tel.snapshot().ranks]  # back to back: tiny intervals
    assert all(0 <= r <= 100 * psutil.cpu_count() for r in readings), max(readings)
    assert max(readings) > 25


GRANDPARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, '-c', {busy!r}], stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
child.wait()
"""


def test_tree_members_found_without_reading_every_process(monkeypatch):
    """Children and grandchildren count, found from the rank down: not by reading the whole machine's
    process table (psutil's children() does, once a second, from the CPU the ranks train with)."""
    from nbtrain.gpu import processes

    top = subprocess.Popen([sys.executable, "-c", GRANDPARENT.format(busy=parent_code(SPIN_30_S, 30))], stdout=subprocess.PIPE, text=True)
    try:
        child, grandchild = map(int, top.stdout.readline().split())
        expected = {p.pid for p in psutil.Process(top.pid).children(recursive=True)}
        assert {child, grandchild} <= expected
        listed = []
        every_parent = psutil._ppid_map  # what psutil's children() reads: /proc/*/stat of the whole machine
        monkeypatch.setattr(psutil, "_ppid_map", lambda: listed.append("ppid_map") or every_parent())
        assert set(processes.descendants(psutil.Process(top.pid))) == expected
        trees = processes.ProcessTrees()
        trees.usage(top.pid)
        time.sleep(0.1)
        usage = trees.usage(top.pid)
        assert usage.pids == frozenset({top.pid} | expected) and usage.cpu_percent > 0
        assert listed == [], "the telemetry listed every process of the machine"
    finally:
        for pid in psutil.Process(top.pid).children(recursive=True):
            pid.kill()
        top.kill()
        top.wait(5)


def test_exited_process_is_marked_not_raised(busy_tree):
    parent, child = busy_tree
    tel = Telemetry([(0, parent), (1, child)])
    psutil.Process(child).kill()
    time.sleep(0.3)  # dead (a zombie until its parent reaps it, which this parent never does)
    usages = {u.rank: u for u in tel.snapshot().ranks}
    assert usages[0].alive and not usages[1].alive and usages[1].cpu_percent is None


def test_machine_snapshot_without_gpu():
    snap = snapshot()
    assert snap.host.cpu_count >= 1 and 0 < snap.host.memory_used <= snap.host.memory_total
    if nvml.library() is None:
        assert snap.gpus == () and snap.nvml_error.startswith(NO_DRIVER)


def test_sampler_runs_in_background_and_stops(busy_tree):
    parent, _ = busy_tree
    samples = []
    sampler = Sampler(Telemetry([(0, parent)]), samples.append, interval=0.25).start()
    time.sleep(1.3)
    sampler.stop()
    count = len(samples)
    assert 3 <= count <= 7 and not sampler.running and sampler.errors == 0
    time.sleep(0.4)
    assert len(samples) == count, "no sample after stop()"
    assert samples[0].ranks[0].cpu_percent is None, "no reading before a baseline"
    assert max(s.ranks[0].cpu_percent or 0 for s in samples) > 25


def test_the_machines_cpu_is_measured_from_the_first_sample_whichever_thread_takes_it(busy_tree):
    """A core spins: the machine's CPU reads well above 0 in the sampler thread's first sample (psutil's own
    machine-wide baseline is per thread: there it read 0 %) and in ``%gpus --once``'s table."""
    from nbtrain.kernel.dashboard import monitor

    samples = []
    telemetry = Telemetry()  # made on this thread, as the dashboard makes it; sampled on the sampler's
    time.sleep(0.5)
    sampler = Sampler(telemetry, samples.append, interval=0.25).start()
    time.sleep(0.1)
    sampler.stop()
    cores = psutil.cpu_count()
    assert samples[0].host.cpu_percent is not None and samples[0].host.cpu_percent > 50 / cores, samples[0].host
    busy = float(monitor.once().split("machine: CPU ", 1)[1].split("%", 1)[0])
    assert busy > 50 / cores


@pytest.mark.parametrize("bad", [0.1, 6, "fast", None])
def test_interval_out_of_range_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="interval"):
        check_interval(bad)
