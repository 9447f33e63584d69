"""``--max-restarts K`` (kernel side): when a rank dies, start the ranks again from the last checkpoint, up to K times.

A run with ``--checkpoint DIR --max-restarts K`` whose rank dies — killed by a signal (the
out-of-memory killer, a preempted machine), or exited without a Python exception — is started again
on fresh ranks; the cell resumes from ``DIR/checkpoint.pt`` as any cell does (automatically, see
:mod:`nbtrain.rank.train.checkpoint`), so it goes on from the last ``nbtrain.save_checkpoint()``. Each
restart is announced in the cell's output with what happened and where the run resumes.

It does not restart when:

* a rank raised a Python exception in the cell: the same code would raise it again (fix the cell);
* the ranks called different collectives (:mod:`nbtrain.kernel.diagnostics.mismatch`): a program error too;
* DIR holds no checkpoint yet: there is nothing to resume from, and the message says so;
* the machine itself is being stopped (SIGTERM from outside on one machine: :mod:`.preemption`);
* K restarts were used;
* the ranks did not start within ``--start-timeout`` (a restart after a lost node waits that long for a
  replacement node, and says so at once: how many nodes joined, the command that joins one, the time left;
  then "no replacement node joined within 90 s").

Then the last failure is raised as usual. ``history`` holds the whole curve: each attempt resumes
with the series saved in the checkpoint (:mod:`nbtrain.rank.train.checkpoint`) and continues it. Restarts
resume even when the cell was run with ``--no-resume``.

A detached run (``--detach``) is restarted by its agent, not the kernel (:mod:`nbtrain.node.detached_restarts`):
a kernel that follows it gets the agent's decision from the run's record (``decide``) and follows the next attempt
there, so its cell shows the same lines as a restart of its own.

The attempts are one run to the people watching it: the ranks see ``TORCHELASTIC_RESTART_COUNT`` (the
attempt's number, as torchrun's agent sets it); the summary's time covers every attempt; and the
observers (dashboard, run registry) hear of one ending only — an attempt that is restarted does not leave
a "failed" paragraph in a cell that ends well (:class:`_OneEnding`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from ...wire.restart_policy import FailureFacts, RestartPolicy, describe_checkpoint, why_not_restart
from ...wire.settings import TrainSettings
from ...common.words import count
from ..diagnostics.failures import RankFailedError
from ..observers.events import FanOut


class _Outcome(Protocol):
    def finished_after(self, seconds: float, note: str) -> Any: ...  # the same type, again


_R = TypeVar("_R", bound=_Outcome)


Decide = Callable[[RankFailedError, int], "tuple[str | None, str]"]  # (why not restart, what a restart resumes from)


def run_with_restarts(attempt: Callable[[int, list], _R], settings: TrainSettings,
                      write: Callable[[str, str], None], observers=(), decide: Decide | None = None) -> _R:
    """Call ``attempt(restart_number, observers)`` until it succeeds or must not be repeated; re-raise the
    last failure. ``decide(error, restarts)`` says why not to restart (None: restart) and what the restart resumes
    from; by default this kernel decides (:func:`~nbtrain.wire.restart_policy.why_not_restart`), a detached run's is
    its agent's to make."""
    decide = decide or (lambda error, restarts: _kernel_decides(error, settings, restarts))
    started = time.monotonic()
    ending = _OneEnding(observers)
    restarts = 0
    try:
        while True:
            try:
                result = attempt(restarts, [ending])
            except RankFailedError as error:
                reason, resumes = (_NEVER_STARTED, "") if _never_started(error) else decide(error, restarts)
                if reason == _NEVER_STARTED:  # the error says all: nothing died, nothing to restart
                    raise
                said = _unless_said(error)
                if reason is not None:
                    write("stderr", f"nbtrain: {said}not restarting: {reason}.\n")
                    raise
                ending.forget()
                restarts += 1
                write("stderr", f"nbtrain: {said}restarting the ranks from "
                                f"{resumes} (restart {restarts} of {settings.max_restarts}).\n")
                continue
            if restarts:
                result = result.finished_after(time.monotonic() - started,
                                               f"finished after {count('restart', restarts)} from the checkpoint")
            return result
    finally:
        ending.announce()


class _OneEnding(FanOut):
    """Passes every event on to ``followers`` but holds an attempt's ending until it is known to be the last."""

    def __init__(self, followers) -> None:
        super().__init__(followers)
        self._ending: tuple[str, str] | None = None
        self._started = 0.0  # when the first attempt's cell began: every attempt's start says so

    def run_started(self, info) -> None:
        self._started = self._started or info.started
        self.notify("run_started", replace(info, started=self._started))

    def ranks_ready(self, info) -> None:
        self.notify("ranks_ready", replace(info, started=self._started or info.started))

    def run_finished(self, status: str, summary: str) -> None:
        self._ending = (status, summary)

    def forget(self) -> None:
        """The attempt is restarted: its ending was not the run's."""
        self._ending = None

    def announce(self) -> None:
        if self._ending is not None:
            ending, self._ending = self._ending, None
            self.notify("run_finished", *ending)


_NEVER_STARTED = "the ranks did not start"


def _never_started(error: RankFailedError) -> bool:
    first = error.failures[0]
    return first.error is None and first.exit_code is None  # --start-timeout: no rank died (no node came, say)


def _kernel_decides(error: RankFailedError, settings: TrainSettings, restarts: int) -> tuple[str | None, str]:
    reason = _why_not_restart(error, settings, restarts)
    return reason, "" if reason else describe_checkpoint(settings.checkpoint_path or "")


def _why_not_restart(error: RankFailedError, settings: TrainSettings, restarts: int) -> str | None:
    first = error.failures[0]
    facts = FailureFacts(first.rank, first.exit_code, first.error.type_name if first.error else "",
                         first.error.message if first.error else "", first.machine_stopping, first.diagnosis is not None)
    return why_not_restart(facts, restarts, RestartPolicy.of(settings))


def _unless_said(error: RankFailedError) -> str:
    """The failure, to open the line that says what happens next — unless the pool said it when it happened
    (a lost node: :class:`~nbtrain.kernel.cluster.group.NodePool` says so at once, before it stops the other ranks)."""
    first = error.failures[0]
    return "" if first.account is not None and first.error is None else f"{first.summary()}; "
