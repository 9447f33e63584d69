"""A cell's run path stays narrow: no function on it takes more than five parameters, and run_source's keyword
options are one checked value (nbtrain/kernel/lifecycle/entry.py's RunOptions); the pool manager hands out started groups;
the run says what it held (its metering) in its own result or outcome; every event from the ranks goes through
the run's one dispatcher, which refuses an event of a kind it does not know."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import nbtrain.kernel.lifecycle as lifecycle
from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.observers.history import RunOutcome
from nbtrain.kernel.ranks.pool import LocalPool
from nbtrain.kernel.request.config import LaunchRequest

MOST_PARAMETERS = 5
PATH_MODULES = [f"{lifecycle.__name__}.{m.name}" for m in pkgutil.iter_modules(lifecycle.__path__)] + [
    # what the run calls on its way: the groups and their launcher, the relay, failures and their report, the log
    "nbtrain.kernel.observers.cost", "nbtrain.kernel.observers.runlog", "nbtrain.kernel.relay.output",
    "nbtrain.kernel.diagnostics.failures", "nbtrain.kernel.diagnostics.stacks", "nbtrain.kernel.ranks.pool",
    "nbtrain.kernel.ranks.rankgroup", "nbtrain.kernel.ranks.starter", "nbtrain.kernel.cluster.group",
    "nbtrain.kernel.cluster.launcher", "nbtrain.kernel.magics", "nbtrain.kernel.background.runner",
    "nbtrain.kernel.background.handle", "nbtrain.kernel.background.arrivals"]


def _functions_of(module):
    """Every function and method defined in ``module`` (nested classes' included), with a name to show."""
    def walk(owner, prefix):
        for name, value in vars(owner).items():
            value = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if dataclasses.is_dataclass(owner) and name == "__init__":
                continue  # a record's generated constructor: its fields, not a function's inputs
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                yield f"{prefix}{name}", value
            elif inspect.isclass(value) and value.__module__ == module.__name__ and value is not owner:
                yield from walk(value, f"{prefix}{name}.")
    yield from walk(module, f"{module.__name__}.")


def _parameters(function) -> list[str]:
    names = list(inspect.signature(function).parameters)
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def test_no_function_on_the_cell_path_takes_more_than_five_parameters():
    checked, wide = 0, []
    for module_name in PATH_MODULES:
        for name, function in _functions_of(importlib.import_module(module_name)):
            checked += 1
            if len(_parameters(function)) > MOST_PARAMETERS:
                wide.append(f"{name}({', '.join(_parameters(function))})")
    assert checked > 100  # the walk found the path's functions
    assert not wide, f"more than {MOST_PARAMETERS} parameters: " + "; ".join(wide)


def test_a_wrong_keyword_to_run_source_is_a_type_error_that_names_it():
    with pytest.raises(TypeError, match="unexpected keyword argument 'observer'"):
        run_source("x = 1", LaunchRequest(nprocs=2, cpu=True), {}, observer=[])
    with pytest.raises(TypeError):  # the options are keyword-only, as before
        run_source("x = 1", LaunchRequest(nprocs=2, cpu=True), {}, None)  # type: ignore[misc]


@pytest.mark.slow  # two real ranks start
def test_run_source_takes_every_keyword_option_it_took_before():
    namespace: dict = {"scale": 3}
    written: list[tuple[str, str]] = []
    outcome = RunOutcome()
    result = run_source("y = scale * (rank + 1)\nprint('hello')", LaunchRequest(nprocs=2, cpu=True), namespace,
                        manager=None, line_offset=4, write=lambda stream, text: written.append((stream, text)),
                        code_name=None, observers=(), outcome=outcome)
    assert namespace["y"] == 3 and result.backend == "gloo"
    assert any("hello" in text for _, text in written)


def test_the_run_gets_its_ranks_started_by_the_pool_manager_alone():
    """The pool manager owns the starter: a run asks it to start a cold pool and never reaches past it."""
    for module_name in PATH_MODULES:
        if module_name.endswith(".pools"):
            continue
        source = inspect.getsource(importlib.import_module(module_name))
        assert ".starter" not in source, f"{module_name} starts ranks itself instead of through PoolManager.acquire"


@pytest.mark.slow
def test_a_failed_run_leaves_what_it_held_in_its_outcome_and_its_record(pools, monkeypatch):
    """The run itself says what it held — in its result, or in the outcome when it fails — with no observer between."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    request = LaunchRequest(nprocs=2, cpu=True, price_per_gpu_hour=3600.0)
    outcome = RunOutcome()
    with pytest.raises(RankFailedError):
        run_source("raise ValueError('no')", request, {}, manager=pools, outcome=outcome)
    assert outcome.metering is not None and (outcome.metering.unit, outcome.metering.price) == ("core", 3600.0)
    row = pools.runs.table().to_dicts()[-1]
    assert row["cost"] == pytest.approx(outcome.metering.count * row["seconds"], rel=0.01)
    result = run_source("x = 1", request, {}, manager=pools, outcome=outcome)
    assert result.metering is not None and result.metering == outcome.metering


@dataclasses.dataclass(frozen=True)
class _Stranger:
    """An event no run knows: what a group that drifted from the run's union would yield."""

    rank: int


class _GroupThatYieldsAStranger(LocalPool):
    """Real ranks on gloo whose group, once, yields an event of an unknown kind along with the real ones."""

    yielded = False

    def poll_events(self, timeout: float) -> list:
        events: list = list(super().poll_events(timeout))
        if not self.yielded:
            self.yielded = True
            events.append(_Stranger(0))
        return events


@pytest.mark.slow
def test_an_event_of_an_unknown_kind_fails_the_run_naming_it_instead_of_being_ignored():
    manager = PoolManager(pool_factory=_GroupThatYieldsAStranger)
    namespace: dict = {}
    try:
        with pytest.raises(TypeError, match=r"yielded _Stranger\(rank=0\), which is not one of the events a run takes"):
            run_source("y = 1", LaunchRequest(nprocs=2, cpu=True), namespace, manager=manager)
    finally:
        manager.shutdown()
    assert "y" not in namespace
