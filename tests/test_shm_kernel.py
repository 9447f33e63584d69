"""A real kernel that dies or is stopped while big tensors are in /dev/shm leaves nothing there.

The kernel is killed with SIGKILL (it cannot clean up): its warm ranks remove its files on their way out,
and a later ``%load_ext nbtrain`` removes those of a kernel that had no ranks left to do it.
"""

from __future__ import annotations

import contextlib

import os
import signal
import time

import psutil
import pytest
from helpers.attacker import needs_root, plant
from helpers.kernelhelp import Kernel
from helpers.workers import nbtrain_workers

pytestmark = pytest.mark.usefixtures("no_leftover_workers")

HOLD_A_FILE = ("import torch\nfrom nbtrain.kernel.request.inputs import pack_inputs\n"
               "held = pack_inputs({'t': torch.ones(8_000_000)}, ['t'])\nprint(len(held.arena.paths))")
BIG_BOTH_WAYS = "%%distributed 2 --cpu --out big2\nbig2 = big * 2\n"


def files_of(pid: int) -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"nbtrain-{pid}-")}


def warm_kernel() -> Kernel:
    kernel = Kernel()
    kernel.run("%load_ext nbtrain")
    kernel.run("%%distributed 2 --cpu --keep-alive 600 --quiet\nwarm = True")
    return kernel


def kill_and_wait_for_ranks(kernel: Kernel) -> None:
    workers = nbtrain_workers()
    os.kill(kernel.pid(), signal.SIGKILL)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, "ranks did not exit by themselves after their kernel died"


def test_ranks_remove_the_files_of_a_kernel_killed_while_it_held_them():
    kernel = warm_kernel()
    pid = kernel.pid()
    try:
        reply, out = kernel.execute(HOLD_A_FILE)
        assert "1" in out and len(files_of(pid)) == 1
        kill_and_wait_for_ranks(kernel)
        assert files_of(pid) == set()
    finally:
        kernel.shutdown()


def test_load_ext_removes_the_files_of_a_kernel_that_died_without_ranks():
    first = Kernel()
    pid = first.pid()
    second = None
    try:
        reply, out = first.execute(HOLD_A_FILE)
        assert len(files_of(pid)) == 1, out
        os.kill(pid, signal.SIGKILL)  # a zombie until its parent reaps it: dead all the same
        second = Kernel()
        second.run("%load_ext nbtrain")
        assert files_of(pid) == set()
    finally:
        first.shutdown()
        if second is not None:
            second.shutdown()


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_kernel_killed_while_shipping_a_big_tensor_both_ways_leaves_nothing(delay):
    kernel = warm_kernel()
    pid = kernel.pid()
    try:
        kernel.execute("import torch\nbig = torch.randn(16_000_000)")  # 64 MB in, 64 MB back
        kernel.start(BIG_BOTH_WAYS)
        time.sleep(delay)
        kill_and_wait_for_ranks(kernel)
        assert files_of(pid) == set()
    finally:
        kernel.shutdown()


def wait_for_file(pid: int, tag: str, timeout: float = 30.0) -> bool:
    """Until a file of the kernel ``pid`` whose name goes on with ``tag`` exists (polled every millisecond)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(name[len(f"nbtrain-{pid}-"):].startswith(tag) for name in files_of(pid)):
            return True
        time.sleep(0.001)
    return False


def test_stop_button_while_shipping_a_big_tensor_leaves_nothing():
    kernel = warm_kernel()
    pid = kernel.pid()
    try:
        kernel.execute("import torch\nbig = torch.randn(16_000_000)")
        # while the kernel writes the input (names are hex), then while rank 0 writes the result ("r");
        # a write the poll did not see in time is tried again
        for tag, cell in (("", BIG_BOTH_WAYS), ("r", "%%distributed 2 --cpu --out big2\nbig2 = big * 3\n")):
            for _attempt in range(3):
                msg_id = kernel.start(cell)
                seen = wait_for_file(pid, tag, timeout=5.0)
                if seen:
                    kernel.km.interrupt_kernel()
                reply, out = kernel.collect(msg_id, 60)
                assert files_of(pid) == set()
                if seen and "KeyboardInterrupt" in out:
                    break
            else:
                pytest.fail(f"no interrupt landed while a {'result' if tag else 'input'} file was written")
        # (no "next cell" check here: ipykernel 7 may deliver one more KeyboardInterrupt to a later cell after
        # an interrupt that lands in plain Python code — test_kernel.py checks the next cell after a stop)
        kernel.execute("%distributed_shutdown")
    finally:
        kernel.shutdown()


# 128 MiB: two of the 64 MiB pieces wire.shm writes, so a kill can land inside the kernel's write; smaller than the
# 512 MiB a notebook left behind only for the test's speed. Before any rank exists, only the zygote outlives the
# kernel: it must remove the file (no later %load_ext runs in this test, and nothing else would).
BIG_INPUT_BYTES = 128 * 2**20
READ_BIG = "%%distributed 2 --cpu\ntotal = float(big.sum())\n"


def zygote_of(kernel: Kernel) -> psutil.Process:
    kernel.run("assert get_ipython()._nbtrain_magics.pools.starter.zygote.wait_ready()")
    return next(child for child in psutil.Process(kernel.pid()).children()
                if "nbtrain.rank.zygote" in " ".join(child.cmdline()))


def sizes_of(pid: int) -> list[int]:
    """The sizes of the kernel ``pid``'s files (this user's: another's under its prefix is not the kernel's)."""
    found = []
    for name in files_of(pid):
        try:
            facts = os.lstat(f"/dev/shm/{name}")
        except FileNotFoundError:
            continue
        if facts.st_uid == os.geteuid():
            found.append(facts.st_size)
    return found


def _ranks_forked(zygote: psutil.Process) -> int:
    """The zygote's children that became ranks (not its idle spares, nor a store host)."""
    count = 0
    for child in zygote.children():
        with contextlib.suppress(psutil.Error):
            count += child.name() == "nbtrain-rank"
    return count


# when the kernel is killed: while it writes the tensor; once it wrote it (the zygote forks the ranks); once the
# ranks exist (they map the file, then the kernel would remove it)
MOMENTS = {
    "writing": lambda pid, zygote: any(size < BIG_INPUT_BYTES for size in sizes_of(pid)),
    "written": lambda pid, zygote: BIG_INPUT_BYTES in sizes_of(pid),
    "forked": lambda pid, zygote: _ranks_forked(zygote) == 2 and sizes_of(pid),
}


@needs_root  # another user's file under the kernel's prefix is theirs: it stays
@pytest.mark.parametrize("moment", MOMENTS)
def test_a_kernel_killed_while_sending_a_big_tensor_leaves_no_shared_memory(moment):
    kernel = Kernel()
    pid = kernel.pid()
    theirs = plant(f"/dev/shm/nbtrain-{pid}-theirs")
    try:
        kernel.run("%load_ext nbtrain")
        zygote = zygote_of(kernel)
        kernel.run(f"import torch\nbig = torch.ones({BIG_INPUT_BYTES // 4})")
        kernel.start(READ_BIG)
        deadline = time.monotonic() + 60
        while not MOMENTS[moment](pid, zygote):
            assert time.monotonic() < deadline, f"the cell never reached the moment '{moment}'"
            time.sleep(0.0005)
        os.kill(pid, signal.SIGKILL)
        left = [zygote, *zygote.children()]
        _gone, alive = psutil.wait_procs(left, timeout=15)
        assert not alive, "the zygote and the ranks exit with their kernel"
        assert sizes_of(pid) == [], f"{sizes_of(pid)} bytes of shared memory outlived the kernel"
        assert os.path.exists(theirs), "another user's file under the kernel's prefix is theirs"
    finally:
        kernel.shutdown()
        os.unlink(theirs)
