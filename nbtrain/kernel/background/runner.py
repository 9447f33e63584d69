"""``%%distributed --background``: the cell starts its ranks and returns at once; the run goes on in a thread.

The thread runs the cell as a blocking cell would (:func:`~nbtrain.kernel.lifecycle.entry.run_source`, the
dashboard, the summary), in a copy of the starting cell's context: ipykernel keeps the request a message answers
in context variables, so the run's output, its dashboard and its traceback go to the cell that started it, never
to the cell that happens to be running. The run's inputs are the notebook's values when the cell ran (a copy of
the namespace's entries); its names come back through :mod:`.arrivals`.

Each background run has ranks of its own, started from the kernel's zygote and stopped at its end: the kernel's
warm ranks stay the blocking cells'. Two background runs at once are fine on different GPUs (or on the CPU); a
run on GPUs that a running one uses is refused, naming it. ``--session`` is refused: a session's variables live on
warm ranks that the next cell of the session uses, which a background run's own ranks cannot be.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from ..diagnostics.failures import RankFailedError
from ..lifecycle.checkpoint_lock import NOTEBOOK_ENV
from ..lifecycle.entry import format_summary, run_source
from ..lifecycle.pools import PoolManager
from ..observers.events import RunObserver, RunState
from ..observers.history import RunOutcome
from ..request.cell import analyse_cell, imported_only, names_to_return
from ..request.config import ConfigError, LaunchRequest, resolve
from ...wire.run_control import take_control
from ...wire.runfolder import RecordedState, new_run_id, read_manifest, reserve
from .arrivals import Arrivals
from .handle import BackgroundRun


HAND_OVER_S = 60.0  # the kernel's exit waits at most this long for detached runs' agents to get their cells


@dataclass(frozen=True)
class BackgroundCell:
    """What a background run needs from its cell: the source, the request, its followers (the dashboard, the
    registry) and the dashboard that gives the summary its hints (None: the run's own records)."""

    source: str
    request: LaunchRequest
    observers: tuple = ()
    advisor: object | None = None
    quiet: bool = False
    line: str = ""  # the magic's line, kept with a detached run so that a kernel attaching runs the same options
    attach: str = ""  # %distributed_attach --background: the detached run followed


class BackgroundRuns:
    """One shell's background runs: started here, handed over by :class:`~.arrivals.Arrivals`."""

    def __init__(self, shell, pools: PoolManager) -> None:
        self.shell = shell
        self.pools = pools  # the kernel's: its pool factory and zygote serve the background runs' own ranks
        self.arrivals = Arrivals(shell)
        self.count = 0
        self._gpus: dict[int, tuple[int, ...]] = {}  # a running background run -> the GPUs it uses
        self._handing_over: list[str] = []  # detached runs started here: the kernel's exit waits for their cells to go

    def start(self, cell: BackgroundCell) -> BackgroundRun:
        """Check the cell (a mistake raises before anything starts), then run it in a thread; its handle."""
        if cell.request.detach and not cell.request.run_id:  # one id for the run, chosen before its options are checked
            cell = replace(cell, request=replace(cell.request, run_id=new_run_id()))
        config = resolve(cell.request)
        info = analyse_cell(cell.source)
        if config.session:
            raise ConfigError("--session keeps the cell's variables on warm ranks for the session's next cell; a "
                              "--background run has ranks of its own, stopped at its end. Leave out one of them.")
        self._check_gpus(config.pool.gpu_ids)
        if cell.request.detach:
            _reserve(cell, config)
            self._handing_over.append(cell.request.run_id or "")
            if len(self._handing_over) == 1:
                atexit.register(self._hand_over)
        self.count += 1
        imported = imported_only(info)
        stale_if_read = tuple(n for n in names_to_return(info, config.out_names) if n not in imported)
        run = BackgroundRun(self.count, cell.source, stale_if_read,
                            deliver=self.arrivals.deliver, detached=cell.attach or cell.request.run_id or "")
        self._gpus[run.number] = tuple(config.pool.gpu_ids)
        self.arrivals.add(run)
        namespace = dict(self.shell.user_ns)  # the inputs as they are now, whatever later cells assign
        context = contextvars.copy_context()  # this cell's request: the run's output goes to this cell
        thread = threading.Thread(target=context.run, args=(self._run, run, cell, namespace),
                                  name=f"nbtrain-background-{run.number}", daemon=True)
        thread.start()
        return run

    def _hand_over(self) -> None:
        """At the kernel's exit (a restart): a detached run whose agent has not got its cell yet gets it first — a
        restart right after the cell would otherwise take the run with it."""
        deadline = time.monotonic() + HAND_OVER_S
        if threading.current_thread() is threading.main_thread():  # the kernel manager's SIGTERM comes half-way
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # through its wait: the run's cell is worth the other half
        for run_id in self._handing_over:
            said = False
            while time.monotonic() < deadline:
                try:
                    if _has_its_cell(run_id):
                        break
                    if not said:
                        print(f"nbtrain: detached run {run_id} gets its cell before the kernel exits", flush=True)
                        said = True
                    time.sleep(0.1)
                except KeyboardInterrupt:  # an interrupt as the kernel stops: the cell is still worth the wait
                    continue  # (the kernel manager's SIGKILL ends it in any case)

    def _check_gpus(self, gpu_ids) -> None:
        for number, theirs in self._gpus.items():
            shared = sorted(set(gpu_ids) & set(theirs))
            if shared:
                raise ConfigError(f"GPU {', '.join(map(str, shared))} {'is' if len(shared) == 1 else 'are'} used by "
                                  f"background run {number}, still running: give --gpus others, or stop it first "
                                  "(nbtrain.last_run.stop(), or the run's own handle).")

    def _run(self, run: BackgroundRun, cell: BackgroundCell, namespace: dict) -> None:
        manager = self.pools.companion(detached=cell.request.detach)  # ranks of its own, stopped at its end
        outcome = RunOutcome()
        live = _LiveHistory(run)
        code_name = getattr(getattr(self.shell, "compile", None), "format_code_name", None)
        try:
            result = run_source(cell.source, cell.request, namespace, manager=manager, code_name=code_name,
                                observers=(*cell.observers, live), outcome=outcome, stop=run.stop_event,
                                attach=cell.attach)
        except KeyboardInterrupt:
            run.ended(RunState.INTERRUPTED, {}, outcome.history, "stopped")
            print("nbtrain: the background run was stopped: every rank and its child processes were ended.")
        except RankFailedError as error:  # the failing rank's traceback, mapped to the cell's lines, in its cell
            run.ended(RunState.FAILED, {}, outcome.history, error.failures[0].summary())
            print(f"RankFailedError: {error}", file=sys.stderr)
        except Exception as error:  # a mistake found in the thread, anything else: said in its cell, never lost
            run.ended(RunState.FAILED, {}, outcome.history, f"{type(error).__name__}: {error}")
            print(f"nbtrain: the background run failed: {type(error).__name__}: {error}")
        else:
            run.ended(RunState.FINISHED, {name: namespace[name] for name in result.returned}, result.history)
            if not cell.quiet:
                hints = cell.advisor.hints() if cell.advisor is not None else None  # type: ignore[attr-defined]
                print("\n".join(format_summary(result, hints)))
        finally:
            self._gpus.pop(run.number, None)
            manager.shutdown()


def _has_its_cell(run_id: str) -> bool:
    summary = read_manifest(run_id)
    return summary is not None and (summary.delivered or summary.state is not RecordedState.RUNNING)


def _reserve(cell: BackgroundCell, config) -> None:
    """A detached run's folder, with its cell, before its agent starts; a name used before is a mistake said now."""
    run_id = cell.request.run_id or ""
    about = {"line": cell.line, "source": cell.source, "kernel_pid": os.getpid(), "started": time.time(),
             "cwd": config.workdir.cwd if config.workdir else "", "notebook": os.environ.get(NOTEBOOK_ENV, "")}
    try:
        reserve(run_id, about)
    except FileExistsError:
        raise ConfigError(f"a detached run named {run_id!r} exists already: give --run-id another name, or follow it "
                          f"with %distributed_attach {run_id}") from None
    take_control(run_id, os.environ.get(NOTEBOOK_ENV, ""))  # this kernel's stop button stops the run (wire/run_control.py)


class _LiveHistory(RunObserver):
    """Feeds the handle as the run goes: running once the ranks have the job, ``run.history`` as they log."""

    def __init__(self, run: BackgroundRun) -> None:
        self.run = run

    def run_started(self, info) -> None:
        self.run.running()

    def metrics(self, rank: int, records: list) -> None:
        self.run.logged(rank, records)
