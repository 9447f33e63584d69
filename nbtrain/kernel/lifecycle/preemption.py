"""A preemption notice in the kernel: every rank saves at its next step, then the noticed machine is let go.

Notices come as :class:`~nbtrain.wire.protocol.PreemptNotice` events of the pool: a node agent's SIGTERM or its
cloud's reclaim notice (:mod:`nbtrain.node.notices`, relayed by :class:`~nbtrain.kernel.cluster.group.NodePool`
with the node's name), or a rank that got SIGTERM from outside the pool (:mod:`nbtrain.rank.stop`). The
first of a run is said in the cell at once, with its time; then:

* **no ``--checkpoint``**: nothing can be saved — the line says so and how to set one; the run goes on until
  the machine goes (a lost node, as without a notice);
* **with ``--checkpoint``**: :class:`~nbtrain.wire.protocol.Preempt` goes to every rank, which save at their next
  optimizer-step boundary (:mod:`nbtrain.rank.train.preempt_checkpoint`): the kernel passes the first rank's proposed step to
  every rank and releases the proposer once each has heard it, so they agree over their authenticated channels
  (never through the unauthenticated store); rank 0 says when it is written
  (:class:`~nbtrain.wire.protocol.PreemptSaved`). Then on nodes every noticed node is let go (its agent leaves;
  its ranks become the run's failure, whose account names the notice and the checkpoint): with ``--max-restarts``
  the group re-forms without it (:mod:`.restarts`, elastic ``--nodes MIN:MAX`` or a replacement within
  ``--start-timeout``) and resumes from that checkpoint. On one machine the ranks are stopped and the cell ends
  saying why — the machine itself is going — with the checkpoint to resume from.

If no checkpoint is written within ``--preemption-grace`` (default 25 s; the cell has no prepared loader or
optimizer whose steps the ranks save at, or a step takes longer), the cell says so and lets the machine go
all the same: a restart resumes from the last checkpoint saved.
"""

from __future__ import annotations

import time

from ...wire import protocol as P
from ..request.config import LaunchConfig

_CLOUD_WORDS = {"AWS": "spot reclaim notice", "GCP": "preemption notice", "Azure": "eviction notice (Scheduled Events)"}


def _clock(unix: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix))


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 1 else f"{value:.1f} s"


def notice_text(notice: P.PreemptNotice, label: str) -> str:
    """``node b: spot reclaim notice at 12:03:41 (AWS, the machine goes at 12:05:41)``."""
    ends = f", the machine goes at {_clock(notice.ends_at)}" if notice.ends_at else ""
    if notice.source in _CLOUD_WORDS:
        return f"{label}: {_CLOUD_WORDS[notice.source]} at {_clock(notice.noticed_at)} ({notice.source}{ends})"
    if notice.node:
        return (f"{label}: SIGTERM at {_clock(notice.noticed_at)} (the machine is being stopped: a preemption, "
                f"Slurm, Kubernetes{ends})")
    return (f"{label} got SIGTERM from outside at {_clock(notice.noticed_at)} (the container or job is being "
            f"stopped{ends})")


class PreemptionWatch:
    """One run's notices (see the module docstring). ``run`` is the run's loop
    (:class:`~nbtrain.kernel.lifecycle.run._Run`), asked through its methods (``say``, ``tell_every_rank``,
    ``release_nodes``, ``fail_machine_stopping``); ``job_id`` and ``config`` are the cell's."""

    def __init__(self, run, job_id: int, config: LaunchConfig) -> None:
        self.run, self.job_id, self.config = run, job_id, config
        self.first: tuple[str, float] | None = None  # what the first notice said, and when it came (monotonic)
        self.nodes: list[str] = []  # the nodes noticed; they leave once the checkpoint is written
        self.local_rank: int | None = None  # one machine: the rank that got SIGTERM
        self.done = False
        self.target: int | None = None  # the step every rank saves at: the first proposal
        self.heard: set[int] = set()  # the ranks that know it

    def hear(self, rank: int, message) -> None:
        if isinstance(message, P.PreemptNotice):
            self._notice(rank, message)
        elif isinstance(message, P.PreemptPropose) and message.job_id == self.job_id:
            self._propose(message.step)
        elif isinstance(message, P.PreemptHeard) and message.job_id == self.job_id:
            self._heard(rank)
        elif isinstance(message, P.PreemptSaved) and message.job_id == self.job_id and self.first:
            elapsed = time.monotonic() - self.first[1]
            self._let_go(f"checkpoint at step {message.step} saved in {_seconds(message.seconds)} "
                         f"({_seconds(elapsed)} after the notice)", message.path)

    def _notice(self, rank: int, notice: P.PreemptNotice) -> None:
        if notice.node and notice.node not in self.nodes:
            self.nodes.append(notice.node)
        if self.first is not None or self.done:
            return  # the same event heard again (the agent and its ranks), or a second node: it leaves too
        label = f"node {notice.node}" if notice.node else f"rank {rank}"
        text = notice_text(notice, label)
        self.first = (text, time.monotonic())
        if not notice.node:
            self.local_rank = rank
        train = self.config.train
        if train.checkpoint_path is None:
            self.done = True  # nothing to wait for: the machine goes when it goes
            self._say(f"{text}; nothing can be saved: this cell has no --checkpoint. Run it with --checkpoint DIR "
                      "(and with --nodes MIN:MAX --max-restarts K, so the run goes on without the machine) to keep "
                      "its progress through a preemption.")
            return
        grace = self.config.preemption_grace_s
        self._say(f"{text}; saving a checkpoint at the next step (within {grace:.0f} s, --preemption-grace)")
        self.run.tell_every_rank(P.Preempt(self.job_id, grace))

    def _propose(self, step: int) -> None:
        """A rank's proposal: the first one is the step of every rank (later ones are the same notice, heard again)."""
        if self.target is None:
            self.target = step
            self.run.tell_every_rank(P.PreemptAt(self.job_id, step))

    def _heard(self, rank: int) -> None:
        self.heard.add(rank)
        if len(self.heard) == self.run.nprocs:
            self.run.tell_every_rank(P.PreemptAgreed(self.job_id))

    def tick(self, now: float) -> None:
        """Called by the run's loop: past the grace with no checkpoint, the machine is let go all the same."""
        if self.first is not None and not self.done and now - self.first[1] > self.config.preemption_grace_s:
            self._let_go(f"no checkpoint within {self.config.preemption_grace_s:.0f} s (--preemption-grace): "
                         "the ranks reached no step of a prepared DataLoader or optimizer", None)

    def finished(self) -> None:
        """The cell ended before the ranks' next step: nothing to save; noticed nodes leave all the same."""
        if self.first is None or self.done:
            return
        self.done = True
        if not self.nodes:  # notices from ranks on this machine name no node
            return self._say(f"{self.first[0]}; the cell ended before its next step")
        self._say(f"{self.first[0]}; the cell ended before its next step; {self._leaving()}")
        self.run.release_nodes(self.nodes, self.first[0], cell_ended=True)

    def _let_go(self, saved: str, path: str | None) -> None:
        assert self.first is not None
        self.done = True
        account = f"{self.first[0]}; {saved}"
        if self.nodes:  # noticed nodes leave; the group re-forms without them
            account += self._resume_note(path)
            self._say(f"{account}; {self._leaving()}")
            return self.run.release_nodes(self.nodes, account)
        rank = self.local_rank if self.local_rank is not None else 0
        resume = f"; run the cell again to resume from {path}" if path else ""
        self.run.fail_machine_stopping(rank, f"{account}; the ranks were stopped{resume}")

    def _resume_note(self, path: str | None) -> str:
        """Where no restart follows (no ``--max-restarts``, or none left): how to go on from the checkpoint."""
        train = self.config.train
        return f"; run the cell again to resume from {path}" if path and train.restart >= train.max_restarts else ""

    def _leaving(self) -> str:
        many = len(self.nodes) > 1
        return f"{'nodes' if many else 'node'} {', '.join(self.nodes)} {'leave' if many else 'leaves'}"

    def _say(self, text: str) -> None:
        self.run.say(f"nbtrain: {text}\n")
