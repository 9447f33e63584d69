"""The notebook's working directory and its own modules, as the warm ranks must see them (kernel side).

A fresh rank starts in the notebook's current directory and imports the user's modules from disk. A warm
rank was started earlier: it may sit in another directory (the notebook ran ``%cd`` since) and holds the
user's modules as they were when it imported them (the file was edited since, and the notebook
``importlib.reload``-ed it, or ``%autoreload`` did). Two things make it run what a fresh rank would:

* **The working directory.** :func:`notebook_workdir` captures, when the cell runs, the kernel's current
  directory and its ``sys.path`` (``''`` and relative entries made absolute). Every
  :class:`~nbtrain.wire.protocol.Job` carries it; the rank changes into that directory and puts those
  entries on its own ``sys.path`` before it unpickles anything (:mod:`nbtrain.rank.modules`). Relative
  ``--checkpoint`` directories are resolved against the same directory, in the kernel, at that moment.
  A working directory that was deleted is a :class:`~nbtrain.kernel.request.config.ConfigError` before
  anything starts.
* **Changed modules.** After each job every rank reports a :data:`~nbtrain.wire.workdir.Stamp` — module name, file, mtime in
  ns, size — for each module it has imported from outside the standard library, site-packages /
  dist-packages and nbtrain itself: the notebook's folder, ``sys.path`` entries the user added, editable
  checkouts. Before the next job goes to warm ranks, :func:`stale_modules` compares those stamps with the
  files on disk, and looks each top-level module up along the ``sys.path`` the ranks will have
  (:func:`~nbtrain.wire.workdir.rank_sys_path`, the rule the ranks apply): after ``%cd`` another
  ``mymod.py`` may come first. If a file changed (or is gone, or is shadowed), a reload in the ranks cannot be trusted — objects made
  from the old module, ``from mod import f`` copies, modules that imported it — so the warm ranks are
  dropped and fresh ones started, with one line saying why (:func:`fresh_ranks_note`).

Not detected: a package upgraded with pip (it lives in site-packages); use ``--fresh`` or
``%distributed_shutdown`` after that.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder

from ...wire.workdir import Stamp, rank_sys_path


@dataclass(frozen=True)
class Workdir:
    """Where a cell runs: the notebook's current directory and the kernel's ``sys.path``, absolute."""

    cwd: str
    sys_path: tuple[str, ...]


class WorkdirGone(OSError):
    """The notebook's current directory no longer exists."""


def notebook_workdir() -> Workdir:
    """The kernel's working directory and ``sys.path`` now; :class:`WorkdirGone` if the directory was deleted."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise WorkdirGone(_gone_message()) from None
    if not os.path.isdir(cwd):  # some systems still return the name of a removed directory
        raise WorkdirGone(_gone_message(cwd))
    entries: list[str] = []
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        path = os.path.normpath(os.path.join(cwd, entry)) if entry else cwd
        if path not in entries:
            entries.append(path)
    return Workdir(cwd, tuple(entries))


def _gone_message(cwd: str | None = None) -> str:
    if cwd is None:
        try:
            cwd = os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
        except OSError:
            cwd = "(unknown)"
    return (f"The notebook's working directory {cwd} was deleted, so the ranks have nowhere to run. "
            "Change to an existing folder (such as %cd ~) and run the cell again.")


def moved_modules(stamps: dict[str, Stamp], path: list[str]) -> list[str]:
    """Files of ``stamps`` that an import along ``path`` would no longer find first (``%cd`` to a folder
    with its own ``mymod.py``). A module now not found at all is left alone: the cell may add its folder."""
    moved = []
    importlib.invalidate_caches()  # a directory listing cached in the same clock tick would miss a new file
    for file, (name, _path, _mtime, _size) in sorted(stamps.items()):
        if "." in name:  # a submodule follows its package
            continue
        try:
            spec = PathFinder.find_spec(name, path)
        except (ImportError, ValueError, OSError):
            continue
        origin = getattr(spec, "origin", None)
        if isinstance(origin, str) and os.path.isfile(origin) and os.path.abspath(origin) != file:
            moved.append(file)
    return moved


def changed_files(stamps: dict[str, Stamp]) -> list[str]:
    """The files of ``stamps`` (path → stamp) that are no longer what the ranks imported."""
    changed = []
    for path, (_name, _path, mtime_ns, size) in sorted(stamps.items()):
        try:
            st = os.stat(path)
        except OSError:
            changed.append(path)
            continue
        if (st.st_mtime_ns, st.st_size) != (mtime_ns, size):
            changed.append(path)
    return changed


def stale_modules(stamps: dict[str, Stamp], workdir: Workdir, baseline: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The warm ranks' module files that changed on disk, and those another file now shadows."""
    changed = changed_files(stamps)
    moved = moved_modules({p: s for p, s in stamps.items() if p not in changed},
                          rank_sys_path(workdir.cwd, workdir.sys_path, baseline))
    return changed, moved


def fresh_ranks_note(changed: list[str], moved: list[str], cwd: str) -> str:
    """The one line printed when stale modules make the warm ranks unusable (paths under ``cwd`` relative)."""
    if changed:
        names = [_shown(p, cwd) for p in changed[:3]] + ([f"{len(changed) - 3} more"] if len(changed) > 3 else [])
        them = "it" if len(changed) == 1 else "them"
        return f"nbtrain: {', '.join(names)} changed since the warm ranks imported {them}; started fresh ranks\n"
    shown = ", ".join(_shown(p, cwd) for p in moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
    return (f"nbtrain: the warm ranks imported {shown}, but another file now comes first on the path; "
            "started fresh ranks\n")


def _shown(path: str, cwd: str) -> str:
    inside = path.startswith(cwd.rstrip(os.sep) + os.sep)
    return os.path.relpath(path, cwd) if inside else path
