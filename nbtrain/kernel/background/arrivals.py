"""Where a background run's names arrive: in the notebook's namespace, between two cells — never in the middle
of one — or in ``run.wait()``; and the warning for a cell that reads them before they came.

IPython's ``pre_run_cell`` and ``post_run_cell`` events are the safe points: a run that ended meanwhile hands its
names (and ``history``, as a blocking cell does) over there, with one line saying which arrived. A cell that
reads a name a still-running background run will assign gets a warning first — its value is the one from before
the run, not the run's — unless it reads the name only after it called a ``wait()`` (``run.wait()``, as the
warning advises: the names have arrived by then). Names the run binds by importing them are not warned about: the
notebook's are the same modules.
"""

from __future__ import annotations

import ast
import threading

from ..request.cell import CellSyntaxError, analyse_cell
from .handle import BackgroundRun


class Arrivals:
    """One shell's background runs that have not handed their names over yet (see the module docstring)."""

    def __init__(self, shell) -> None:
        self.shell = shell
        self.waiting: list[BackgroundRun] = []
        self._lock = threading.Lock()
        shell.events.register("pre_run_cell", self.before_cell)
        shell.events.register("post_run_cell", self.after_cell)

    def add(self, run: BackgroundRun) -> None:
        with self._lock:
            self.waiting.append(run)

    def running(self) -> list[BackgroundRun]:
        with self._lock:
            return [run for run in self.waiting if not run.done]

    def before_cell(self, info=None) -> None:
        self.deliver_ended()
        self._warn_early_reads(getattr(info, "raw_cell", "") or "")

    def after_cell(self, result=None) -> None:
        self.deliver_ended()

    def deliver_ended(self) -> None:
        with self._lock:
            ended = [run for run in self.waiting if run.done]
        for run in ended:
            self.deliver(run)

    def deliver(self, run: BackgroundRun) -> None:
        """Hand ``run``'s names and history to the namespace, once."""
        with self._lock:
            if run.delivered or run not in self.waiting:
                return
            self.waiting.remove(run)
            run.mark_delivered()
        namespace = self.shell.user_ns
        namespace.update(run.result)
        if len(run.history):
            namespace["history"] = run.history
        names = [*run.result, *(["history"] if len(run.history) else [])]
        said = f"{', '.join(names)} arrived" if names else "nothing came back"
        print(f"nbtrain: background run {run.number} {run.state.value}: {said}", flush=True)

    def _warn_early_reads(self, raw_cell: str) -> None:
        running = self.running()
        if not running or "%%distributed" in raw_cell:
            return
        try:
            info = analyse_cell(self.shell.transform_cell(raw_cell))
        except (CellSyntaxError, SyntaxError, ValueError):
            return  # not Python IPython can run: nothing to say about its names
        reads = set(info.reads) & _read_before_waiting(info.code)
        for run in running:
            early = [name for name in run.assigns if name in reads]
            if early:
                print(f"nbtrain: warning: background run {run.number} is still {run.state.value}; "
                      f"{', '.join(early)} here {'is' if len(early) == 1 else 'are'} the value from before it "
                      f"(run.wait() first, or read them after it finished)", flush=True)


def _read_before_waiting(code: ast.Module) -> set[str]:
    """The names ``code`` loads before its first call of a ``wait()`` method (all of them if it calls none)."""
    def where(node: ast.AST) -> tuple[int, int]:
        return node.lineno, node.col_offset  # type: ignore[attr-defined]

    waits = [where(n) for n in ast.walk(code)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "wait"]
    first_wait = min(waits, default=(float("inf"), 0))
    return {n.id for n in ast.walk(code)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and where(n) < first_wait}
