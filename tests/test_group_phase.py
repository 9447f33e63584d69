"""A rank group's phase (nbtrain/kernel/ranks/rankgroup.py): forming → ready → broken, broken final, one writer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nbtrain.kernel.ranks.rankgroup import GroupPhase, GroupState, IllegalGroupChange
from nbtrain.kernel.ranks.spec import PoolSpec

RANKGROUP_PY = Path(__file__).resolve().parents[1] / "nbtrain/kernel/ranks/rankgroup.py"


def group(nprocs: int = 2) -> GroupState:
    return GroupState(PoolSpec(nprocs=nprocs, backend="gloo", device_type="cpu", gpu_ids=(), timeout_s=60.0))


def test_a_group_is_ready_once_every_rank_joined():
    state = group()
    assert state.phase is GroupPhase.FORMING
    assert not state.mark_ready(0, "cpu") and state.phase is GroupPhase.FORMING
    assert state.mark_ready(1, "cpu") and state.phase is GroupPhase.READY and not state.broken


def test_an_elastic_group_formed_smaller_is_ready_with_the_ranks_it_has():
    state = group(nprocs=4)
    state.mark_ready(0, "cpu")
    state.mark_ready(1, "cpu")
    state.formed(2)
    assert state.phase is GroupPhase.READY


def test_broken_is_final_a_late_ready_does_not_revive_the_group():
    state = group()
    state.mark_ready(0, "cpu")
    state.mark_broken()
    state.mark_ready(1, "cpu")  # rank 1's Ready arrives after rank 0 failed
    assert state.phase is GroupPhase.BROKEN and state.broken
    assert state.ready  # every rank did join: a fact, not the group's phase


def test_a_ready_group_does_not_form_again():
    state = group()
    state.mark_ready(0, "cpu")
    state.mark_ready(1, "cpu")
    with pytest.raises(IllegalGroupChange, match="from READY to FORMING"):
        state._enter(GroupPhase.FORMING)


def test_only_the_groups_enter_method_assigns_its_phase():
    writers = []
    for func in (n for n in ast.walk(ast.parse(RANKGROUP_PY.read_text())) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(func):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Attribute) and t.attr == "_phase" for t in targets):
                writers.append(func.name)
    assert sorted(writers) == ["__init__", "_enter"]
