"""A detached run's ``--max-restarts``, carried out by its agent: the run goes on from its checkpoint with no kernel.

The agent of a detached run supervises its ranks (:mod:`.detached`), so restarting them is the agent's, whether a
kernel watches or not. When an attempt has failed — its ranks ended, and the kernel, if one was connected, has said
Bye — :func:`see_through` asks :func:`~nbtrain.wire.restart_policy.why_not_restart`, the rule the kernel follows
for the runs it supervises: a rank that died is restarted from the checkpoint, one that raised in the cell is not,
nor a run whose restarts are used up or whose checkpoint folder is still empty. The decision goes into the run's
record (:meth:`~nbtrain.wire.runfolder.RunFolder.restart`), where a kernel that follows the run reads it
(:func:`~nbtrain.wire.runfolder.restart_decision`) and then follows the next attempt.

A restart starts torch elastic's agent again for the same ranks, with a c10d store of the attempt's own (torch
elastic keys the ranks' process group by its agent's restart count, which a new agent starts at 0 again), with ``NBTRAIN_ATTEMPT`` telling the ranks which attempt they are,
and delivers the cell the kernel delivered at the start: the ranks resume from the checkpoint as after a restart the
kernel makes (``TORCHELASTIC_RESTART_COUNT`` is the attempt's number).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace

from ..wire import nodes as N
from ..wire.restart_policy import ATTEMPT_ENV, describe_checkpoint, first_failure, why_not_restart
from .console import say
from .detached import SHUTDOWN_WAIT_S, DetachedRecorder, Ranks, end_undelivered, run_alone


def see_through(ranks: Ranks, recorder: DetachedRecorder, start_ranks: Callable[[N.StartRanks], None],
                why: str) -> str:
    """The kernel's part has ended (``why``): see the run to its end, restarting it as ``--max-restarts`` says;
    ``start_ranks`` starts torch elastic's agent for a :class:`~nbtrain.wire.nodes.StartRanks`. Returns why the
    agent leaves."""
    if recorder.under_way(ranks):
        say(why)
        if recorder.delivery is None:
            return end_undelivered(ranks, recorder)
        say("the kernel left: the detached run goes on; its record is in " + recorder.folder.path)
        why = run_alone(ranks, recorder)
    while (attempt := next_attempt(ranks, recorder)) is not None:
        _start_again(ranks, recorder, start_ranks, attempt)
        why = run_alone(ranks, recorder)
    return why


def next_attempt(ranks: Ranks, recorder: DetachedRecorder) -> int | None:
    """Once the attempt's ranks have ended: the number of the attempt to start (its decision recorded), or None
    when the run ends here."""
    policy = recorder.start.restarts
    if policy is None or not policy.max_restarts or recorder.stopped or recorder.finished():
        return None
    if not (recorder.ranks_started and recorder.failures):
        return None  # never started (said by the attempt's NodeError), or ended with no failure seen
    ranks.idle.wait(SHUTDOWN_WAIT_S)  # the attempt's last rank has ended before the next one starts
    reason = why_not_restart(first_failure(recorder.failures), recorder.attempt, policy)
    attempt = 0 if reason else recorder.attempt + 1
    resumes = "" if reason else describe_checkpoint(policy.checkpoint_path or "")
    recorder.decided(attempt, reason or "", resumes)
    if reason:
        say(f"not restarting the detached run: {reason}")
        return None
    say(f"{_what_happened(recorder)}: restarting the ranks from {resumes} (restart {attempt} of {policy.max_restarts})")
    return attempt


def _start_again(ranks: Ranks, recorder: DetachedRecorder, start_ranks: Callable[[N.StartRanks], None],
                 attempt: int) -> None:
    recorder.begin_attempt(attempt)
    start = recorder.start
    start_ranks(replace(start, run_id=f"{start.run_id}-attempt{attempt}", env=(*start.env, (ATTEMPT_ENV, str(attempt)))))
    if recorder.delivery is not None:
        ranks.deliver(recorder.delivery)  # kept for the ranks that connect (LocalRanks sends it as each says Hello)


def _what_happened(recorder: DetachedRecorder) -> str:
    first = first_failure(recorder.failures)
    if first.lost:  # a node of the run's (node.relay): gone with its machine, not killed on it
        return first.lost
    if first.raised:
        return f"rank {first.rank} raised {first.error_type} (another rank had gone)"
    code = first.exit_code if first.exit_code is not None else 0
    if code < 0:
        return f"rank {first.rank} was killed by {signal.Signals(-code).name}"  # as the kernel says it
    return f"rank {first.rank} exited with code {code}"
