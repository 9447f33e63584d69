"""Shared-memory transport: tensors round-trip exactly, views stay views, results come back through /dev/shm,
and no file outlives its run — not after an exception, an interrupt in the middle of a write, or a failed rank."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from helpers.runhelp import run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.request.inputs import pack_inputs
from nbtrain.wire.payload import load_inputs, pack_results, unpack_results
from nbtrain.wire.shm import SharedArena, new_result_prefix, owner_prefix, shm_dir, sweep_orphans

MB = 2**20


def own_files() -> set[str]:
    prefix = os.path.basename(owner_prefix())
    return {name for name in os.listdir(shm_dir()) if name.startswith(prefix)}


@pytest.fixture(autouse=True)
def no_files_left():
    before = own_files()
    yield
    assert own_files() == before


def test_inputs_round_trip_bf16_empty_parameters_arrays_and_views_of_one_storage():
    base = torch.randn(600_000).to(torch.bfloat16)
    first, second = base[:300_000], base[300_000:].view(1000, 300)
    weight = torch.nn.Parameter(torch.randn(300, 1000))
    values = {"first": first, "second": second, "weight": weight, "empty": torch.empty(0, 7),
              "flags": torch.rand(400_000) > 0.5, "array": np.arange(100_000, dtype=np.float64),
              "strided": torch.randn(1000, 400).t()}
    inputs = pack_inputs(values, list(values))
    try:
        assert len(inputs.data) < 10_000 and len(inputs.arena.paths) == 5  # first and second share one file
        got = load_inputs(inputs.data)
    finally:
        inputs.arena.close()
    for name, value in values.items():
        assert type(got[name]) is type(value) and got[name].dtype == value.dtype and got[name].shape == value.shape
        assert np.array_equal(got[name], value) if name == "array" else torch.equal(got[name], value.detach())
    assert got["weight"].requires_grad and got["strided"].stride() == values["strided"].stride()
    got["first"][0] = 42  # one mapping: the other view sees it; the notebook's tensor does not
    assert got["second"].untyped_storage().data_ptr() == got["first"].untyped_storage().data_ptr()
    assert base[0] != 42


def test_results_come_back_through_files_that_the_kernel_removes():
    base = torch.randn(2_000_000)
    namespace = {"base": base, "half": base[1_000_000:], "bf": torch.randn(1_000_000).to(torch.bfloat16),
                 "empty": torch.empty(0), "array": np.ones(200_000), "small": torch.ones(3)}
    prefix = new_result_prefix()
    results = pack_results(namespace, list(namespace), prefix)
    assert len(results.bundle) < 10_000  # the bytes are in files, not in the pickle
    assert len([f for f in own_files() if f.startswith(os.path.basename(prefix))]) == 3
    values, skipped = unpack_results(results)
    assert not skipped and not [f for f in own_files() if f.startswith(os.path.basename(prefix))]
    for name, value in namespace.items():
        assert np.array_equal(values[name], value) if name == "array" else torch.equal(values[name], value)
    assert values["half"].untyped_storage().data_ptr() == values["base"].untyped_storage().data_ptr()
    values["base"].add_(1)  # the kernel's own memory now: writable, views follow
    assert torch.equal(values["half"], base[1_000_000:] + 1)


def test_an_untouched_view_of_an_input_comes_back_as_a_view_of_the_notebooks_tensor():
    big = torch.randn(8 * MB // 4)
    inputs = pack_inputs({"big": big}, ["big"])
    try:
        rank_ns = load_inputs(inputs.data)  # as a rank maps it
        rank_ns["v"] = rank_ns["big"].view(-1, 256)
        rank_ns["tail"] = rank_ns["big"][1024:]
        results = pack_results(rank_ns, ["v", "tail"], new_result_prefix())
        assert len(results.bundle) < 2_000  # references, no bytes and no files
        values, _ = unpack_results(results, inputs.arena.originals)
        assert values["v"].data_ptr() == big.data_ptr() and values["v"].shape == (big.numel() // 256, 256)
        assert values["tail"].data_ptr() == big[1024:].data_ptr()

        rank_ns["big"][5] = 123.0  # written on the rank: that page is the rank's own now
        results = pack_results(rank_ns, ["v"], new_result_prefix())
        values, _ = unpack_results(results, inputs.arena.originals)
        assert values["v"].data_ptr() != big.data_ptr() and values["v"].reshape(-1)[5] == 123.0 and big[5] != 123.0
    finally:
        inputs.arena.close()


def test_a_write_interrupted_by_ctrl_c_leaves_no_file():
    tensor = torch.ones(8 * MB)  # 32 MB: SIGINT during os.write raises when it returns, inside the write
    arena = SharedArena()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    landed = False
    try:
        for delay in (0.001, 0.005, 0.01, 0.02, 0.04, 0.08):
            signal.setitimer(signal.ITIMER_REAL, delay)
            try:
                arena.share_tensor(tensor)
                arena.unlink()
                arena = SharedArena()
            except KeyboardInterrupt as exc:
                landed = landed or any(code.co_name == "write_file" for code in _frames(exc))
                assert arena.paths == [] and own_files() == set()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if landed:
                break
    finally:
        signal.signal(signal.SIGALRM, previous)
        arena.unlink()
    assert landed, "no interrupt landed inside the write"


def _frames(exc):
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame.f_code
        tb = tb.tb_next


def test_packing_interrupted_removes_the_inputs_written_so_far():
    class Stop:
        def __reduce__(self):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_inputs({"a": torch.ones(MB), "b": Stop()}, ["a", "b"])


def test_files_of_a_dead_kernel_are_swept_and_a_live_ones_are_not():
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = os.path.join(shm_dir(), f"nbtrain-{dead.pid}-0123456789abcdef")
    mine = f"{owner_prefix()}0123456789abcdef"
    for path in (orphan, mine):
        with open(path, "wb") as fh:
            fh.write(b"x")
    try:
        assert sweep_orphans() >= 1
        assert not os.path.exists(orphan) and os.path.exists(mine)
    finally:
        for path in (orphan, mine):
            if os.path.exists(path):
                os.unlink(path)


# -------------------------------------------------------------------------------------- on real ranks


def test_large_result_comes_back_and_a_view_of_an_input_shares_the_notebooks_memory(pools):
    big = torch.randn(4 * MB)  # 16 MB, in through /dev/shm
    ns = {"big": big}
    run_cell(pools, """
        import torch
        v = big.view(-1, 256)
        head = big[:1000]
        big2 = big * 2
        halves = [big2[: big2.numel() // 2], big2[big2.numel() // 2:]]
    """, ns, out="v,head,big2,halves")
    assert ns["v"].data_ptr() == big.data_ptr()  # not written a second time: a view of the notebook's tensor
    assert ns["head"].data_ptr() == big.data_ptr()  # a small view too (4 KB), as the user guide says
    assert torch.equal(ns["big2"], big * 2)
    ns["head"][0] = 42.0
    assert big[0] == 42.0  # it shares memory with the notebook's tensor
    assert ns["halves"][1].untyped_storage().data_ptr() == ns["big2"].untyped_storage().data_ptr()


def test_result_files_are_removed_when_another_rank_fails(pools):
    with pytest.raises(RankFailedError):
        run_cell(pools, """
            import torch, torch.distributed as dist
            big2 = torch.ones(8_000_000)
            dist.barrier()
            if rank == 1:
                raise ValueError("rank 1 fails after rank 0 packed its results")
        """, out="big2")


def test_a_result_that_cannot_be_pickled_is_skipped_and_the_others_files_are_removed(pools):
    ns, result = run_cell(pools, """
        import threading, torch
        big2 = torch.ones(4_000_000)
        lock = threading.Lock()
    """, out="big2,lock")
    assert "lock" in result.skipped and torch.equal(ns["big2"], torch.ones(4_000_000))


RESIDENT = """
shape = data.shape  # the cell reads data (so it is sent), but none of its bytes
resident = {}  # the KiB in this rank's page tables now (Rss in /proc/self/smaps) of each input file's mapping
with open("/proc/self/smaps") as smaps:
    name = None
    for line in smaps:
        head = line.split()
        if not head[0].endswith(":"):  # a mapping's first line: its file, if any (removed once every rank loaded)
            name = head[5] if len(head) > 5 and "/nbtrain-" in head[5] else None
        elif name and head[0] == "Rss:":
            resident[name] = int(head[1])
"""


def test_a_rank_has_its_inputs_pages_before_the_cell_runs(pools):
    """The inputs' transfer into a rank is paid while the job's names arrive: the cell's first step (and its
    share in the cold start's split) does not fault in the shared-memory pages."""
    data = torch.ones(2**22)  # 16 MiB: a file in /dev/shm of its own
    ns, _ = run_cell(pools, RESIDENT, {"data": data}, out="resident")
    assert ns["resident"], "the input was mapped from a shared-memory file"
    assert max(ns["resident"].values()) >= data.numel() * data.element_size() // 1024, ns["resident"]


def test_the_summary_says_what_the_inputs_cost_before_the_ranks_started(pools):
    from nbtrain.kernel.lifecycle.entry import format_summary

    _, result = run_cell(pools, "total = float(data.sum())\n", {"data": torch.ones(2**23)})  # 32 MiB
    line = format_summary(result)[0]
    assert result.shared_bytes == 2**25 and f" · inputs 32 MiB to shared memory in {result.pack_seconds:.1f} s" in line
