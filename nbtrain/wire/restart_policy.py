"""Whether a failed attempt of a run is started again (``--max-restarts K``): one rule for every supervisor.

The kernel decides for the runs it supervises (:mod:`nbtrain.kernel.lifecycle.restarts`); a detached run's agent
decides for its run when no kernel is there (:mod:`nbtrain.node.detached_restarts`). Both describe the attempt's
first failure as :class:`FailureFacts` and ask :func:`why_not_restart`, so a run restarts the same way whoever
watches it.

A rank that *died* (a signal, an exit without a Python exception) is restarted from the last checkpoint; a rank
that raised in the cell is not (the same code would raise again), unless what it raised is a communication error
that another rank's death caused (:func:`peer_lost`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..common.words import checkpoint_position
from .settings import TrainSettings

ATTEMPT_ENV = "NBTRAIN_ATTEMPT"  # set by a detached run's agent for a restarted attempt: the ranks resume
FT_ATTEMPT_ENV = "NBTRAIN_FT_ATTEMPT"  # --ft: the how-many-th start of a rank's replica group (0: the first)

_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "gloo/transport",
              "nccl communicator was aborted", "socket closed")


def ft_attempt() -> int:
    """In a rank under ``--ft``: 0 for its replica group's first start, more for a group started in place of a lost one."""
    return int(os.environ.get(FT_ATTEMPT_ENV, "0"))


def peer_lost(type_name: str, message: str) -> bool:
    """An exception a rank raised because another rank went away (never shown as the cause if one is known)."""
    text = f"{type_name} {message}".lower()
    return type_name.startswith("Dist") or any(words in text for words in _PEER_LOST)


@dataclass(frozen=True)
class RestartPolicy:
    """A run's ``--max-restarts`` and the folder it resumes from."""

    max_restarts: int
    checkpoint_dir: str | None
    checkpoint_path: str | None  # the file a restart resumes from

    @classmethod
    def of(cls, train: TrainSettings) -> RestartPolicy:
        return cls(train.max_restarts, train.checkpoint_dir, train.checkpoint_path)


@dataclass(frozen=True)
class FailureFacts:
    """What a supervisor knows of an attempt's first failure."""

    rank: int
    exit_code: int | None = None  # the process ended (< 0: a signal)
    error_type: str = ""  # the Python exception the rank reported ("": none)
    error_message: str = ""
    machine_stopping: bool = False  # SIGTERM from outside on this machine
    diagnosed: bool = False  # nbtrain found a program error (uneven collectives)
    lost: str = ""  # the rank's node is gone, in its supervisor's words ("node b (rank 1) lost: …")

    @property
    def raised(self) -> bool:
        return bool(self.error_type)

    @property
    def secondary(self) -> bool:
        return self.raised and peer_lost(self.error_type, self.error_message)


def first_failure(failures: list[FailureFacts]) -> FailureFacts:
    """The likely cause among an attempt's failures (in arrival order): a rank's own error or death before the
    communication errors it caused in the others."""
    return sorted(enumerate(failures), key=lambda item: (item[1].secondary, item[0]))[0][1]


def why_not_restart(first: FailureFacts, restarts: int, policy: RestartPolicy) -> str | None:
    """Why the attempt that failed with ``first`` after ``restarts`` restarts must not be started again; None: it
    is restarted."""
    if first.machine_stopping:  # said in full by the failure: what was saved, how to resume
        return "this machine is being stopped"
    if first.diagnosed:
        return "the ranks call different collectives, which a restart would repeat"
    if first.raised and not first.secondary:
        return (f"rank {first.rank} raised {first.error_type} in the cell, which a restart would raise again; "
                "restarts are for ranks that die")
    if restarts >= policy.max_restarts:
        return f"--max-restarts {policy.max_restarts} used up"
    if policy.checkpoint_path is None or not os.path.exists(policy.checkpoint_path):
        return (f"the cell cannot resume: {policy.checkpoint_dir} holds no checkpoint yet "
                "(nbtrain.save_checkpoint() had not run before the failure)")
    return None


def describe_checkpoint(path: str) -> str:
    """``path (epoch e, step s)``: where a restart resumes, read without loading the tensors (mmap)."""
    try:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors and plain values only
        return f"{path} ({checkpoint_position(state['epoch'], state['step'], state.get('logged_step'))})"
    except Exception:
        return path
