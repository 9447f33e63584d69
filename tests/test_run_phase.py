"""A run's phases (nbtrain/kernel/lifecycle/phase.py): the changes the run's loop may make, and one it may not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nbtrain.kernel.lifecycle.phase import IllegalPhaseChange, RunPhase, checked_next

RUN_PY = Path(__file__).resolve().parents[1] / "nbtrain/kernel/lifecycle/run.py"


def _walk(*phases: RunPhase) -> RunPhase:
    current = phases[0]
    for phase in phases[1:]:
        current = checked_next(current, phase)
    return current


def test_a_run_that_succeeds_goes_from_starting_to_finished():
    assert _walk(RunPhase.STARTING, RunPhase.RUNNING, RunPhase.FINISHING, RunPhase.FINISHED) is RunPhase.FINISHED


def test_a_rank_failing_in_the_start_in_the_cell_or_while_its_last_output_comes_fails_the_run():
    assert _walk(RunPhase.STARTING, RunPhase.FAILING, RunPhase.FAILED) is RunPhase.FAILED
    assert _walk(RunPhase.STARTING, RunPhase.RUNNING, RunPhase.FAILING, RunPhase.FAILED) is RunPhase.FAILED
    assert _walk(RunPhase.RUNNING, RunPhase.FINISHING, RunPhase.FAILING, RunPhase.FAILED) is RunPhase.FAILED


@pytest.mark.parametrize("current, new", [
    (RunPhase.FINISHED, RunPhase.RUNNING),  # an ended run does not start again
    (RunPhase.FAILED, RunPhase.FAILING),
    (RunPhase.FAILING, RunPhase.FINISHED),  # a failure is not undone by the other ranks finishing
    (RunPhase.STARTING, RunPhase.FINISHING),  # no rank finishes a cell it was not sent
    (RunPhase.RUNNING, RunPhase.RUNNING),
])
def test_an_illegal_change_is_refused_with_both_phases_named(current, new):
    with pytest.raises(IllegalPhaseChange, match=f"from {current.name} to {new.name}"):
        checked_next(current, new)


def test_only_the_runs_enter_method_assigns_its_phase():
    """The run's phase has one writer: ``_Run._enter`` (and ``__init__``, which sets the first)."""
    writers = []
    for func in (n for n in ast.walk(ast.parse(RUN_PY.read_text())) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(func):
            targets = node.targets if isinstance(node, ast.Assign) else []
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(isinstance(t, ast.Attribute) and t.attr == "phase" for t in flat):
                writers.append(func.name)
    assert sorted(writers) == ["__init__", "_enter"]


class _Pool:
    def __init__(self, connected: bool, ready: bool = False) -> None:
        self._connected, self.ready = connected, ready

    def connected(self) -> bool:
        return self._connected


def _wait(sent: bool, pool: _Pool, phase: RunPhase = RunPhase.STARTING, done: dict | None = None) -> float:
    from types import SimpleNamespace

    from nbtrain.kernel.lifecycle.run import _Run

    return _Run._wait_s(SimpleNamespace(sent=sent, pool=pool, phase=phase, done=done or {}))  # type: ignore[arg-type]


def test_the_loop_does_not_sleep_while_the_job_can_go_to_a_warm_pool():
    """A warm pool's ranks are connected from the start: the job goes at once, not after one poll's wait."""
    from nbtrain.kernel.lifecycle.run import STEADY_WAIT_S, TIMED_WAIT_S

    assert _wait(sent=False, pool=_Pool(connected=True)) == 0.0
    assert _wait(sent=False, pool=_Pool(connected=False)) == TIMED_WAIT_S  # ranks still starting: timed
    assert _wait(sent=True, pool=_Pool(connected=True)) == TIMED_WAIT_S  # sent, the group not formed yet
    assert _wait(sent=True, pool=_Pool(connected=True, ready=True), phase=RunPhase.RUNNING) == STEADY_WAIT_S
