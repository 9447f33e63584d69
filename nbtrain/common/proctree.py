"""Signals to a group of rank processes and everything under them — the one copy both launchers use.

The kernel's local pool (:mod:`nbtrain.kernel.ranks.procs`) and a node agent (:mod:`nbtrain.node.local_ranks`) end their
ranks alike:

* :func:`interrupt` — the stop button: exactly one SIGINT to each process, the ranks and their descendants
  (DataLoader workers, a cell's subprocesses). Not the process group as well: a second SIGINT a few
  milliseconds later would land in the cleanup the first one started and print tracebacks;
* :func:`stop` — SIGTERM, then SIGKILL, to each rank's session (``killpg``: itself and the children that
  stayed in it) and to every descendant found, with ``grace`` seconds after each.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil


def family(pids) -> list[psutil.Process]:
    """The processes ``pids`` and all their descendants, each once."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for member in [proc, *proc.children(recursive=True)]:
                found.setdefault(member.pid, member)
    return list(found.values())


def interrupt(pids) -> None:
    """One SIGINT to each of ``pids`` and each of their descendants."""
    for proc in family(pids):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGINT)


def stop(pids, grace: float) -> None:
    """SIGTERM, then SIGKILL, to the sessions of ``pids`` and all their descendants, until none is left."""
    members = family(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive(members):
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        for proc in members:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        _wait_gone(members, grace)


def _wait_gone(members: list[psutil.Process], grace: float) -> None:
    """Until none of ``members`` runs (a zombie counts as gone), at most ``grace`` seconds — without reaping: a
    child's exit status stays for its owner's ``Popen`` (``psutil.wait_procs`` would reap it, and the owner's poll
    would then read 0: torch elastic took a rank SIGTERM ended for a success and waited at its exit barrier)."""
    deadline = time.monotonic() + grace
    while alive(members) and time.monotonic() < deadline:
        time.sleep(0.02)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out
