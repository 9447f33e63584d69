"""``--max-restarts K``: when a rank dies, start the ranks again from the last checkpoint, up to K times.

A run with ``--checkpoint DIR --max-restarts K`` whose rank dies — killed by a signal (the
out-of-memory killer, a preempted machine), or exited without a Python exception — is started again
on fresh ranks; the cell resumes from ``DIR/checkpoint.pt`` as any cell does (automatically, see
:mod:`nbtrain.train.checkpoint`), so it goes on from the last ``nbtrain.save_checkpoint()``. Each
restart is announced in the cell's output with what happened and where the run resumes.

It does not restart when:

* a rank raised a Python exception in the cell: the same code would raise it again (fix the cell);
* the ranks called different collectives (:mod:`nbtrain.launch.mismatch`): a program error too;
* DIR holds no checkpoint yet: there is nothing to resume from, and the message says so;
* K restarts were used.

Then the last failure is raised as usual. ``history`` holds the metrics of the last attempt (whose steps
continue the checkpoint's). Restarts resume even when the cell was run with ``--no-resume``.
"""

from __future__ import annotations

import os
from typing import Callable

from ..launch.errors import RankFailedError
from ..words import count
from .settings import TrainSettings


def run_with_restarts(attempt: Callable[[int], object], settings: TrainSettings, write: Callable[[str, str], None]):
    """Call ``attempt(restart_number)`` until it succeeds or must not be repeated; re-raise the last failure."""
    restarts = 0
    while True:
        try:
            result = attempt(restarts)
        except RankFailedError as error:
            reason = _why_not_restart(error, settings, restarts)
            if reason is not None:
                write("stderr", f"nbtrain: {error.failures[0].summary()}; not restarting: {reason}.\n")
                raise
            restarts += 1
            write("stderr", f"nbtrain: {error.failures[0].summary()}; restarting the ranks from "
                            f"{_describe_checkpoint(settings.checkpoint_path)} (restart {restarts} of {settings.max_restarts}).\n")
            continue
        if restarts:
            result.notes.append(f"finished after {count('restart', restarts)} from the checkpoint")
        return result


def _why_not_restart(error: RankFailedError, settings: TrainSettings, restarts: int) -> str | None:
    first = error.failures[0]
    if first.diagnosis is not None:  # a program error nbtrain diagnosed (uneven collectives)
        return "the ranks call different collectives, which a restart would repeat"
    if first.error is not None and not first.secondary:
        return (f"rank {first.rank} raised {first.error.type_name} in the cell, which a restart would raise again; "
                "restarts are for ranks that die")
    if restarts >= settings.max_restarts:
        return f"--max-restarts {settings.max_restarts} used up"
    if not os.path.exists(settings.checkpoint_path):
        return (f"the cell cannot resume: {settings.checkpoint_dir} holds no checkpoint yet "
                "(nbtrain.save_checkpoint() had not run before the failure)")
    return None


def _describe_checkpoint(path: str) -> str:
    """``path (epoch e, step s)``, read without loading the tensors (mmap)."""
    try:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        return f"{path} (epoch {state['epoch']}, step {state['step']})"
    except Exception:
        return path
