"""What killed processes left behind: folders and files named after a process that no longer runs.

A process that is SIGKILLed (or a kernel that JupyterLab shuts down harder than it expected) runs no cleanup.
What it made is named with its pid — ``/tmp/nbtrain-node-<pid>-…`` (a node agent), ``/tmp/nbtrain-emulated-<pid>-…``
and ``/tmp/nbtrain-ssh-<pid>-…`` (a kernel's node logs), ``kernel-<pid>.json`` (a run record) — so the next
``%load_ext nbtrain`` or node agent removes what belongs to dead processes.

``/tmp`` and ``/dev/shm`` are shared: any user can create any name there (a file, a folder, a symlink, a FIFO),
and the sticky bit keeps its owner the only one who can remove it. So an entry is judged by its owner first
(``lstat``: a symlink is the link, never what it points to), and only this user's are read further; the pid in
a name is only a name (:func:`nbtrain.common.pids.as_pid`: one that cannot be a pid is no live process). Each entry is
handled alone: one that cannot be removed is skipped, and a sweep, which only tidies, never raises into what
called it (:func:`sweep_quietly`) — a planted name must not stop ``%load_ext`` or a node agent.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator

from .pids import pid_alive

TEMP_PATTERN = re.compile(r"nbtrain-(?:node|emulated|ssh)-(\d+)-")


def owned_by_me(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def my_entries(folder: str, pattern: re.Pattern) -> Iterator[tuple[str, re.Match]]:
    """This user's entries of ``folder`` whose name ``pattern`` matches, with the match; none if it is unreadable."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = pattern.match(name)
        path = os.path.join(folder, name)
        if match is not None and owned_by_me(path):
            yield path, match


def remove_entry(path: str) -> bool:
    """Remove a file, link, FIFO or (this user's) folder tree; whether it went. A link is removed, never followed."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False


def sweep_dead(folder: str, pattern: re.Pattern) -> int:
    """Remove this user's entries of ``folder`` whose name matches ``pattern`` (group 1: the owning pid) and
    whose process is gone; how many were removed."""
    return sum(remove_entry(path) for path, match in my_entries(folder, pattern) if not pid_alive(match.group(1)))


def sweep_temp() -> int:
    """Node agents' private folders and kernels' node logs whose process is gone."""
    return sweep_dead(tempfile.gettempdir(), TEMP_PATTERN)


def sweep_quietly(*sweeps: Callable[[], object]) -> None:
    """Run each sweep; one that fails is skipped. A sweep only tidies what others left: whatever it meets in a
    shared folder, the extension still loads and the agent still serves."""
    for sweep in sweeps:
        try:
            sweep()
        except Exception:  # nothing a sweep meets may stop what called it
            continue
