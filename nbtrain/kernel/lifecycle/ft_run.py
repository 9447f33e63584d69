"""``--ft`` in the kernel: the run's Lighthouse, and new ranks in the place of a replica group that loses one.

The ranks of a ``--ft`` run form torchft replica groups (:mod:`nbtrain.rank.train.ft_cell`): one per rank, or R
groups of N/R consecutive ranks (``--ft replicas=R``), each with a process group of its own. The kernel starts the
run's Lighthouse (:class:`~.lighthouse.Lighthouse`, on 127.0.0.1 only) and a fresh recovery secret, both sent to
the ranks inside the job over the authenticated channel. Then, while the cell runs:

* a rank that **exits** (killed, out of memory) is its group's loss, not the run's failure: the cell says so at
  once, the group's other ranks are ended (they could only wait for it in their group's collectives), the other
  groups keep stepping (their next quorum leaves the group out), and once every rank of the group has exited, new
  processes take their places — same ranks, same devices — which get the same job and copy a healthy peer's
  state at their first ``prepare()``. So does a rank whose group's collective failed because a member was lost
  (gloo's or NCCL's connection error), which may report before the lost rank's exit is seen;
* each group is replaced at most :data:`REPLACEMENTS` times; past that, or when no other group is left to copy
  from, the loss fails the run as it does without ``--ft``. Any other exception in the cell is the run's failure
  (it would happen again in the new ranks);
* the groups that start together take their first quorum together: a rank at its first ``prepare()`` waits for
  the kernel's go, given once every rank has come (a replacement's at once);
* when the others finish before a replacement has rejoined (copied a peer's state and committed a step with
  them), it is stopped, and the run ends without it;
* each group's state (:class:`~nbtrain.kernel.observers.events.GroupState`: in quorum, out, recovering from a
  peer, rejoined) is kept here alone and told to the run's observers at each change (the dashboard's badges);
* at the end the cell says what happened: groups lost and replaced, steps redone (counted, not assumed), and the
  steps taken with fewer groups — from the ``ft_groups`` series every rank logs at each committed step.
"""

from __future__ import annotations

import secrets
import signal
import time

from ...common.words import count, plural
from ...wire import protocol as P
from ..observers.events import GroupState, ReplicaGroupInfo, replica_group_name
from ..observers.history import History
from ..ranks.spec import PoolSpec
from .lighthouse import Lighthouse

REPLACEMENTS = 3  # per group: a group that keeps dying (a bug in the cell that kills a rank) ends the run
GROUPS_SERIES = "ft_groups"  # what each rank logs per committed step (nbtrain.rank.train.ft_cell)
BATCHES_SERIES = "ft_batches"  # --ft keep-batch: the micro-batches each committed step averaged
LOCAL = "127.0.0.1"
REJOIN_GRACE_S = 2.0  # the others finished: how long a replacement that has its job may still show it rejoined
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "gloo/transport", "remote process exited",
              "NCCL communicator was aborted")  # a group's collective that failed because a member is gone


class ReplicaWatch:
    """One ``--ft`` run's groups. ``run`` (given to the hooks) is the run's loop
    (:class:`~nbtrain.kernel.lifecycle.run._Run`): its ``say``, ``pool``, ``done`` and ``cell_running()``;
    ``tell(event, *args)`` notifies the run's observers."""

    def __init__(self, spec: PoolSpec, nprocs: int, tell=lambda event, *args: None,
                 send_to=lambda rank, message: None) -> None:
        self.nprocs, self.group_size = nprocs, spec.ft_group_size
        # on nodes: the Lighthouse on the rendezvous address, and each group's servers on its node's own ("")
        self.host = spec.nodes.rdzv_host if spec.nodes is not None else LOCAL
        self.lighthouse = Lighthouse(self.host, min_replicas=1)
        self.secret = secrets.token_bytes(32)
        self.replaced: dict[int, int] = {}  # group -> times it was replaced
        self.leaving: dict[int, set[int]] = {}  # group -> its ranks yet to exit, in a loss under way
        self.joining: set[int] = set()  # ranks started in place of lost ones, whose job is not sent yet
        self.lost: list[tuple[int, float]] = []  # (group, time.time()) of each loss
        self.abandoned: set[int] = set()  # replacements stopped: the others finished before they joined
        self.arrivals: set[int] = set()  # ranks at their first prepare(), waiting for the others that start with them
        self.started = False  # the groups that start together were told to take their first quorum
        self._tell, self._send_to = tell, send_to
        self.job_id = -1  # the cell's job (job_part)
        self._told_out: tuple[int, ...] = ()  # the groups out, as the ranks were last told (FtOut)
        self.states: dict[int, tuple[GroupState, float]] = {}  # group -> its state and since when (written by _enter)
        self.others_finished_at: float | None = None  # when all but the replacements had finished (time.monotonic)

    def job_part(self, job_id: int) -> P.FaultTolerance:
        self.job_id = job_id
        return P.FaultTolerance(self.lighthouse.address, self.secret, self.nprocs // self.group_size,
                                self.host if self.host == LOCAL else "", self.group_size)

    def _members(self, group: int) -> range:
        return range(group * self.group_size, (group + 1) * self.group_size)

    # ------------------------------------------------------------------------------------ the run's hooks
    def exited(self, run, rank: int, code: int) -> bool:
        """Rank ``rank`` exited: True when it is part of its group's loss (new ranks follow), False when the exit is
        the run's failure."""
        group = rank // self.group_size
        if group not in self.leaving and not self._lose(run, group, rank, _exit_words(code)):
            return False
        self._gone(run, group, rank)
        return True

    def failed(self, run, rank: int, error: P.RemoteError) -> bool:
        """Rank ``rank`` raised: True when that is its group's loss (a member gone under a collective, or a loss
        under way), False when it is the run's failure."""
        group = rank // self.group_size
        if group in self.leaving:
            return True  # it is being ended with its group
        said = " ".join((error.message, *error.chained))
        peer_lost = self.group_size > 1 and any(words in said for words in _PEER_LOST)
        return peer_lost and self._lose(run, group, rank, f"its {error.type_name} in a collective of its group")

    def arrived(self, rank: int) -> list[int]:
        """Rank ``rank`` reached its first ``prepare()``: the ranks to tell to take their first quorum now — every
        rank once all have come, then each replacement as it comes."""
        if self.started:
            return [rank]
        self.arrivals.add(rank)
        if len(self.arrivals) < self.nprocs:
            return []
        self.started = True
        self._enter(range(self.nprocs // self.group_size), GroupState.IN_QUORUM)
        return sorted(self.arrivals)

    def logged(self, rank: int, records: list) -> None:
        """What rank ``rank`` logged: a recovering group whose rank committed a step (its ``ft_groups``) rejoined."""
        group = rank // self.group_size
        if self.states.get(group, (None,))[0] is GroupState.RECOVERING and \
                any(GROUPS_SERIES in values for _, _, values in records):
            self._enter([group], GroupState.REJOINED)

    def joined(self, rank: int) -> bool:
        """A replacement said Ready: True the first time (the caller sends it the job)."""
        if rank in self.joining:
            self.joining.discard(rank)
            return True
        return False

    def too_late(self, finished: set[int], say, now: float | None = None) -> bool:
        """Whether every rank but the replacements that have not rejoined has finished the cell: those are abandoned
        (said once; True once, when it happens). One that has its job already gets :data:`REJOIN_GRACE_S` first:
        the step that says it rejoined may still be on its way. Past that it cannot rejoin: no group is left to
        copy the state from (the rank waits, rather than train alone from step 0: ``ft_cell``)."""
        recovering = {rank for group, (state, _) in self.states.items() if state is GroupState.RECOVERING
                      for rank in self._members(group)} - finished
        waiting = self.joining | recovering | {rank for ranks in self.leaving.values() for rank in ranks}
        now = time.monotonic() if now is None else now
        if not waiting or len(finished) + len(waiting) != self.nprocs:
            self.others_finished_at = None
            return False
        if self.others_finished_at is None:
            self.others_finished_at = now
        if recovering - self.joining and now - self.others_finished_at < REJOIN_GRACE_S:
            return False
        say(f"nbtrain: --ft: the other ranks finished the cell before the new {plural('rank', len(waiting))} "
            f"{', '.join(map(str, sorted(waiting)))} could copy their state; stopped.\n")
        self.abandoned |= waiting
        self._enter(sorted({rank // self.group_size for rank in waiting}), GroupState.OUT)
        self.joining.clear()
        return True

    # ------------------------------------------------------------------------------------------ a loss
    def _lose(self, run, group: int, rank: int, how: str) -> bool:
        """Group ``group`` lost rank ``rank`` (``how``): end its other ranks and note it, or False (the run fails)."""
        finished = set(run.done)
        others = {r // self.group_size for r in range(self.nprocs) if r not in finished} - {group} - set(self.leaving) \
            - {r // self.group_size for r in self.joining}
        name = replica_group_name(group, self._members(group))
        if not run.cell_running() or rank in finished:
            return False
        if self.replaced.get(group, 0) >= REPLACEMENTS or not others:
            why = (f"it was replaced {count('time', REPLACEMENTS)} already" if others else
                   "no other replica group is left to copy the state from")
            run.say(f"nbtrain: --ft: {name} was lost ({how} on rank {rank}); {why}, so the run fails.\n")
            self._enter([group], GroupState.OUT)
            return False
        self.replaced[group] = self.replaced.get(group, 0) + 1
        self.lost.append((group, time.time()))
        self.leaving[group] = set(self._members(group))
        self._enter([group], GroupState.OUT)
        who = f"a new rank {rank} starts" if self.group_size == 1 else "new ranks start in its place"
        run.say(f"nbtrain: --ft: {name} was lost ({how}{'' if self.group_size == 1 else f' on rank {rank}'}) at "
                f"{time.strftime('%H:%M:%S')}; {count('other replica group', len(others))} {'keeps' if len(others) == 1 else 'keep'} stepping, and {who} "
                f"and will copy a peer's state ({self.replaced[group]} of {REPLACEMENTS}).\n")
        for member in self._members(group):
            if member != rank:
                run.pool.kill_rank(member)  # it could only wait for the lost one in the group's collectives
        return True

    def _gone(self, run, group: int, rank: int) -> None:
        """One rank of a group being lost has exited; once all have, new ranks take their places."""
        self.leaving[group].discard(rank)
        if self.leaving[group]:
            return
        del self.leaving[group]
        for member in self._members(group):
            run.pool.replace_rank(member, attempt=self.replaced[group])
            self.joining.add(member)
        self._enter([group], GroupState.RECOVERING)

    def _enter(self, groups, state: GroupState) -> None:
        """The one place a group's state changes; the observers hear every group's."""
        now = time.time()
        for group in groups:
            self.states[group] = (state, now)
        self._tell("replica_groups", self.groups())
        out = tuple(sorted(group for group, (state, _) in self.states.items()
                           if state in (GroupState.OUT, GroupState.RECOVERING)))
        if out != self._told_out:  # each group's first rank: whether its group brings the names back
            self._told_out = out
            for rank in range(0, self.nprocs, self.group_size):
                self._send_to(rank, P.FtOut(self.job_id, out))

    def groups(self) -> tuple[ReplicaGroupInfo, ...]:
        return tuple(ReplicaGroupInfo(group, tuple(self._members(group)), state, since, self.replaced.get(group, 0))
                     for group, (state, since) in sorted(self.states.items()))

    def summary(self, history: History) -> str:
        """What ``--ft`` did in this run, counted from each rank's ``ft_groups`` series ("" when nothing was lost)."""
        if not self.lost:
            return ""
        lost_groups = {group for group, _ in self.lost}
        survivors = [r for r in history.ranks(GROUPS_SERIES) if r // self.group_size not in lost_groups] \
            if GROUPS_SERIES in history else []
        if not survivors:
            return f"nbtrain: --ft: {count('replica group', len(self.lost))} lost; no group logged its steps.\n"
        # a step is committed when any survivor logged it: one that copied a peer's step after a failed collective
        # (it healed) logged no commit for that step, and on a busy machine each survivor may lack a different one
        committed: dict[int, float] = {}
        redone = 0
        for rank in survivors:
            series = history.series(GROUPS_SERIES, rank)
            redone = max(redone, len(series.steps) - len(set(series.steps)))
            for step, value in zip(series.steps, series.values, strict=True):
                committed.setdefault(step, value)
        groups = self.nprocs // self.group_size
        fewer = sum(1 for value in committed.values() if value < groups)
        back = "" if self.abandoned else " and replaced"
        kept = " (accumulating to keep the global batch)" if fewer and BATCHES_SERIES in history else ""
        return (f"nbtrain: --ft: {count('replica group', len(self.lost))} lost{back}; {count('step', redone)} redone; "
                f"{count('step', fewer)} of {len(committed)} at fewer than {groups} groups{kept}.\n")

    def close(self) -> None:
        self.lighthouse.close()


def _exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
