"""``--ft`` in the kernel: the run's Lighthouse, and a new rank in the place of one that dies.

Each rank of a ``--ft`` run is a torchft replica group of its own (:mod:`nbtrain.rank.train.ft_cell`). The kernel
starts the run's Lighthouse (:class:`~nbtrain.kernel.lifecycle.lighthouse.Lighthouse`, on 127.0.0.1 only) and a fresh
recovery secret, both sent to the ranks inside the job over the authenticated channel. Then, while the cell runs:

* a rank that **exits** (killed, out of memory, its machine's share gone) is not the run's failure: the cell says
  so at once, the other groups keep stepping (their next quorum leaves it out), and a new process takes its place —
  same rank, same device — which gets the same job and copies a healthy peer's state at its first ``prepare()``.
  Each rank is replaced at most :data:`REPLACEMENTS` times; past that, or when no other group is left to copy
  from, the exit fails the run as it does without ``--ft``;
* an **exception** in the cell is still the run's failure (it would happen again in the replacement);
* when the others finish before a replacement has joined, it is stopped, and the run ends without it;
* at the end the cell says what happened: groups lost and replaced, steps redone (counted, not assumed), and the
  steps taken with fewer groups — from the ``ft_groups`` series every group logs at each committed step.
"""

from __future__ import annotations

import secrets
import time

from ...common.words import count
from ...wire import protocol as P
from .lighthouse import Lighthouse
from ..observers.history import History

REPLACEMENTS = 3  # per rank: a rank that keeps dying (a bug in the cell that kills it) ends the run
GROUPS_SERIES = "ft_groups"  # what each group logs per committed step (nbtrain.rank.train.ft_cell)
HOST = "127.0.0.1"


class ReplicaWatch:
    """One ``--ft`` run's groups. ``run`` is the run's loop (:class:`~nbtrain.kernel.lifecycle.run._Run`), asked
    through its methods (``say``, ``replace_rank``); :meth:`job` is what every rank gets."""

    def __init__(self, nprocs: int) -> None:
        self.nprocs = nprocs
        self.lighthouse = Lighthouse(HOST, min_replicas=1)
        self.secret = secrets.token_bytes(32)
        self.replaced: dict[int, int] = {}  # rank -> times it was replaced
        self.joining: set[int] = set()  # replacements started whose job is not sent yet or not begun
        self.lost: list[tuple[int, float]] = []  # (rank, time.time()) of each loss
        self.abandoned: set[int] = set()  # replacements stopped: the others finished before they joined

    def job_part(self) -> P.FaultTolerance:
        return P.FaultTolerance(self.lighthouse.address, self.secret, self.nprocs, HOST)

    def lose(self, rank: int, code: int, finished: set[int], say) -> bool:
        """Rank ``rank`` exited with ``code`` while the cell ran: True when a replacement is due (the caller starts
        it), False when the exit is the run's failure (``finished``: the ranks that have finished the cell)."""
        others = set(range(self.nprocs)) - {rank} - self.joining - finished
        if self.replaced.get(rank, 0) >= REPLACEMENTS or not others:
            why = (f"it was replaced {count('time', REPLACEMENTS)} already" if others else
                   "no other replica group is left to copy the state from")
            say(f"nbtrain: --ft: rank {rank} was lost ({_exit_words(code)}); {why}, so the run fails.\n")
            return False
        self.replaced[rank] = self.replaced.get(rank, 0) + 1
        self.joining.add(rank)
        self.lost.append((rank, time.time()))
        say(f"nbtrain: --ft: rank {rank} was lost ({_exit_words(code)}) at {time.strftime('%H:%M:%S')}; "
            f"{count('other replica group', len(others))} keep stepping, and a new rank {rank} starts and will copy a "
            f"peer's state ({self.replaced[rank]} of {REPLACEMENTS}).\n")
        return True

    def joined(self, rank: int) -> bool:
        """A replacement said Ready: True the first time (the caller sends it the job)."""
        if rank in self.joining:
            self.joining.discard(rank)
            return True
        return False

    def too_late(self, finished: set[int], say) -> bool:
        """Whether every rank but the replacements still joining has finished the cell: those are abandoned (said
        once; True once, when it happens)."""
        if not self.joining or len(finished) + len(self.joining) != self.nprocs:
            return False
        say(f"nbtrain: --ft: the other ranks finished the cell before the new rank "
            f"{', '.join(map(str, sorted(self.joining)))} joined; it is stopped.\n")
        self.abandoned |= self.joining
        self.joining.clear()
        return True

    def summary(self, history: History) -> str:
        """What ``--ft`` did in this run, counted from each group's ``ft_groups`` series ("" when nothing was lost)."""
        if not self.lost:
            return ""
        survivors = [r for r in history.ranks(GROUPS_SERIES) if r not in self.replaced] if GROUPS_SERIES in history else []
        if not survivors:
            return f"nbtrain: --ft: {count('replica group', len(self.lost))} lost; no group logged its steps.\n"
        series = history.series(GROUPS_SERIES, survivors[0])
        redone = len(series.steps) - len(set(series.steps))
        fewer = sum(1 for groups in series.values if groups < self.nprocs)
        back = "" if self.abandoned else " and replaced"
        return (f"nbtrain: --ft: {count('replica group', len(self.lost))} lost{back}; {count('step', redone)} redone; "
                f"{count('step', fewer)} of {len(series.steps)} at fewer than {self.nprocs} groups.\n")

    def close(self) -> None:
        self.lighthouse.close()


def _exit_words(code: int) -> str:
    import signal

    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
