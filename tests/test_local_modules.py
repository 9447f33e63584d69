"""Which modules count as the user's own, and when their files count as changed (in this process, real files)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch  # noqa: F401  an installed package: its modules must not be stamped

import nbtrain
from nbtrain.kernel.request.notebook_modules import (
    Workdir, WorkdirGone, changed_files, fresh_ranks_note, notebook_workdir, stale_modules
)
from nbtrain.rank.modules import LocalModules


def write_module(path, body: str) -> None:
    before = os.stat(path).st_mtime_ns if path.exists() else 0
    path.write_text(body)
    later = max(os.stat(path).st_mtime_ns, before + 1_000_000_000)  # whatever the clock's granularity
    os.utime(path, ns=(later, later))


@pytest.fixture
def rank_state(monkeypatch, tmp_path):
    """LocalModules changes the directory, sys.path and sys.modules: give them back afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield LocalModules()
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_stamps_name_the_users_modules_only_and_follow_reloads(rank_state, tmp_path):
    project = tmp_path / "project"
    (project / "lm_pkg").mkdir(parents=True)
    write_module(project / "lm_pkg" / "__init__.py", "from .inner import X\n")
    write_module(project / "lm_pkg" / "inner.py", "X = 1\n")
    write_module(project / "lm_mod.py", "Y = 1\n")
    rank_state.enter(str(project), (str(tmp_path / "elsewhere"),))
    assert os.getcwd() == str(project) and sys.path[:2] == [str(project), str(tmp_path / "elsewhere")]
    import lm_mod
    import lm_pkg

    stamps = {stamp[1]: stamp for stamp in rank_state.stamps()}
    assert {p for p in stamps if p.startswith(str(tmp_path))} == {
        str(project / "lm_mod.py"), str(project / "lm_pkg" / "__init__.py"), str(project / "lm_pkg" / "inner.py")}
    nbtrain_dir = os.path.dirname(os.path.abspath(nbtrain.__file__))
    # the rest is this checkout's own test files and scripts (imported by earlier tests in this process):
    # not torch, pytest, the stdlib or nbtrain
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in set(stamps) - {p for p in stamps if p.startswith(str(tmp_path))}:
        assert path.startswith(checkout + os.sep), path
    assert "torch" in sys.modules and "nbtrain" in sys.modules and not any(p.startswith(nbtrain_dir) for p in stamps)
    assert changed_files(stamps) == []

    write_module(project / "lm_pkg" / "inner.py", "X = 22\n")
    assert changed_files({s[1]: s for s in rank_state.stamps()}) == [str(project / "lm_pkg" / "inner.py")]
    note = fresh_ranks_note(changed_files(stamps), [], str(project))
    assert note == "nbtrain: lm_pkg/inner.py changed since the warm ranks imported it; started fresh ranks\n"

    importlib.reload(lm_pkg.inner)  # imported anew: the rank now holds what is on disk
    assert changed_files({s[1]: s for s in rank_state.stamps()}) == []
    os.remove(project / "lm_mod.py")
    assert changed_files({s[1]: s for s in rank_state.stamps()}) == [str(project / "lm_mod.py")]
    assert lm_mod.Y == 1


def test_each_job_gets_the_notebooks_directory_and_path_not_the_last_ones(rank_state, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    rank_state.enter(str(first), (str(first), "/nb/lib"))
    rank_state.enter(str(second), (str(second),))
    assert os.getcwd() == str(second)
    assert sys.path[0] == str(second) and str(first) not in sys.path and "/nb/lib" not in sys.path
    assert sys.path[1:] == list(dict.fromkeys(rank_state.baseline))  # the rank's own entries, once each


def test_the_kernels_workdir_is_absolute_and_a_deleted_one_is_named(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "lib", *sys.path])
    workdir = notebook_workdir()
    assert workdir.cwd == str(tmp_path) and workdir.sys_path[:2] == (str(tmp_path), str(tmp_path / "lib"))
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(WorkdirGone, match=f"working directory {gone} was deleted"):
        notebook_workdir()


def test_a_module_shadowed_in_the_new_directory_makes_the_warm_ranks_stale(rank_state, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    write_module(first / "lm_shadowed.py", "WHERE = 'first'\n")
    write_module(first / "lm_only_first.py", "WHERE = 'first'\n")
    rank_state.enter(str(first), ())
    import lm_only_first  # noqa: F401
    import lm_shadowed  # noqa: F401

    stamps = {s[1]: s for s in rank_state.stamps() if s[1].startswith(str(tmp_path))}
    assert stale_modules(stamps, Workdir(str(first), ()), rank_state.baseline) == ([], [])
    # in the second folder: lm_only_first is not found at all (the cell may add its folder); no reason to restart
    assert stale_modules(stamps, Workdir(str(second), ()), rank_state.baseline) == ([], [])
    write_module(second / "lm_shadowed.py", "WHERE = 'second'\n")
    changed, moved = stale_modules(stamps, Workdir(str(second), ()), rank_state.baseline)
    assert (changed, moved) == ([], [str(first / "lm_shadowed.py")])
    assert fresh_ranks_note(changed, moved, str(second)) == (
        f"nbtrain: the warm ranks imported {first / 'lm_shadowed.py'}, but another file now comes first on the "
        "path; started fresh ranks\n")
