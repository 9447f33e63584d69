"""RecordedGroup: a detached run's ranks as a kernel that attaches later sees them — read from the run's folder.

A :class:`~nbtrain.kernel.ranks.rankgroup.RankGroup` like the two that start ranks, so that
:mod:`nbtrain.kernel.lifecycle.run` drives an attached run exactly as it drives a cell: the same output relay, the
dashboard, failures mapped to the cell's lines, rank 0's names into the namespace, ``history``. Its events are
those the run's agent recorded (:mod:`nbtrain.node.detached`), read from the first on, then followed as they come
(:func:`nbtrain.wire.runfolder.read_events`): a run that ended is replayed whole, a running one is caught up, then
live. The ranks' messages are unpickled here, from the user's own private file their agent wrote (the ranks
passed the agent's HMAC handshake), as a blocking cell's messages are.

A run its agent restarted (``--max-restarts``) is followed one attempt at a time, as the kernel runs a restart: a
group follows the attempt its spec names (``nodes.attempt``), the events between the agent's decisions
(:meth:`~nbtrain.wire.runfolder.RunFolder.restart`), and ends where the next decision is recorded.

Nothing is sent to these ranks: the job went to them when the run started. The stop button of the kernel in
control of the run (:mod:`nbtrain.wire.run_control`; another kernel's only stops following) is a SIGINT to the
run's agent, only once ``/proc`` shows it is that agent (:mod:`.detached_stop`): the first interrupts the ranks,
the one that follows when they do not stop in time ends them.
"""

from __future__ import annotations

import base64
import pickle
import time
from collections.abc import Callable
from dataclasses import replace

from ...gpu import jsonfields as J
from ...gpu.snapshot_json import snapshot_from_json
from ...wire import protocol as P
from ...wire.runfolder import EventKind, RecordedState, RunFolderError, read_events, read_manifest
from ..diagnostics.failures import RankFailure, rank_failure
from ..ranks.rank_events import Exited, Message, Output, Sampled
from ..ranks.rankgroup import GroupState
from ..ranks.spec import PoolSpec
from ..ranks.zygote_handle import ZygoteHandle
from ...wire.detached_stop import NotTheRunsAgent, stop_run
from ...wire.run_control import following_only
from .hub import MAX_NODES, sampled_info

POLL_S = 0.1  # a live run's log is read again this often while the run's loop waits


class RecordedGroup(GroupState):
    """The ranks of the detached run ``spec.nodes.detached``, read back (see the module docstring)."""

    def __init__(self, spec: PoolSpec) -> None:
        assert spec.nodes is not None and spec.nodes.recorded, "a recorded group follows a detached run's record"
        summary = read_manifest(spec.nodes.detached)
        if summary is None:
            raise RunFolderError(f"there is no detached run {spec.nodes.detached!r} of yours to attach to")
        super().__init__(replace(spec, nprocs=summary.nprocs, nodes=replace(spec.nodes, nproc_per_node=summary.nprocs)))
        self.summary = summary
        self.run_id = summary.run_id
        self.attempt = spec.nodes.attempt  # the agent's restarts: this group is one attempt of the run
        self._decisions = 0  # the agent's restart decisions read so far: attempt k follows the k-th
        self._attempt_over = False  # the decision that ends this attempt was read
        self._offset = 0
        self._attached_at = time.time()
        self._pids: dict[int, int] = {}
        self._finished: set[int] = set()  # ranks that finished the cell (their Done was read)
        self._errors: dict[int, str] = {}  # rank -> torch elastic's error file, as its agent recorded it
        self._lost: dict[int, str] = {}  # rank -> why its node is gone (a run on several machines)
        self._nodes: tuple = ()  # a run on several machines: its nodes, as last recorded
        self._ended_at_read = False  # the manifest was final before the last read: nothing more will come

    # ------------------------------------------------------------------------------ lifecycle
    def spawn(self, zygote: ZygoteHandle | None = None, fork_ranks: bool = True) -> None:
        pass  # the run's agent started its ranks long ago

    def spawn_reason(self) -> str:
        return ""

    def serves(self, spec: PoolSpec) -> bool:
        return False  # never reused: the run's ranks end with it

    def alive(self) -> bool:
        return not self.broken and not self._ended_at_read

    def interrupt(self) -> None:
        self._signal_agent()

    def teardown(self, graceful: bool = True, grace: float = 1.0, drain: Callable[[], None] | None = None) -> None:
        """A failure or the stop button: the agent's second SIGINT ends the ranks, if they still run."""
        stopping = not graceful and not self._ended_at_read
        self.mark_broken()
        if stopping:
            self._signal_agent()
        if drain is not None:
            drain()

    def ran_before(self) -> float:
        """An attach counts the run from its start: the summary's time and the dashboard's clock are the run's."""
        if self.attempt:
            return 0.0  # a restart: the attempts' times are added up by the restarts
        until = min(self._attached_at, self.summary.ended or self._attached_at)  # an ended run: its own length
        return max(0.0, until - self.summary.started)

    def stopped_elsewhere(self) -> str:
        """Another live kernel controls the run (:mod:`nbtrain.wire.run_control`): this one only stops following."""
        return following_only(self.run_id)

    def _signal_agent(self) -> None:
        if self.stopped_elsewhere():
            return  # only the kernel in control stops the run
        try:
            stop_run(self.summary)
        except NotTheRunsAgent:
            pass  # its agent ended: so did the ranks, and their last words are in the log

    # -------------------------------------------------------------------------------- events
    def connected(self) -> bool:
        return True

    def send_all(self, message) -> None:
        pass  # the job reached the ranks when the run started

    def send_to(self, rank: int, message) -> None:
        pass  # an answer to input() cannot reach them: the agent answers it with EOFError when no kernel is there

    def output_open(self) -> bool:
        return not self._ended_at_read

    def poll_events(self, timeout: float) -> list:
        events = self._read()
        deadline = time.monotonic() + timeout
        while not events and not self._ended_at_read and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            events = self._read()
        return events

    def _read(self) -> list:
        if self._attempt_over:
            return []
        summary = read_manifest(self.run_id)
        final = summary is None or summary.state is not RecordedState.RUNNING
        recorded, self._offset = read_events(self.run_id, self._offset)
        self._ended_at_read = final  # the agent writes the final state after its last event
        events = []
        for record in recorded:
            if record.get("kind") == EventKind.RESTART.value:
                self._decisions += 1
                if self._decisions > self.attempt:  # this attempt's end: what follows is the next one's
                    self._ended_at_read = self._attempt_over = True
                    break
            elif self._decisions == self.attempt:
                events.extend(self._translate(record))
        return events

    def _translate(self, record: dict) -> list:
        kind, rank = record.get("kind"), record.get("rank", 0)
        if kind == EventKind.OUTPUT.value:
            return [Output(rank, record["stream"], record["text"])]
        if kind == EventKind.MESSAGE.value:
            said = pickle.loads(base64.b64decode(record["data"]))
            if isinstance(said, P.Done):
                self._finished.add(rank)
            return [Message(rank, said)]
        if kind == EventKind.EXIT.value:
            if rank in self._finished:
                return []  # the agent shut down a rank that had finished the cell: a live run had ended before
            if record.get("error"):
                self._errors[rank] = record["error"]
            if isinstance(record.get("lost"), str):  # said once per node, as the pool that lost it said it
                if record["lost"] not in self._lost.values():
                    print(f"nbtrain: {record['lost']}; stopping the other ranks", flush=True)
                self._lost[rank] = record["lost"]
            return [Exited(rank, record["code"])]
        if kind == EventKind.TELEMETRY.value:
            self._read_nodes(record.get("sample"))
            snapshot = snapshot_from_json(record.get("sample"))
            return [] if snapshot is None else [Sampled(snapshot)]
        if kind == EventKind.STARTED.value:
            self._pids.update({int(r): int(pid) for r, pid in record["ranks"].items()})
        return []

    # ------------------------------------------------------------------------- describing
    def pids(self) -> list[int]:
        return [self._pids.get(rank, 0) for rank in range(self.world_size)]

    def rank_label(self, rank: int) -> str:
        return f"rank {rank}"

    def node_infos(self) -> tuple:
        return self._nodes

    def _read_nodes(self, sample) -> None:
        """A run on several machines records its nodes with each sample (:mod:`nbtrain.node.relay`): the last ones."""
        entries = J.items(sample.get("nodes") if isinstance(sample, dict) else None, MAX_NODES)
        if entries:
            self._nodes = tuple(info for info in map(sampled_info, entries) if info is not None)

    def start_hint(self) -> str:
        return f"; detached run {self.run_id} has not started its ranks yet"

    def nodes_joined(self) -> str:
        return ""

    def failure(self, rank: int, cause, output_tail=(), diagnosis: str | None = None) -> RankFailure:
        recorded = None if not isinstance(cause, int) else self._errors.get(rank)
        return rank_failure(cause, RankFailure(rank, output_tail=list(output_tail), starting=rank not in self.devices,
                                               error_file_message=recorded, diagnosis=diagnosis,
                                               label=self.rank_label(rank), account=self._lost.get(rank)))

    def dump_stacks(self, wait: float = 0.5, ranks=None) -> dict[int, str]:
        return {}  # the ranks' stacks are their agent's to ask for; an attached kernel reads only the log

    def local_start(self) -> None:
        return None  # the ranks started before this kernel attached

    def replace_rank(self, rank: int, attempt: int) -> int:
        raise NotImplementedError("--ft replaces ranks on this machine only; the request refuses it with --nodes")

    def kill_rank(self, rank: int) -> None:
        raise NotImplementedError("--ft ends ranks on this machine only; the request refuses it with --nodes")

    def release_node(self, name: str, account: str) -> list:
        return []
