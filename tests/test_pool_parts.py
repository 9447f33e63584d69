"""The pool's parts without rank processes: which failure is the cause, the channel's framing and admission,
the pool's own state. Fast; the processes themselves are exercised by test_run.py and test_lifecycle.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import AuthenticationError, Client, Connection

import pytest

from nbtrain.common import proctree
from nbtrain.kernel.diagnostics.failures import CellPlace, RankFailedError, RankFailure, order_failures, rank_failure
from nbtrain.kernel.ranks.channel import Channel, Message, admit, receive, send
from nbtrain.kernel.ranks.pool import LocalPool
from nbtrain.kernel.ranks.procs import RankProcesses, error_file_path
from nbtrain.kernel.request.config import LaunchRequest, resolve
from nbtrain.wire import protocol as P


def _error(type_name: str, message: str) -> P.RemoteError:
    return P.RemoteError(type_name, message, ())


def _failed(rank: int, cause) -> RankFailure:
    return rank_failure(cause, RankFailure(rank))


def _arrived(*failures):
    for order, failure in enumerate(failures):
        failure.order = order
    return list(failures)


def test_the_cause_comes_before_the_peer_errors_it_caused_even_when_it_arrives_later():
    failures = _arrived(_failed(1, _error("DistBackendError", "Connection closed by peer")),
                        _failed(2, _error("RuntimeError", "gloo/transport: Connection reset by peer")),
                        _failed(0, _error("KeyError", "'x'")))
    assert [f.rank for f in order_failures(failures)] == [0, 1, 2]


def test_an_error_with_a_message_comes_before_a_bare_exit_and_otherwise_the_first_to_arrive():
    bare = _failed(0, 1)
    recorded = rank_failure(1, RankFailure(1, error_file_message="ValueError: could not convert"))
    assert [f.rank for f in order_failures(_arrived(bare, recorded))] == [1, 0]
    first, second = _failed(3, -9), _failed(1, -9)
    assert [f.rank for f in order_failures(_arrived(first, second))] == [3, 1]
    error = RankFailedError(_arrived(_failed(1, _error("DistBackendError", "broken pipe")),
                                     _failed(0, _error("ValueError", "bad"))),
                            CellPlace("<cell>", "", 0))
    assert error.rank == 0 and str(error).startswith("rank 0 raised ValueError: bad")


def test_a_failure_is_built_from_an_exit_code_or_a_reported_exception():
    died = rank_failure(3, RankFailure(1, output_tail=["last words"], starting=True))
    assert (died.exit_code, died.error, died.output_tail) == (3, None, ["last words"])
    assert died.summary() == "rank 1 exited with code 3 while starting, before the cell ran"
    assert _failed(0, -9).summary().startswith("rank 0 was killed by SIGKILL")
    raised = rank_failure(_error("KeyError", "'x'"), RankFailure(0, output_tail=["tail"], error_file_message="stale"))
    assert (raised.exit_code, raised.summary()) == (None, "rank 0 raised KeyError: 'x'")
    assert raised.error_file_message is None  # the exception it reported says more than an error file


def test_messages_keep_their_frames_and_contents_over_a_socket():
    a, b = socket.socketpair()
    kernel, rank = Connection(a.detach()), Connection(b.detach())
    job = P.Job(7, "x = 1\n", "<cell>", os.urandom(300_000), ("x",), cwd="/tmp")
    sender = threading.Thread(target=lambda: (send(kernel, job), send(kernel, P.Shutdown())))
    sender.start()  # a frame larger than the socket's buffer: the rank reads while the kernel writes
    assert rank.recv() == job and rank.recv() == P.Shutdown()
    sender.join()
    rank.send(P.Done(7, 1, None, 0.5))
    assert receive(kernel, 1) == Message(1, P.Done(7, 1, None, 0.5))
    rank.close()
    assert receive(kernel, 1) is None  # the rank hung up: no message, the connection is dropped
    kernel.close()


def test_only_a_hello_from_an_expected_pid_is_admitted_and_only_once():
    pending = {4242: 0, 4343: 1}
    assert admit(P.Ready(1, "cpu"), pending) is None
    assert admit(P.Hello(1, 9999), pending) is None
    assert admit(P.Hello(1, 4343), pending) == 1 and pending == {4242: 0}
    assert admit(P.Hello(1, 4343), pending) is None


def test_the_channel_admits_its_ranks_refuses_a_wrong_key_and_then_stops_listening(tmp_path):
    channel = Channel(str(tmp_path))
    channel.listen(backlog=2)
    channel.accept([os.getpid()])  # this process plays rank 0
    try:
        with pytest.raises(AuthenticationError):
            Client(channel.address, family="AF_UNIX", authkey=b"not the key")
        peer = Client(channel.address, family="AF_UNIX", authkey=channel.key)
        peer.send(P.Hello(0, os.getpid()))
        deadline = time.monotonic() + 5
        while not channel.connected() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert channel.connected()
        channel.send_all(P.Shutdown())
        assert peer.recv() == P.Shutdown()
        peer.send(P.Loaded(1, 0))
        (conn, rank), = channel.waitables().items()
        assert channel.receive(rank) == [Message(0, P.Loaded(1, 0))]
        while os.path.exists(channel.address) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not os.path.exists(channel.address)  # every rank is in: nothing else can connect
        peer.close()
    finally:
        channel.close()


def test_the_runs_loop_is_woken_the_moment_a_rank_is_admitted(tmp_path):
    from multiprocessing.connection import wait

    channel = Channel(str(tmp_path))
    channel.listen(backlog=1)
    channel.accept([os.getpid()])
    try:
        admissions = channel.admissions()
        assert admissions is not None and wait([admissions], 0) == []  # nobody in yet: nothing to wake for
        peer = Client(channel.address, family="AF_UNIX", authkey=channel.key)
        peer.send(P.Hello(0, os.getpid()))
        started = time.monotonic()
        assert wait([admissions], 5) == [admissions]
        assert time.monotonic() - started < 1  # woken by the admission, not by a poll's timeout
        channel.woken()
        assert channel.connected() and channel.admissions() is None  # every rank in: the loop waits on them
        peer.close()
    finally:
        channel.close()


def test_the_pool_keeps_its_own_state_and_teardown_frees_it():
    pool = LocalPool(resolve(LaunchRequest(nprocs=2, cpu=True)).pool)
    assert (pool.ready, pool.not_ready(), pool.devices) == (False, [0, 1], {})
    assert pool.mark_ready(1, "cpu") is False and pool.not_ready() == [0]
    assert pool.failure(0, 1).starting and not pool.failure(1, 1).starting
    assert pool.mark_ready(0, "cpu") is True and pool.devices == {0: "cpu", 1: "cpu"}
    assert not pool.broken
    pool.mark_broken()
    assert pool.broken and not pool.alive()
    directory = pool._dir
    pool.teardown()
    assert not os.path.exists(directory)


def test_the_error_file_a_rank_recorded_is_read_as_torch_elastic_wrote_it(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    procs = RankProcesses(str(tmp_path))
    assert procs.error_file_message(1, 1) is None  # nothing recorded: the report shows the last output instead
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", error_file_path(str(tmp_path), 1))
    try:
        float("soon")
    except ValueError as exc:
        ErrorHandler().record_exception(exc)
    message = procs.error_file_message(1, 1)
    assert "Traceback" in message and "could not convert string to float: 'soon'" in message


def test_the_local_pool_and_the_node_pool_are_siblings_behind_one_protocol():
    """The run drives a RankGroup: both groups provide all of it, and the node group inherits nothing it does
    not use from the local one (only the state both keep)."""
    from nbtrain.kernel.cluster.group import NodePool
    from nbtrain.kernel.ranks.rankgroup import GroupState, RankGroup

    wanted = {name for name in dir(RankGroup) if not name.startswith("_")} | set(RankGroup.__annotations__)
    for group in (LocalPool, NodePool):
        assert issubclass(group, GroupState)
        missing = [name for name in wanted if not hasattr(group, name) and name not in ("spec", "pool_id", "run_id")]
        assert not missing, (group.__name__, missing)
    assert not issubclass(NodePool, LocalPool)


def test_stopping_leaves_a_childs_exit_status_to_its_owner():
    """proctree.stop does not reap: the Popen that owns a rank reads SIGTERM, not 0 (torch elastic's agent on a
    node would take 0 for a success and wait seconds at its exit barrier before the group could re-form)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    proctree.stop([child.pid], grace=5.0)
    assert child.wait(5) == -15
