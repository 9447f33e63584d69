"""A detached run on its node agent: recorded as it goes, and carried on alone when the kernel goes.

A ``%%distributed --detach`` cell starts a node agent of its own on this machine, in a session of its own
(``setsid``), and its :class:`~nbtrain.wire.nodes.StartRanks` names the run (``detached_run``). For that run the
agent:

* **hosts the c10d store** (:class:`~.agent_store.AgentStore`): the ranks' store must outlive the kernel;
* **records** every message it sends the kernel into the run's folder (:class:`~nbtrain.wire.runfolder.RunFolder`):
  which processes run the ranks, their output, each message a rank sent (as the bytes it pickled) and their
  exits — :class:`Outbox` tees what :class:`~.local_ranks.LocalRanks` sends. It reads only what it must to
  know how the run stands (:class:`DetachedRecorder`): the messages of its own ranks, which passed the HMAC
  handshake, as :class:`~.local_ranks.LocalRanks` reads their ``Loaded``;
* **samples the run's load** — its ranks' CPU and memory, its GPUs — into the folder (:mod:`.detached_telemetry`);
* **leases the run's GPUs** (:mod:`nbtrain.gpu.leases`) beside the kernel that leased them, so they stay leased
  to the run when that kernel goes, and gives them back when the run ends;
* **goes on alone** when the link breaks, the kernel falls silent or says Bye (:func:`run_alone`): the ranks
  keep training; once every rank finished the cell they are shut down (a rank's failure stops the others, as
  the kernel would); a prompt (``input()``) gets no answer (EOFError in the rank); then the folder's state is
  final and the agent exits. Nothing keeps the machine's GPUs after the run.

The stop button of a kernel attached later is a SIGINT to the agent (:mod:`nbtrain.wire.detached_stop`):
the first interrupts the ranks, a second stops them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import pickle
import signal
import threading
import time
from dataclasses import replace
from typing import Protocol

from ..wire import nodes as N
from ..wire import protocol as P
from ..wire.restart_policy import FailureFacts
from ..wire.runfolder import RecordedState, RunFolder
from .agent_store import AgentStore
from .console import say
from .detached_telemetry import RecordedTelemetry

class Ranks(Protocol):
    """What the detached run's agent asks of its ranks: :class:`~.local_ranks.LocalRanks`, or on other nodes
    :class:`~.relay.RelayRanks`."""

    idle: threading.Event  # no rank of the run is alive

    def running(self) -> bool: ...
    def interrupt(self) -> None: ...
    def stop(self, grace: float = ...) -> None: ...
    def shut_down(self) -> None: ...
    def send_one(self, message: N.ToRank) -> None: ...
    def deliver(self, message: N.Deliver) -> None: ...


FAILURE_GRACE_S = 0.5  # the other ranks' chance to report the same error before they are stopped
SHUTDOWN_WAIT_S = 10.0  # ranks told to shut down after the cell exit within this, or are stopped
LOOP_S = 0.05
START_WAIT_S = 180.0  # a kernel gone while the ranks start: how long the agent waits for them (the cell's default
# --start-timeout)


class DetachedRecorder:
    """One detached run's folder and what the agent knows of how the run stands (see the module docstring)."""

    def __init__(self, start: N.StartRanks, count_sigints: bool = False, more_telemetry=None) -> None:
        """``count_sigints`` (from the main thread): SIGINT is the stop button from before the run's folder exists,
        where a kernel that finds the folder may send it at once (:meth:`count_sigints`). ``more_telemetry()``: what
        each recorded sample adds to this machine's (a relay's nodes)."""
        self.interrupts = 0  # SIGINTs to the agent: the stop button of an attached kernel
        if count_sigints:
            self.count_sigints()
        self.nprocs = start.nnodes * start.nproc_per_node
        self.store: AgentStore | None = None  # on several machines the relay's pool hosts it (node.relay)
        self.start = start  # what the ranks were started with
        self._new_store()
        self.folder = RunFolder(start.detached_run, self.nprocs)
        self.delivery: N.Deliver | None = None  # the cell, as the kernel delivered it: a restart delivers it again
        self.reason = ""  # why the run ended, where its state does not say it (end_undelivered)
        self.unwritable = ""  # why the folder could not be written any more ("": it can)
        self.stopped = False  # a stop asked (SIGINT, or the kernel's Interrupt) before any rank failed
        self._closed = False
        self.lease = _lease(start)  # the run's GPUs, leased by the agent too: still leased when the kernel goes
        self.telemetry = RecordedTelemetry(self.folder, start.leased_gpus, more_telemetry)
        self.begin_attempt(0)

    def begin_attempt(self, attempt: int) -> None:
        """What the agent knows of the ranks starts afresh: ``attempt`` 0, or a restart (``--max-restarts``), which
        gets a store of its own: torch elastic's workers key their process group by their agent's restart count,
        and each attempt's agent is a new one that counts from 0 again."""
        if attempt:
            self._new_store()
        self.attempt = attempt
        self.done: set[int] = set()
        self.failed_at: float | None = None  # when the first rank failed (an exception, or an exit before Done)
        self.failures: list[FailureFacts] = []  # this attempt's, in arrival order
        self.prompts: list[tuple[int, int]] = []  # (rank, seq) of input() calls no kernel will answer
        self.ranks_started = False  # torch elastic's agent started the ranks (RanksStarted)
        self.start_failed = ""  # why it could not (NodeError)

    def _new_store(self) -> None:
        """A store of this attempt's own, on loopback, for ranks on this machine (none for a relay's nodes)."""
        if self.store is not None:
            self.store.close()
        if self.start.spread is None:
            self.store = AgentStore("127.0.0.1")
            self.start = replace(self.start, rdzv_endpoint=f"127.0.0.1:{self.store.port}")

    def delivered(self, message: N.Deliver) -> None:
        """The cell reached the agent: from now on the run needs no kernel."""
        self.delivery = message
        self.folder.delivered()

    def record(self, message) -> None:
        """Into the folder, then what it tells of the run. A folder that cannot be written any more (removed, a
        full disk) is said once and no longer written: the run goes on, and its relay to the kernel with it."""
        if not self.unwritable:
            try:
                self._write(message)
            except OSError as exc:
                self.unwritable = f"{exc.strerror or exc}: {getattr(exc, 'filename', '') or self.folder.path}"
                say(f"the run's record can no longer be written ({self.unwritable}); the run goes on, unrecorded")
        self._learn(message)

    def _write(self, message) -> None:
        if isinstance(message, N.RankOutput):
            self.folder.output(message.rank, message.stream, message.text)
        elif isinstance(message, N.RankMessage):
            self.folder.message(message.rank, message.data)
        elif isinstance(message, N.RankExited):
            self.folder.rank_exited(message.rank, message.code, message.error, message.lost)
        elif isinstance(message, N.RanksStarted):
            self.folder.started({rank: pid for rank, (_local, pid) in message.ranks.items()})

    def _learn(self, message) -> None:
        """How the run stands, from what the agent relays."""
        if isinstance(message, N.RankMessage):
            self._read(message.rank, pickle.loads(message.data))  # an authenticated rank of this agent's
        elif isinstance(message, N.RankExited) and message.rank not in self.done:
            self.failures.append(FailureFacts(message.rank, exit_code=message.code, lost=message.lost or ""))
            self.failed_at = self.failed_at or time.monotonic()
        elif isinstance(message, N.RanksStarted):
            self.ranks_started = True
            if not self.unwritable:
                self.telemetry.ranks_started({rank: pid for rank, (_local, pid) in message.ranks.items()})
        elif isinstance(message, N.NodeError):
            self.start_failed = message.text

    def _read(self, rank: int, said) -> None:
        if isinstance(said, P.Done):
            self.done.add(rank)
        elif isinstance(said, P.Failed):
            self.failures.append(FailureFacts(rank, error_type=said.error.type_name, error_message=said.error.message))
            self.failed_at = self.failed_at or time.monotonic()
        elif isinstance(said, P.Metrics) and rank == 0 and not self.unwritable:
            steps = [record[0] for record in said.records if isinstance(record[0], int)]
            if steps:
                try:
                    self.folder.step(max(steps))
                except OSError:
                    pass  # said by the next record() that fails; the step in a table is all that is lost
        elif isinstance(said, P.InputRequest):
            self.prompts.append((rank, said.seq))

    def decided(self, attempt: int, reason: str, resumes: str) -> None:
        """The ``--max-restarts`` decision after a failed attempt (:mod:`.detached_restarts`), into the record."""
        if not self.unwritable:
            try:
                self.folder.restart(attempt, reason, resumes)
            except OSError:
                pass  # said by the next record() that fails; a kernel that follows waits for the final state

    def under_way(self, ranks: Ranks) -> bool:
        """The run still needs the agent: its ranks run, or are being started."""
        return ranks.running() or not (self.ranks_started or self.start_failed)

    def finished(self) -> bool:
        return len(self.done) == self.nprocs

    def outcome(self) -> RecordedState:
        if self.stopped:  # the interrupted ranks' KeyboardInterrupt is no failure of the run
            return RecordedState.STOPPED
        if self.finished() and self.failed_at is None:
            return RecordedState.FINISHED
        return RecordedState.FAILED if self.failed_at is not None else RecordedState.STOPPED

    def close(self) -> None:
        """The ranks have ended: the state is final, the store goes."""
        if self._closed:
            return
        self._closed = True
        self.telemetry.close()  # its last sample before the folder's final state
        try:
            self.folder.finish(self.outcome(), self.reason)
        except (OSError, ValueError):  # removed meanwhile, or its log closed already: nothing left to finish
            pass
        if self.store is not None:
            self.store.close()
        if self.lease is not None:
            self.lease.release()

    def count_sigints(self) -> None:
        """From now SIGINT is the stop button (:meth:`act_on_interrupts`); call from the main thread."""
        def interrupt(_signum, _frame) -> None:
            self.interrupts += 1
        signal.signal(signal.SIGINT, interrupt)

    def stop_asked(self) -> None:
        """Someone stopped the run; a stop that follows a rank's failure (the kernel ending the others) is not one."""
        self.stopped = self.stopped or self.failed_at is None

    def act_on_interrupts(self, ranks: Ranks, acted: int) -> int:
        """Do what the SIGINTs since ``acted`` ask; returns how many have been acted on."""
        for press in range(acted, self.interrupts):
            self.stop_asked()
            if press == 0:
                say("SIGINT: interrupting the detached run's ranks (a second one stops them)")
                ranks.interrupt()
            elif press == 1:
                say("second SIGINT: stopping the detached run's ranks")
                ranks.stop()
        return self.interrupts


def _lease(start: N.StartRanks):
    """The agent's own lease on the run's GPUs, taken over from its kernel (:func:`nbtrain.gpu.leases.take_over`);
    None without GPUs, or where it cannot be taken (said: the kernel's lease holds them while it lives)."""
    if not start.leased_gpus:
        return None
    from ..gpu.leases import LeaseBusy, LeaseDirError, LeaseInfo, take_over

    try:
        return take_over(list(start.leased_gpus), LeaseInfo(notebook=f"detached run {start.detached_run}"))
    except (LeaseBusy, LeaseDirError, OSError, ValueError) as exc:
        say(f"the run's GPUs are leased by its kernel only (while it lives): {exc}")
        return None


class Outbox:
    """What the agent sends the kernel: on its link, and, for a detached run, into the run's folder first."""

    def __init__(self, link) -> None:
        self.link = link
        self.recorder: DetachedRecorder | None = None

    def record(self, start: N.StartRanks, more_telemetry) -> N.StartRanks:
        """From now on the run ``start`` names is recorded, its store on this agent: the StartRanks to act on.
        ``more_telemetry()``: what each recorded sample adds (a relay's nodes)."""
        self.recorder = DetachedRecorder(start, count_sigints=True, more_telemetry=more_telemetry)
        return self.recorder.start

    def send(self, message) -> None:
        recorder = self.recorder
        if recorder is not None:
            recorder.record(message)
        self.link.send(message)  # a closed link drops it: the folder has it


def run_alone(ranks: Ranks, recorder: DetachedRecorder) -> str:
    """The kernel is gone and the ranks run (or start): see this attempt to its end here (see the module
    docstring)."""
    acted = _await_start(ranks, recorder)
    if not recorder.ranks_started:
        return f"the detached run's ranks did not start: {recorder.start_failed or 'stopped while starting'}"
    asked_to_end, stopping = 0.0, False
    while not ranks.idle.wait(LOOP_S):
        acted = recorder.act_on_interrupts(ranks, acted)
        for rank, seq in recorder.prompts:
            no_input = P.InputReply(seq, None, "the run is detached: no notebook is attached to answer input()")
            ranks.send_one(N.ToRank(rank, pickle.dumps(no_input, protocol=pickle.HIGHEST_PROTOCOL)))
        recorder.prompts.clear()
        now = time.monotonic()
        if stopping:
            continue
        if recorder.failed_at is not None and now - recorder.failed_at > FAILURE_GRACE_S:
            say("a rank failed: stopping the others")
            ranks.stop()
            stopping = True
        elif recorder.finished() and not asked_to_end:
            ranks.shut_down()
            asked_to_end = now
        elif asked_to_end and now - asked_to_end > SHUTDOWN_WAIT_S:
            ranks.stop()
            stopping = True
    return f"the detached run ended ({recorder.outcome().value})"


UNDELIVERED = "its kernel went before the cell reached the run's agent: there was nothing to run"


def end_undelivered(ranks: Ranks, recorder: DetachedRecorder) -> str:
    """The kernel is gone and the cell never reached the agent (a kernel killed right after it started the run):
    the ranks, idle, are stopped once started, and the run ends stopped, saying why."""
    say(f"{UNDELIVERED}; stopping its ranks")
    recorder.reason = UNDELIVERED
    recorder.stop_asked()
    if not (recorder.ranks_started or recorder.start_failed):
        _await_start(ranks, recorder)  # torch elastic may be starting them: stopped once they run
    ranks.stop()
    ranks.idle.wait(SHUTDOWN_WAIT_S)
    return f"the detached run ended: {UNDELIVERED}"


def _await_start(ranks: Ranks, recorder: DetachedRecorder) -> int:
    """Until torch elastic's agent has started the ranks (the kernel may go right after the cell), it failed, or
    :data:`START_WAIT_S` passed; a SIGINT meanwhile ends the wait. Returns the SIGINTs acted on."""
    deadline = time.monotonic() + START_WAIT_S
    while not (recorder.ranks_started or recorder.start_failed or recorder.interrupts) and time.monotonic() < deadline:
        time.sleep(LOOP_S)
    return recorder.act_on_interrupts(ranks, 0) if recorder.ranks_started else recorder.interrupts
