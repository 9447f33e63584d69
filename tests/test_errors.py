"""Which failure a run reports first when several ranks fail, and how the report reads: pure, no process.

When one rank fails, the others fail too: a peer's collective breaks ("Connection closed by peer", a
DistBackendError) or they are stopped. The report must lead with the cause, whatever order the failures
arrived in. The basic order (an exception before the peer errors it caused, a message before a bare
exit, then arrival) is in test_pool_parts.py; here: a death without a message before the peer errors
it caused, ties, what counts as a communication error, and the report's text.
"""

from __future__ import annotations

from nbtrain.kernel.diagnostics.failures import CellPlace, Frame, RankFailedError, RankFailure, RemoteError, first_sentence

CELL = "<%%distributed cell 1f2e>"
SOURCE = "import torch.distributed as dist\nbatch = load(rank)\nloss = step(batch)\ndist.all_reduce(loss)\n"


def error(type_name: str, message: str, *frames) -> RemoteError:
    return RemoteError(type_name, message, tuple(frames))


def first(*failures: RankFailure) -> RankFailedError:
    return RankFailedError(list(failures), CellPlace(CELL, SOURCE, 1))


PEER_LOST = error("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")
DIST_ERROR = error("DistBackendError", "NCCL communicator was aborted on rank 0.")
VALUE_ERROR = error("ValueError", "bad batch on rank 1")


def test_a_killed_rank_comes_before_the_peers_its_death_cut_off():
    err = first(RankFailure(0, DIST_ERROR, order=0), RankFailure(2, PEER_LOST, order=1),
                RankFailure(1, exit_code=-9, order=2))
    assert err.rank == 1 and err.remote_type is None
    assert err.failures[0].summary().startswith("rank 1 was killed by SIGKILL — often the out-of-memory killer")
    assert [f.rank for f in err.failures] == [1, 0, 2]


def test_failures_that_arrived_together_are_ordered_by_rank():
    err = first(RankFailure(2, VALUE_ERROR), RankFailure(1, VALUE_ERROR), RankFailure(3, VALUE_ERROR))
    assert [f.rank for f in err.failures] == [1, 2, 3]
    assert "(ranks 2, 3 raised the same error)" in str(err).splitlines()[1]


def test_communication_errors_are_secondary_and_program_errors_are_not():
    assert RankFailure(0, PEER_LOST).secondary and RankFailure(0, DIST_ERROR).secondary
    assert not RankFailure(0, VALUE_ERROR).secondary and not RankFailure(0, exit_code=-9).secondary
    assert first(RankFailure(0, DIST_ERROR, order=1), RankFailure(1, PEER_LOST, order=0)).rank == 1  # only those: earliest


def test_the_report_maps_the_first_failures_frames_to_the_lines_the_user_sees():
    frames = (Frame(CELL, 3, "<module>", None), Frame("/tmp/ipykernel_7/91.py", 4, "step", "raise ValueError('bad batch')"))
    err = first(RankFailure(0, PEER_LOST, order=0), RankFailure(1, error("ValueError", "bad batch", *frames), order=1))
    report = str(err).splitlines()
    at = report.index("Traceback on rank 1 (most recent call last):")
    assert report[at + 1:at + 5] == ["  Cell line 4, in <module>", "    loss = step(batch)",
                                     '  File "/tmp/ipykernel_7/91.py", line 4, in step', "    raise ValueError('bad batch')"]
    assert report[at + 5] == "ValueError: bad batch"


def test_a_summary_keeps_the_first_sentence_of_a_long_message():
    oom = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.1 GiB.\nIf reserved..."
    assert first_sentence(oom) == "CUDA out of memory. Tried to allocate 20.00 GiB. …"  # what failed, and how much
    h200 = ("CUDA out of memory. Tried to allocate 4096.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
            "139.29 GiB is free. Including non-PyTorch memory, this process has 518.00 MiB memory in use.")  # torch 2.11's
    assert first_sentence(h200) == "CUDA out of memory. Tried to allocate 4096.00 GiB. …"
    assert first_sentence("x" * 300) == "x" * 199 + "…"
    assert first_sentence("bad batch on rank 1") == "bad batch on rank 1"


def test_a_summary_skips_a_cpp_checks_location_for_what_failed():
    cpu_oom = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
               "allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")
    assert first_sentence(cpu_oom) == ("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                       "1099511627776 bytes. …")
