"""The panel's detached runs: this user's ``--detach`` runs on this machine, read from their folders, and their Stop.

The server runs as the user whose runs these are, so it reads the same runs directory as the user's kernels
(:func:`nbtrain.wire.runfolder.list_runs`: only this user's folders, judged before they are read). Stop is what
``%distributed_shutdown --detached`` does for one run: a SIGINT to the run's agent, once ``/proc`` shows it is
that agent (:mod:`nbtrain.wire.detached_stop`) — never a pid taken from the request.
"""

from __future__ import annotations

import os

from ..wire.detached_stop import NotTheRunsAgent, stop_run
from ..wire.runfolder import RecordedState, RunFolderError, check_run_id, list_runs, read_about, read_manifest
from .runs import StopRefused


def detached_rows(root_dir: str = "") -> list[dict]:
    """One entry per detached run of this user's, newest first: its id, state, step, ranks, times, its notebook (as
    a path under the server's ``root_dir``, which the page opens) and whether that notebook is gone."""
    rows = []
    for run in reversed(list_runs()):
        about = read_about(run.run_id)
        notebook, gone = _notebook(about.get("notebook"), root_dir)
        rows.append({"run_id": run.run_id, "state": run.state.value, "active": run.state is RecordedState.RUNNING,
                     "step": run.step, "nprocs": run.nprocs, "started": run.started, "ended": run.ended,
                     "notebook": notebook, "notebook_gone": gone, "attach": f"%distributed_attach {run.run_id}"})
    return rows


def _notebook(given: object, root_dir: str) -> tuple[str | None, bool]:
    """The notebook a run's kernel named (Jupyter gives a kernel its notebook's file path, or a path relative to the
    server's root), as a path under ``root_dir``, and whether that file is gone (moved, deleted: the panel then
    offers to follow the run from the notebook the user is in). A notebook outside the root, which this server
    cannot open, counts as gone."""
    if not isinstance(given, str) or not given:
        return None, True
    root = os.path.realpath(root_dir or os.getcwd())
    where = given if os.path.isabs(given) else os.path.join(root, given)
    real = os.path.realpath(where)
    if os.path.commonpath([root, real]) != root:
        return None, True  # this server cannot open it: as good as gone from here
    return os.path.relpath(real, root).replace(os.sep, "/"), not os.path.isfile(real)


def stop_detached(run_id: object) -> dict:
    """Stop the detached run ``run_id`` (202's body); :class:`StopRefused` 400/404/409 says why not."""
    try:
        check_run_id(run_id)  # type: ignore[arg-type]
    except RunFolderError as exc:
        raise StopRefused(400, str(exc)) from None
    run = read_manifest(str(run_id))
    if run is None:
        raise StopRefused(404, f"no detached run {run_id!r} of yours on this machine")
    if run.state is not RecordedState.RUNNING:
        raise StopRefused(409, f"detached run {run_id} has {run.state.value} already")
    try:
        stop_run(run)
    except NotTheRunsAgent as exc:
        raise StopRefused(409, str(exc)) from None
    return {"run_id": run.run_id, "message": "its agent interrupts the ranks; they stop within a few seconds"}

