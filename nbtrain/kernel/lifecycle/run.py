"""One cell, run on a pool of ranks: the loop that turns the ranks' events into what the notebook sees.

:func:`run_cell` runs a cell that :func:`~nbtrain.kernel.lifecycle.entry.run_source` has already checked — syntax,
configuration, and every notebook variable it reads packed into :class:`~nbtrain.wire.payload.Inputs` —
before any process started (``run_source`` also calls it again for ``--max-restarts``). Then:

1. :class:`~.pools.PoolManager` hands out the warm pool if one with the same spec is alive and the user's modules it
   imported are unchanged (:mod:`nbtrain.kernel.request.notebook_modules`), else starts a fresh one;
2. once every rank is connected, the job (cell source + inputs pickled once) goes to each;
3. the loop relays output, records what the ranks log (``observers.history``; the observers), shows rank 0's
   displays, asks the notebook for a rank's ``input()`` (``relay.stdin``), notes each rank's Ready / Loaded /
   Done / Failed and exit, and removes the shared-memory input files once every rank has loaded its inputs;
4. success: the results rank 0 sent are unpickled into the notebook's namespace; the pool stays warm (``keep_alive_s``);
5. a failure (exception, exit, signal): the other ranks get a moment (:data:`FAILURE_GRACE_S`) to report
   the same error, the unfinished ones are asked where they are (:mod:`nbtrain.kernel.diagnostics.stacks`), then the pool is torn
   down — within 2 s, not at the collective timeout — and :class:`~nbtrain.kernel.diagnostics.failures.RankFailedError` is raised;
6. uneven collectives (some ranks finished the cell, the others wait in a collective for them): found
   within a few seconds by :mod:`nbtrain.kernel.diagnostics.mismatch` and reported as a failure naming the collective and line;
7. a preemption notice: :mod:`.preemption` has every rank save a checkpoint at its next step, then lets it go;
8. the stop button (KeyboardInterrupt in the kernel): :mod:`.stopping` sends one SIGINT to each process of
   the pool, then SIGTERM, then SIGKILL, well within 3 s; the pool is discarded, KeyboardInterrupt re-raised.

Nothing is assigned into the notebook unless the run succeeded; what the ranks logged is kept either way (the
caller's :class:`~nbtrain.kernel.observers.history.RunOutcome`; the magic sets ``history`` from it). Under ``--ft``
a rank that exits is replaced (:mod:`.ft_run`). Output goes through :class:`~nbtrain.kernel.relay.output.OutputRelay`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import replace

from ...wire import protocol as P
from ...wire.payload import Inputs, reason
from ...wire.shm import new_result_prefix, sweep_prefix
from ...common.words import count
from ..diagnostics.failures import CellPlace, RankFailedError, RankFailure, StopAccount, order_failures
from ..diagnostics.mismatch import MismatchWatcher
from ..diagnostics.stacks import whereabouts
from ..observers.cost import metering_for
from ..observers.events import FanOut, NodeState, RankInfo, RunInfo, RunState
from ..observers.coldstart import StartMarks
from ..observers.history import History, RunResult
from ..ranks.rank_events import Exited, Message, Output, RankEvent, Sampled
from ..ranks.rankgroup import RankGroup
from ..relay.displays import PendingDisplays
from ..relay.output import AtMarks, OutputRelay
from ..relay.stdin import PendingPrompts, asker
from ..request.cell import CELL_FILENAME, names_to_return
from ..ranks.spec import PoolSpec
from ..request.notebook_modules import notebook_workdir
from .cellrun import CellRun
from .phase import RunPhase, checked_next
from .pools import Acquired
from .bring_back import bring_back
from .ft_run import ReplicaWatch
from .preemption import PreemptionWatch
from .sessions import SESSION_FAILURE_GRACE_S, ended_sentence, kept_sentence, stuck_sentence
from .stopping import StopButton, stop_button, stop_run
from .waiting import WAITING_EVERY_S, start_timeout_account, waiting_line

FAILURE_GRACE_S = 0.3  # let the other ranks report the same exception before they are stopped
END_MARK_WAIT_S = 2.0  # after Done, wait at most this long for the last output
TIMED_WAIT_S = 0.1  # the loop's wait while something is timed: start-up, a failure's grace, mismatches, the end
STEADY_WAIT_S = 0.5  # every rank running the cell: output, messages and the stop button wake the loop at once;
# only a rank whose children keep its pipes open after it died is seen on the timeout. Each wakeup is kernel
# CPU, which with a rank on every core is taken from a rank.
NODES_EVERY_S = 1.0  # how often observers hear of a --nodes run's machines (their heartbeats come each second)


def _physical_gpu(spec: PoolSpec, device: str | None) -> int | None:
    """The NVML index of a rank's ``cuda:k`` (k counts the GPUs made visible to the ranks)."""
    return spec.gpu_ids[int(device.split(":")[1])] if device and device.startswith("cuda:") else None


class _Run:
    """The event loop of one cell on one pool."""

    def __init__(self, cell: CellRun, acquired: Acquired, job: P.Job, inputs: Inputs, observers: FanOut) -> None:
        pool = acquired.pool
        self.ft = ReplicaWatch(pool.spec, pool.world_size, self.notify, pool.send_to) if pool.spec.ft else None
        if self.ft is not None:  # --ft (.ft_run)
            job = replace(job, ft=self.ft.job_part(job.job_id))
        self.cell, self.pool, self.job, self.inputs, self.config = cell, pool, job, inputs, cell.config
        # when the ranks were asked for (the summary's time counts from it); a run followed later: when it began
        self.started = acquired.asked_at - pool.ran_before()
        self.observers, self.warm = observers, acquired.warm
        self.history = History()
        self.marks = StartMarks()  # the cold start's split (nbtrain.kernel.observers.coldstart)
        self.displays = PendingDisplays(cell.write)  # rank 0's figures and display() (nbtrain.rank.display)
        self._write = cell.write
        self._talk_to_ranks(pool.world_size)
        self.sent = False
        self.loaded: set[int] = set()
        self.done: dict[int, P.Done] = {}
        self.profiles: dict[int, P.ProfileSummary] = {}
        self.setup: dict[int, list[dict]] = {}  # P.Setup facts per rank (nbtrain.rank.train.speed)
        self.failures: dict[int, RankFailure] = {}
        self.raised: set[int] = set()  # ranks whose failure is an exception they reported (they still serve)
        self.failure_grace = SESSION_FAILURE_GRACE_S if job.session else FAILURE_GRACE_S
        self.phase, self.phase_since = RunPhase.STARTING, time.monotonic()  # changed by _enter() alone
        self.start_deadline = time.monotonic() + cell.config.start_timeout_s
        self.nodes_told_at = 0.0
        self.nodes_told_states: tuple[NodeState, ...] = ()
        self.waiting_told_at = 0.0  # a restart waiting for nodes: when it last said so
        # what the run holds: as the spec says until the ranks start, then as the last RunInfo told (an elastic
        # group's size, the nodes' cores) — in the result and the outcome, failed runs' too
        self.metering = metering_for(pool.spec, (), cell.config.price_per_hour)
        self.mismatch = MismatchWatcher(pool, job.filename, cell.info.source, cell.info.line_offset)
        self.preemption = PreemptionWatch(self, job.job_id, cell.config)  # a machine about to go: a checkpoint first

    @property
    def nprocs(self) -> int:
        return self.pool.world_size  # an elastic --nodes MIN:MAX group decides its size when it forms

    def _talk_to_ranks(self, nprocs: int) -> None:
        """The relay of the ranks' output and prompts, which label ranks only when there are several."""
        nodes = self.pool.spec.nodes  # a detached run followed through its record: its prompts are not ours
        self.prompts = PendingPrompts(self.pool.send_to, self._write, nprocs, asker(bool(nodes and nodes.recorded)))
        self.relay = OutputRelay(self._write, nprocs, self.config.shown_rank,
                                 AtMarks(self.displays.show, self.prompts.answer), self.pool.rank_label)

    def loop(self, stop_requested: threading.Event) -> None:
        while True:
            if stop_requested.is_set():  # SIGINT seen, even if something swallowed its KeyboardInterrupt
                raise KeyboardInterrupt
            for event in self.pool.poll_events(self._wait_s()):
                self.take(event)
            self._send_job_when_connected()
            now = time.monotonic()
            self._tell_nodes(now)
            self.preemption.tick(now)
            if self.phase is RunPhase.FAILING:
                if now - self.phase_since >= self.failure_grace or len(self.failures) == self.nprocs:
                    return self._enter(RunPhase.FAILED)
                if self.job.session and len(self.done.keys() | self.raised) == self.nprocs:
                    return self._enter(RunPhase.FAILED)  # every rank answered: the session survives the failure
            elif self._finished():
                if self.phase is RunPhase.RUNNING:
                    self._enter(RunPhase.FINISHING)
                if all(self.relay.ended(r, self.job.job_id) for r in self.done) or now - self.phase_since > END_MARK_WAIT_S:
                    self.preemption.finished()
                    if self.ft is not None:
                        self.say(self.ft.summary(self.history))
                    self.relay.flush()
                    return self._enter(RunPhase.FINISHED)
            elif self.done and not self.ft and (mismatch := self.mismatch.check(set(self.done), now)) is not None:
                self._fail(min(mismatch.waiting), mismatch.error(), diagnosis=mismatch.message())
            elif not self.pool.ready and now > self.start_deadline:
                self._start_timed_out()
            elif not self.pool.ready:
                self._tell_waiting(now)

    def _start_timed_out(self) -> None:
        """The ranks did not all join in --start-timeout: each waiting rank fails with nbtrain's account
        (:mod:`.waiting`); those that had joined are stopped."""
        text = start_timeout_account(self.pool, self.config.start_timeout_s, self.config.train.restart)
        for rank in self.pool.not_ready():
            self.record_failure(RankFailure(rank, starting=True, account=text, order=len(self.failures),
                                            label=self.pool.rank_label(rank)))  # the run is failing from here
        self.pool.mark_broken()

    def _tell_waiting(self, now: float) -> None:
        """A restart whose nodes are not all there: say at once what it waits for, then every WAITING_EVERY_S."""
        if self.config.train.restart and now - self.waiting_told_at >= WAITING_EVERY_S:
            line = waiting_line(self.pool, self.start_deadline - now, first=not self.waiting_told_at)
            if line:
                self.relay.write_direct("stderr", line)
                self.waiting_told_at = now

    def _wait_s(self) -> float:
        """How long the loop may sleep when nothing arrives: long only when nothing is being timed, and not at all
        while the job waits to go to ranks that are all connected (a warm pool's are from the start)."""
        if not self.sent and self.pool.connected():
            return 0.0
        steady = self.phase is RunPhase.RUNNING and self.pool.ready and not self.done
        return STEADY_WAIT_S if steady else TIMED_WAIT_S

    def _send_job_when_connected(self) -> None:
        if not self.sent and self.pool.connected():
            if self.nprocs == 1 != self.relay.nprocs:  # an elastic group formed with one rank: no labels
                self._talk_to_ranks(1)
            self.pool.send_all(self.job)
            self.sent = True  # also after a failure in the start: the observers hear of the run all the same
            if self.phase is RunPhase.STARTING:
                self._enter(RunPhase.RUNNING)
            self._tell_info("run_started")
            if self.pool.ready:
                self._tell_info("ranks_ready")

    def info(self) -> RunInfo:
        spec, devices = self.pool.spec, self.pool.devices
        ranks = tuple(RankInfo(rank, pid, devices.get(rank), _physical_gpu(spec, devices.get(rank)))
                      for rank, pid in enumerate(self.pool.pids()))
        return RunInfo(f"{self.pool.run_id}/{self.job.job_id}", self.pool.world_size, spec.backend, spec.device_type,
                       spec.gpu_ids, ranks, self.warm, nodes := self.pool.node_infos(), self.started,
                       metering_for(spec, nodes, self.config.price_per_hour, self.pool.world_size),
                       telemetry_recorded=spec.nodes is not None and spec.nodes.recorded)

    def _tell_info(self, event: str) -> None:
        """``run_started`` or ``ranks_ready`` to the observers, with what the run holds now."""
        info = self.info()
        self.metering = info.metering or self.metering
        self.notify(event, info)

    def _tell_nodes(self, now: float) -> None:
        """Once a second on a --nodes run: each machine's state and load, from its heartbeats, to the observers —
        and at once when a node's state changed (a lost node is shown lost before the run stops the others)."""
        if not self.sent or not (nodes := self.pool.node_infos()):
            return
        states = tuple(node.state for node in nodes)
        if now - self.nodes_told_at >= NODES_EVERY_S or states != self.nodes_told_states:
            self.nodes_told_at, self.nodes_told_states = now, states
            self.notify("nodes_heard", nodes)

    def notify(self, event: str, *args) -> None:
        self.observers.notify(event, *args)

    def take(self, event: RankEvent, late: tuple[str, ...] | None = None) -> bool:
        """Every event from the ranks comes through here. Live (``late`` None): all of it counts. ``late``: ranks
        being stopped, of which only the output of those streams and what they logged is kept. True when the
        event is its rank's last word on the cell: it exited, failed or finished."""
        match event:
            case Output(rank, stream, text):
                if late is None or stream in late:
                    self.relay.feed(rank, stream, text)
            case Exited(rank, code):
                # in the loop every exit is real (nbtrain kills only after it); under --ft a group's loss is not
                if late is None and rank not in self.failures and not self._ft_hook("exited", rank, code):
                    self._fail(rank, code)
                return True
            case Message(rank, message):
                if late is None:
                    self._handle_message(rank, message)
                elif isinstance(message, P.Metrics):
                    self.history.add(rank, message.records)
                return isinstance(message, (P.Failed, P.Done))
            case Sampled(snapshot):
                self.notify("sampled", snapshot)
            case _:
                raise TypeError(f"nbtrain: the ranks' group yielded {event!r}, which is not one of the events a run "
                                "takes (nbtrain.kernel.ranks.rank_events.RankEvent): the group and the run disagree")
        return False

    def _handle_message(self, rank: int, msg) -> None:
        if isinstance(msg, P.Metrics):
            self.history.add(rank, msg.records)
            if self.ft is not None:
                self.ft.logged(rank, msg.records)
            if not (msg.restored and self.config.train.restart):  # a restart's dashboard has drawn them already
                self.notify("metrics", rank, msg.records)
        elif isinstance(msg, P.Setup):
            self.setup.setdefault(rank, []).append(msg.facts)
            self.notify("setup", rank, msg.facts)
        elif isinstance(msg, P.Ready):
            self.marks.on_ready(rank, msg.times)
            if self.pool.mark_ready(rank, msg.device) and self.sent:
                self._tell_info("ranks_ready")
            if self.ft is not None and self.ft.joined(rank):
                self.pool.send_to(rank, self.job)  # a replacement: the cell, and the peer it copies, wait for it
        elif isinstance(msg, P.FtJoining) and self.ft is not None and msg.job_id == self.job.job_id:
            for target in self.ft.arrived(rank):  # --ft: the groups that start together take their first quorum
                self.pool.send_to(target, P.FtGo(msg.job_id))
        elif isinstance(msg, P.Loaded) and msg.job_id == self.job.job_id:
            self.loaded.add(rank)
            self.marks.on_loaded(rank)
            if len(self.loaded) == self.nprocs and self.ft is None:  # --ft: a replacement loads them later
                self.inputs.arena.unlink()
        elif isinstance(msg, P.Display) and msg.job_id == self.job.job_id:
            self.displays.add(msg, self.relay)
        elif isinstance(msg, P.InputRequest) and msg.job_id == self.job.job_id:
            self.prompts.add(msg, self.relay)
        elif isinstance(msg, P.ProfileSummary) and msg.job_id == self.job.job_id:
            self.profiles[rank] = msg
        elif isinstance(msg, P.Done) and msg.job_id == self.job.job_id:
            self.done[rank] = msg
            self.marks.on_done(rank, msg.first_step)
            self.pool.record_modules(msg.modules, msg.rank_path)
        elif isinstance(msg, P.Failed) and msg.job_id == self.job.job_id and not self._ft_hook("failed", rank, msg.error):
            self.raised.add(rank)
            self._fail(rank, msg.error)
        elif isinstance(msg, (P.PreemptNotice, P.PreemptPropose, P.PreemptHeard, P.PreemptSaved)):
            self.preemption.hear(rank, msg)
        elif isinstance(msg, P.BreakpointLeft) and msg.job_id == self.job.job_id:
            for target in range(self.nprocs):  # nbtrain.breakpoint(): the ranks waiting for the debugged one go on
                self.pool.send_to(target, P.BreakpointRelease(msg.job_id, msg.call))

    def _ft_hook(self, hook: str, rank: int, cause) -> bool:
        """--ft: whether a rank's exit or exception while the cell runs is its replica group's loss (.ft_run)."""
        return self.ft is not None and self.phase is RunPhase.RUNNING and getattr(self.ft, hook)(self, rank, cause)

    def _finished(self) -> bool:
        """Every rank finished the cell — under --ft, every rank but replacements that came too late to join (the
        others finished first): those are stopped with the pool."""
        if self.ft is not None and self.ft.too_late(set(self.done), self.say):
            self.pool.mark_broken()
        return len(self.done) + len(self.ft.abandoned if self.ft else ()) == self.nprocs

    def _fail(self, rank: int, cause: P.RemoteError | int, diagnosis: str | None = None) -> None:
        """Rank ``rank`` failed (an exception it reported, or its exit code): the pool is done for."""
        self.record_failure(replace(self.pool.failure(rank, cause, self.relay.tail(rank), diagnosis),
                                    order=len(self.failures)))
        if not (self.job.session and rank in self.raised):  # a session's ranks that raised still serve it
            self.pool.mark_broken()

    def record_failure(self, failure: RankFailure) -> None:
        """A rank's failure (its first one counts); the run ends a moment after the first of all."""
        self.failures.setdefault(failure.rank, failure)
        if self.phase in (RunPhase.STARTING, RunPhase.RUNNING, RunPhase.FINISHING):
            self._enter(RunPhase.FAILING)  # later failures (and any once the run ended) are only recorded

    def _enter(self, phase: RunPhase) -> None:
        """The one place the run's phase changes (:mod:`.phase` says which changes are legal)."""
        self.phase, self.phase_since = checked_next(self.phase, phase), time.monotonic()

    # What the watchers of the run (.preemption, .stopping) ask of it: they change the run only through these.
    def say(self, text: str) -> None:
        """A line of nbtrain's own on the cell's stderr, after the ranks' output relayed so far."""
        self.relay.write_direct("stderr", text)

    def flush_output(self) -> None:
        self.relay.flush()

    def tell_every_rank(self, message) -> None:
        for target in range(self.nprocs):
            self.pool.send_to(target, message)

    def fail_machine_stopping(self, rank: int, account: str) -> None:
        """The machine of the ranks is going (a preemption on one machine): the run fails with ``account``."""
        self.record_failure(RankFailure(rank, exit_code=-signal.SIGTERM, order=len(self.failures),
                                        machine_stopping=True, account=account))
        self.pool.mark_broken()

    def release_nodes(self, names: list[str], account: str, cell_ended: bool = False) -> None:
        """Let the nodes ``names`` go with ``account``; their ranks' exits fail the run unless the cell has ended."""
        for name in names:
            events = self.pool.release_node(name, account)
            if not cell_ended:
                for event in events:
                    self.take(event)

    def cell_running(self) -> bool:
        """Every rank joined and has the cell (a stop then interrupts it rather than the start-up)."""
        return self.pool.ready and self.sent

    def where_each_rank_is(self, wait: float) -> dict[int, str]:
        info = self.cell.info
        return whereabouts(self.pool, CellPlace(self.job.filename, info.source, info.line_offset), wait=wait)

    def reported_ranks(self) -> set[int]:
        """The ranks that finished the cell or failed."""
        return set(self.done) | set(self.failures)

    def session_survives(self) -> bool:
        """A failed session cell leaves its ranks usable when each raised an exception or finished."""
        return bool(self.job.session) and not self.pool.broken and len(self.done.keys() | self.raised) == self.nprocs

    def finish_output(self) -> None:
        """Ranks that go on serving: show their output up to the job's end mark (as after a success)."""
        deadline = time.monotonic() + END_MARK_WAIT_S
        while time.monotonic() < deadline and not all(self.relay.ended(r, self.job.job_id) for r in range(self.nprocs)):
            for event in self.pool.poll_events(0.05):
                self.take(event)
        self.relay.flush()

    def drain(self, seconds: float, streams=("stdout", "stderr")) -> None:
        """Show what the stopped ranks still had in their pipes (of ``streams``; the rest is read and dropped)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.pool.output_open():
            for event in self.pool.poll_events(0.05):
                self.take(event, late=streams)
        self.relay.flush()


def run_cell(cell: CellRun, inputs: Inputs) -> RunResult:
    """Run a cell checked and packed by :func:`~nbtrain.kernel.lifecycle.entry.run_source` on the ranks; bring rank 0's
    results into the notebook's namespace. Raises RankFailedError, or KeyboardInterrupt after the stop button; either
    way ``cell.outcome`` holds what was logged."""
    started = time.monotonic()
    result_prefix = new_result_prefix()
    try:
        return _run_and_bring_back(cell, inputs, result_prefix, started)
    finally:  # whatever happened: no input file, and no result file the kernel did not take
        inputs.arena.close()
        sweep_prefix(result_prefix)


def _run_and_bring_back(cell: CellRun, inputs: Inputs, result_prefix: str, started: float) -> RunResult:
    write = cell.write
    leased = cell.manager.lease_gpus(cell.config, lambda text: write("stdout", text))  # may wait in the GPU queue
    cell = replace(cell, config=replace(cell.config, pool=leased))
    observers = FanOut(cell.observers)
    ending = (RunState.FAILED, "nbtrain failed before the run ended")
    with stop_button(cell.stop) as button:  # held until the end is announced: a press while the final picture is drawn is
        try:  # only noted (run_finished is announced here alone, exactly once, however the run ends)
            with button.deferred():  # a press while the group starts is acted on by the run's loop
                acquired = cell.manager.acquire(cell.config, cell.config.workdir or notebook_workdir())
            run = _Run(cell, acquired, _job(cell, acquired.pool, inputs, result_prefix), inputs, observers)
            with contextlib.closing(run.ft) if run.ft is not None else contextlib.nullcontext():  # its Lighthouse
                result = _drive(run, acquired, button, started)
            ending = (RunState.FINISHED, f"{count('rank', len(result.devices))} finished in {result.seconds:.1f} s")
            return result
        except RankFailedError as error:
            ending = (RunState.FAILED, error.failures[0].summary())
            raise
        except KeyboardInterrupt:
            ending = (RunState.INTERRUPTED, "interrupted: every rank was stopped")
            raise
        except BaseException as exc:
            ending = (RunState.FAILED, f"nbtrain failed: {reason(exc)}")
            raise
        finally:
            with button.deferred():
                observers.notify("run_finished", *ending)


def _job(cell: CellRun, pool: RankGroup, inputs: Inputs, result_prefix: str) -> P.Job:
    """The job every rank of ``pool`` gets: the cell's source, its inputs, and where its results go."""
    config, info = cell.config, cell.info
    workdir = config.workdir or notebook_workdir()
    return P.Job(pool.next_job_id(), info.source, cell_filename(info, pool.spec), inputs.data,
                 names_to_return(info, config.out_names), train=config.train, cwd=workdir.cwd,
                 sys_path=workdir.sys_path, result_prefix=result_prefix, shared_files=tuple(inputs.arena.paths),
                 session=config.session, line_offset=info.line_offset)


def cell_filename(info, spec: PoolSpec) -> str:
    """The name the ranks compile the cell under (its tracebacks' frames): a detached run's names its run, so that
    a kernel attaching later maps them to the cell's lines too."""
    detached = spec.nodes.detached if spec.nodes is not None else ""
    return f"{CELL_FILENAME[:-1]} {detached or format(id(info), 'x')}>"


def _drive(run: _Run, acquired: Acquired, button: StopButton, started: float) -> RunResult:
    """Run the loop on the started group and end the run: its results, or its failure raised."""
    cell, pool, inputs = run.cell, run.pool, run.inputs
    config, manager = cell.config, cell.manager
    session = manager.sessions.open(config.session, pool) if config.session else None
    sessions_here = manager.sessions.on(pool)
    if session is not None:  # the session's series go on (its ranks continue their step counters)
        run.history = session.history.copy()
    for note in acquired.notes:
        if note:
            run.relay.write_direct("stdout", note)
    try:
        try:
            run.loop(button.requested)
        except KeyboardInterrupt:
            stop_run(run, pool, manager, button)  # still under the button: a second press escalates it
            raise
    except KeyboardInterrupt as exc:
        said = ("KeyboardInterrupt: stopped following; the detached run goes on." if pool.stopped_elsewhere() else
                "KeyboardInterrupt: stopped by the user; every rank and its child processes were ended."
                + (f" {ended_sentence(sessions_here)}" if sessions_here else ""))
        # IPython shows the lines _render_traceback_() returns instead of a traceback (an untyped hook)
        exc.with_traceback(None)._render_traceback_ = lambda: [said]  # type: ignore[attr-defined]
        raise exc from None
    except BaseException as exc:
        manager.teardown(pool, grace=1.0, why=f"nbtrain failed: {reason(exc)}")
        raise
    finally:
        cell.outcome.record(run.history, run.metering)  # what was logged until here, however the run ends
        inputs.arena.close()
    if session is not None:
        session.carry(run.history)
    if run.phase is RunPhase.FAILED:
        raise _failure(run)
    manager.release(healthy=not (run.ft and pool.broken), keep_alive_s=config.keep_alive_s)  # --ft: one too late
    result = bring_back(run, time.monotonic() - started + pool.ran_before())
    if config.session:
        manager.sessions.record(config.session, pool, run.done, cell.namespace)
    if result.cold_start is not None:
        run.notify("cold_start", result.cold_start)
    return result


def _failure(run: _Run) -> RankFailedError:
    """The error of a failed run, once its ranks are stopped — or, for a session that survives, left serving."""
    pool, job, manager, info = run.pool, run.job, run.cell.manager, run.cell.info
    kept = run.session_survives()
    stopped = [] if kept else [r for r in range(pool.world_size) if r not in run.failures]
    unfinished = [r for r in stopped if r not in run.done]  # a rank that finished is in nbtrain's loop
    stuck = [] if run.preemption.done else unfinished  # after a preemption's checkpoint they wait, as they should
    place = CellPlace(job.filename, info.source, info.line_offset, run.cell.code_name)
    where = whereabouts(pool, place, 0.4, stuck) if stuck else {}
    if kept:
        run.finish_output()
        manager.release(healthy=True, keep_alive_s=run.config.keep_alive_s)
        notes = [kept_sentence(job.session)]
    else:
        first = order_failures(list(run.failures.values()))[0]
        ended = manager.teardown(pool, grace=0.5, drain=lambda: run.drain(0.5), why=first.summary())
        notes = [ended_sentence(ended)] if ended else []
        if ended and unfinished and set(run.failures) <= run.raised:  # the others were in the cell: say why it ended
            notes.insert(0, stuck_sentence(sorted(run.raised), unfinished, pool.spec.backend))
    account = StopAccount(tuple(stopped), where, tuple(notes), pool.spec.device_type)
    return RankFailedError(list(run.failures.values()), place, account)
