"""What killed processes left behind: folders and files named after a process that no longer runs.

A process that is SIGKILLed (or a kernel that JupyterLab shuts down harder than it expected) runs no cleanup.
What it made is named with its pid — ``/tmp/nbtrain-node-<pid>-…`` (a node agent), ``/tmp/nbtrain-emulated-<pid>-…``
and ``/tmp/nbtrain-ssh-<pid>-…`` (a kernel's node logs), ``kernel-<pid>.json`` (a run record) — so the next
``%load_ext nbtrain`` or node agent removes what belongs to dead processes.

Only this user's own entries are touched: ``/tmp`` and ``/dev/shm`` are shared, and another user's file with
a matching name is theirs (a planted one must not stop a sweep either). Each entry is handled alone: one that
cannot be removed is skipped, never an error for the caller.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from .pids import pid_alive

TEMP_PATTERN = re.compile(r"nbtrain-(?:node|emulated|ssh)-(\d+)-")


def owned_by_me(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def sweep_dead(folder: str, pattern: re.Pattern) -> int:
    """Remove this user's entries of ``folder`` whose name matches ``pattern`` (group 1: the owning pid) and
    whose process is gone; how many were removed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    for name in names:
        match = pattern.match(name)
        path = os.path.join(folder, name)
        if match is None or pid_alive(match.group(1)) or not owned_by_me(path):
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed += 1
        except OSError:
            continue
    return removed


def sweep_temp() -> int:
    """Node agents' private folders and kernels' node logs whose process is gone."""
    return sweep_dead(tempfile.gettempdir(), TEMP_PATTERN)
