"""The plain-Python entry point behind ``%%distributed``: check everything, then run.

:func:`run_source` works without IPython (tests, scripts, other front ends)::

    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    ns = {"scale": 3}
    result = run_source("y = scale * (rank + 1)", LaunchRequest(nprocs=2, cpu=True), ns)
    ns["y"]   # 3: rank 0's y

With ``--max-restarts K`` (``LaunchRequest.max_restarts``) a run whose rank dies is started again from
its last checkpoint, up to K times (:mod:`nbtrain.kernel.lifecycle.restarts`).

Every user mistake raises a subclass of :class:`UserInputError` *before* any process starts: a bad
option (:class:`~nbtrain.kernel.request.config.ConfigError`), a syntax error in the cell (:class:`~nbtrain.kernel.request.cell.CellSyntaxError`), a
notebook variable that cannot be sent (:class:`~.payload.PayloadError`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ...common.words import count
from ..diagnostics.advisor import Hint, advise, evidence_from_history
from ..diagnostics.profiling import format_profile
from ..diagnostics.setup_facts import memory_size, setup_words
from ..observers.cost import Metering, metering_for
from ..observers.events import FanOut, RunObserver, RunState
from ..observers.history import RunOutcome
from ..observers.runlog import RunEnd
from ..observers.trackers import trackers_for
from ..relay.output import write_to_std_stream
from ..request.cell import CellInfo, CellSyntaxError, analyse_cell, names_to_send
from ..request.config import DEFAULT_KEEP_ALIVE_S, ConfigError, LaunchConfig, LaunchRequest, resolve
from ..request.detach import attached, followed_run
from ..request.inputs import PayloadError, pack_inputs
from ..request.mistakes import UserInputError
from ..request.notebook_modules import WorkdirGone, notebook_workdir
from ...wire.options import options_of
from ...wire.runfolder import restart_decision
from .cellrun import CellRun
from .checkpoint_lock import hold_checkpoint_folder
from .restarts import run_with_restarts
from .pools import PoolManager
from .run import RunResult, run_cell
from .sessions import SessionError, session_lines


@dataclass(frozen=True)
class RunOptions:
    """:func:`run_source`'s keyword options, packed once at its top so that the run's path passes one value."""

    manager: PoolManager | None = None  # keeps the warm pool between calls; without one, it stops after the run
    line_offset: int = 1  # the cell's first line in the notebook, for tracebacks
    write: Callable[[str, str], None] | None = None  # (stream, text) into the cell; stdout/stderr without one
    code_name: Callable | None = None  # IPython's name for the cell's code, for tracebacks
    observers: tuple[RunObserver, ...] = ()
    outcome: RunOutcome = field(default_factory=RunOutcome)  # receives what was logged, however the run ends
    stop: threading.Event | None = None  # set from another thread, it stops the run as the stop button does
    attach: str = ""  # %distributed_attach: follow this detached run (its ranks run already) instead of starting ranks

    @classmethod
    def of(cls, options: dict[str, Any]) -> RunOptions:
        """The options a caller passed by keyword; an unknown keyword is a :class:`TypeError` that names it."""
        known = {f.name for f in fields(cls)}
        for name in options:
            if name not in known:
                raise TypeError(f"run_source() got an unexpected keyword argument '{name}' "
                                f"(it takes {', '.join(sorted(known))})")
        given = {name: value for name, value in options.items() if value is not None}  # None: the default
        return cls(**{**given, "observers": tuple(given.get("observers", ()))})


def run_source(source: str, request: LaunchRequest, namespace: dict, **options: Any) -> RunResult:
    """Run ``source`` as ``request.nprocs`` ranks; names rank 0 assigns are put into ``namespace``.

    Keyword options (:class:`RunOptions`): ``manager`` keeps the warm pool between calls; without one, the pool
    is stopped after the run. ``outcome`` (a :class:`~.run.RunOutcome`) receives what was logged however the
    run ends: a result, a failure, a stop. ``line_offset``, ``write``, ``code_name``, ``observers``; ``stop`` (a
    ``threading.Event``), set from another thread, stops the run as the stop button does.
    """
    given = RunOptions.of(options)
    manager, write, observers, outcome = given.manager, given.write, given.observers, given.outcome
    config = resolve(request)
    if given.attach:
        config = attached(config, given.attach)
    info = analyse_cell(source, given.line_offset)
    started = time.time()
    state: RunState | None = RunState.FAILED
    FanOut(observers).earlier_runs(manager.runs.earlier(source, changed_options(request)) if manager else ())
    result: RunResult | None = None
    try:
        result = _run(_cell_run(config, info, namespace, given))
        state = RunState.FINISHED
        return result
    except UserInputError:
        state = None  # nothing ran: a mistake found before any process started
        raise
    except KeyboardInterrupt:
        state = RunState.INTERRUPTED
        raise
    finally:
        kept = manager.cell_ended(config.keep_alive_s) if manager is not None and state is not None else ""
        if kept:
            (write or write_to_std_stream)("stdout", kept + "\n")
        if manager is not None and state is not None and source.strip():  # nbtrain.runs(), however they ended
            seconds = result.seconds if result is not None else time.time() - started  # the summary's, when there is one
            ended = RunEnd(source, changed_options(request), started, seconds, config.pool.nprocs, state,
                           config.train.checkpoint_dir)
            manager.runs.add(ended, outcome.history, outcome.metering or _spec_metering(config))


def _spec_metering(config: LaunchConfig) -> Metering:
    """What a run that ended before any rank was asked for would have held, as its pool spec says."""
    return metering_for(config.pool, (), config.price_per_hour)


def changed_options(request: LaunchRequest) -> str:
    """The options that differ from their defaults, as the magic's line writes them: ``--amp bf16 --fresh``."""
    words = []
    for f, spec in options_of(LaunchRequest):
        value = getattr(request, f.name)
        if value == f.default or spec.flag is None or value in (None, ()):
            continue
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        words.append(spec.flag if value is True else f"{spec.flag} {shown}")
    return " ".join(words)


def _cell_run(config: LaunchConfig, info: CellInfo, namespace: dict, given: RunOptions) -> CellRun:
    """The run of a checked cell: without a manager, a throwaway one that keeps no warm ranks."""
    manager = given.manager
    if manager is None:
        if config.session:
            raise ConfigError("--session keeps variables on warm ranks between cells: pass the same manager= "
                              "(a PoolManager) to every run_source call of the session.")
        manager = PoolManager()
        config = replace(config, keep_alive_s=0.0)
    observers = (*given.observers,  # and --tensorboard, --track, nbtrain.track()
                 *trackers_for(config.tensorboard, config.tracks, replay=bool(config.attach)))
    return CellRun(info, config, namespace, manager, given.write or write_to_std_stream, given.outcome,
                   observers, given.code_name, stop=given.stop)


def _run(cell: CellRun) -> RunResult:
    config, manager = cell.config, cell.manager
    names = [] if config.attach else names_to_send(cell.info, cell.namespace)  # attached: the ranks have their inputs
    if config.session:  # before anything is packed: the session's ranks must fit the cell
        manager.sessions.check(config.session, config.pool, config.fresh)
        names = manager.sessions.names_to_send(config.session, names, cell.namespace)
    held = None if config.attach else config.train.checkpoint_dir  # an attached run's folder is its own run's
    with hold_checkpoint_folder(held):  # one run per folder, restarts included
        return _run_held(replace(cell, names=tuple(names)))


def _run_held(cell: CellRun) -> RunResult:
    inputs = _pack_or_explain_stop(cell.namespace, cell.names)
    if not cell.config.train.max_restarts:
        return run_cell(cell, inputs)

    followed = followed_run(cell.config)  # a detached run: its agent restarts it, this kernel follows the record

    def attempt(restart: int, followers: list) -> RunResult:  # a restart resumes from the checkpoint, with fresh inputs
        if restart == 0:
            return run_cell(replace(cell, observers=tuple(followers)), inputs)
        again = cell.again(restart, followers)
        if followed:  # the agent started the ranks again; the cell follows that attempt in the record
            return run_cell(replace(again, config=attached(again.config, followed, restart)), pack_inputs({}, ()))
        return run_cell(again, pack_inputs(cell.namespace, cell.names))

    decide = (lambda _error, restarts: restart_decision(followed, restarts)) if followed else None
    return run_with_restarts(attempt, cell.config.train, cell.write, cell.observers, decide)


def list_sessions(manager: PoolManager) -> list[str]:
    """What ``%distributed_sessions`` prints: each session's ranks, devices, memory and the names it holds."""
    return session_lines(manager.sessions)


def pull(manager: PoolManager, session: str, names: list[str], namespace: dict, *, write=None) -> RunResult:
    """Bring ``names`` that ``session`` holds on rank 0 into ``namespace`` (``%distributed_pull``); without names,
    a :class:`SessionError` that says what each session holds."""
    if not names:
        raise SessionError(manager.sessions.nothing_to_pull(session))
    spec = manager.sessions.spec_holding(session, names)  # the session's own ranks: no request to rebuild
    try:
        workdir = notebook_workdir()
    except WorkdirGone as exc:
        raise ConfigError(str(exc)) from None
    config = LaunchConfig(spec, tuple(names), "all", DEFAULT_KEEP_ALIVE_S, False, workdir=workdir, session=session)
    return _run(_cell_run(config, analyse_cell("", 1), namespace, RunOptions(manager=manager, write=write)))


def close(manager: PoolManager, session: str) -> None:
    """End ``session``: the ranks drop its namespace (``%distributed_close``)."""
    manager.close_session(session)


def _pack_or_explain_stop(namespace: dict, names):
    try:
        return pack_inputs(namespace, names)
    except KeyboardInterrupt as exc:  # the stop button while big tensors were written: nothing started
        # IPython shows the lines _render_traceback_() returns instead of a traceback (an untyped hook)
        exc.with_traceback(None)._render_traceback_ = lambda: [  # type: ignore[attr-defined]
            "KeyboardInterrupt: stopped by the user while the inputs were written to shared memory; "
            "no rank was started and no file was left."]
        raise exc from None


def format_summary(result: RunResult, hints: list[Hint] | None = None) -> list[str]:
    """The short lines the magic prints after a successful run, ending with the bottleneck advisor's hints
    (``hints``: those of an observer that measured more, such as the dashboard's telemetry; left out:
    what the run's own records support — its logged steps and what prepare() set up)."""
    devices = sorted(set(result.devices.values()))
    where = devices[0] if len(devices) == 1 else ", ".join(devices)
    line = f"nbtrain: {count('rank', len(result.devices))} · {result.backend} · {where} · {result.seconds:.1f} s" + (" (warm)" if result.warm else "")
    if result.shared_bytes:  # before the ranks got the job: not in their seconds, nor in the cold start's first step
        line += f" · inputs {memory_size(result.shared_bytes)} to shared memory in {result.pack_seconds:.1f} s"
    line += "".join(f" · {word}" for word in setup_words(result.setup))  # precision, memory format, compile time
    if result.metering is not None and result.metering.price is not None:  # --price-per-gpu-hour
        line += f" · {result.metering.words(result.seconds)}"
    if result.returned:
        line += " · back in the notebook: " + ", ".join(result.returned)
    lines = [line]
    if len(result.history):
        lines.append(f"nbtrain: logged series are in `history`: {', '.join(result.history.names)}")
    lines += [f"nbtrain: {note}" for note in result.notes]
    if result.cold_start is not None:
        lines.append(f"nbtrain: {result.cold_start.line()}")
    if result.moved_to_cpu:
        lines.append(f"nbtrain: {', '.join(result.moved_to_cpu)} came back on the CPU (they were on a GPU in the ranks)")
    lines += [f"nbtrain: skipped '{name}': {reason}" for name, reason in result.skipped.items()]
    if hints is None:
        hints = advise(evidence_from_history(result.history, result.setup))
    lines += [f"nbtrain: hint: {hint.text}" for hint in hints]
    return lines + format_profile(result.profiles)


__all__ = ["UserInputError", "run_source", "RunOptions", "format_summary", "list_sessions", "pull", "close", "SessionError", "ConfigError", "CellSyntaxError", "PayloadError"]
